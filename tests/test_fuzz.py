"""Property-based fuzzing of whole runs: random small configs in every mode and policy.

Every run has ``engine.check: true``, so each step's invariants (sim/observe/invariants.py) are
verified; a run must end without exception, the same seed must give identical results,
and where physics says so the results are monotone.

Budget: ``KVSIM_FUZZ_EXAMPLES`` examples per test (default: a small CI budget, derandomised
so that CI is repeatable); set it (e.g. ``KVSIM_FUZZ_EXAMPLES=1000``) to search longer with
fresh random examples.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from experiments.sweep import check_fits
from policies import AccessTrace, prefetch_names
from sim.config import build_config
from sim.errors import ConfigError
from sim.replay import replay_table
from sim.run import simulate

LONG = "KVSIM_FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("KVSIM_FUZZ_EXAMPLES", "0")) or None


def budget(ci_examples: int) -> settings:
    """Hypothesis settings: ``ci_examples`` in CI, ``$KVSIM_FUZZ_EXAMPLES`` when set."""
    return settings(
        max_examples=EXAMPLES or ci_examples,
        deadline=None,
        derandomize=not LONG,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


MODES = ("hbm", "offload", "dram_centric")
# every online eviction policy the engine accepts
EVICTIONS = (
    "fifo", "lru", "lfu", "arc", "s3fifo", "sieve", "gds", "heat", "length_aware",
    "scheduler_aware",
)  # fmt: skip
SMALL_MODEL = {
    "name": "fuzz-tiny",
    "layers": 4,
    "hidden": 512,
    "heads": 8,
    "kv_heads": 2,
    "head_dim": 64,
    "intermediate": 1024,
    "vocab": 1000,
}


@st.composite
def lengths(draw: st.DrawFn, low: int, high: int) -> Any:
    """A token-length distribution: a fixed count or a uniform range (long ones first)."""
    a = draw(st.sampled_from([high, high // 2, high // 8, low]) | st.integers(low, high))
    if draw(st.booleans()):
        return a
    return {"kind": "uniform", "min": a, "max": draw(st.integers(a, high))}


@st.composite
def workloads(draw: st.DrawFn, closed: bool = False) -> dict[str, Any]:
    """A small synthetic or multi-turn workload (with prefix hashes, so caches matter)."""
    arrival = (
        {"kind": "all_at_once"}
        if closed or draw(st.booleans())
        else {"kind": "poisson", "rate": draw(st.sampled_from([5.0, 50.0, 500.0]))}
    )
    if not closed and draw(st.booleans()):
        return {
            "kind": "multi_turn",
            "num_sessions": draw(st.sampled_from([4, 2, 1])),
            "session_arrival": arrival,
            "turns": draw(st.integers(1, 3)),
            "think_time": draw(st.sampled_from([0.0, 0.01, 0.5])),
            "user_tokens": draw(lengths(8, 200)),
            "output_tokens": draw(lengths(1, 24)),
            "system_prompt_tokens": draw(st.sampled_from([0, 64, 300])),
        }
    return {
        "kind": "synthetic",
        "num_requests": draw(st.sampled_from([16, 8, 3, 1])),
        "arrival": arrival,
        "prompt_tokens": draw(lengths(1, 400)),
        "output_tokens": draw(lengths(1, 48)),
        "shared_prefix_tokens": draw(st.sampled_from([0, 32, 256])),
    }


@st.composite
def clients(draw: st.DrawFn) -> dict[str, Any]:
    """Open loop, or a closed-loop client of a few slots."""
    slots = draw(st.sampled_from([None, None, 1, 3]))
    return {} if slots is None else {"max_concurrency": slots}


@st.composite
def accesses(draw: st.DrawFn) -> Any:
    """Full attention, or a sparse hot set."""
    if draw(st.booleans()):
        return "full"
    return {
        "kind": "sparse",
        "sink_blocks": draw(st.integers(0, 2)),
        "window_blocks": draw(st.integers(0, 4)),
        "topk_blocks": draw(st.integers(0, 4)),
    }


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """A small run config mapping: tiny pools so that eviction, swap and SSD all happen.

    Every mode, access kind, eviction and prefetch policy, preemption mode, write policy;
    compressed lower tiers; direct reads over a coherent link (gh200).
    """
    mode = draw(st.sampled_from(MODES))
    block = draw(st.sampled_from([8, 16, 32]))
    kv: dict[str, Any] = {
        "mode": mode,
        "access": draw(accesses()),
        "eviction": draw(st.sampled_from(EVICTIONS)),
        "prefix_caching": draw(st.booleans()),
        "layerwise": draw(st.booleans()),
        "write_policy": draw(st.sampled_from(["write_through", "write_back"])),
        "dram_capacity": draw(st.sampled_from([None, "1MiB", "4MiB", "64MiB"])),
        "ssd_capacity": draw(st.sampled_from([None, 0, "2MiB", "16MiB"])),
    }
    profile = draw(st.sampled_from(["h100-sxm", "gh200"]))
    # NOTE: HBM of a few tens of MiB beside the 19 MiB tiny model: pools of 30-600 blocks
    hbm = {"capacity": draw(st.sampled_from(["24MiB", "28MiB", "32MiB", "40MiB", "80GiB"])),
           "runtime_reserve": 0, "driver_reserve": 0}  # fmt: skip
    hardware = {"profile": profile, "hbm": hbm}
    kv["direct_read"] = mode == "dram_centric" and profile == "gh200" and draw(st.booleans())
    kv["dram_dtype"] = draw(st.sampled_from([None, "fp8"]))  # compressed lower tiers
    kv["prefetch"] = draw(st.sampled_from(prefetch_names()))
    if mode != "hbm":  # a load from a lower tier: aside (vLLM's connector) or in the step
        kv["prefix_loads"] = draw(st.sampled_from(["async", "in_step"]))
    if mode == "offload" and kv["prefix_caching"] and kv["write_policy"] == "write_through":
        kv["hbm_prefix_caching"] = draw(st.booleans())  # the engine's own cache off or on
    kv = {k: v for k, v in kv.items() if v is not None}
    engine = {
        "max_num_seqs": draw(st.sampled_from([16, 8, 2, 1])),
        "max_batched_tokens": draw(st.sampled_from([256, 512, 64, 2048])),
        "chunked_prefill": draw(st.booleans()),
        "block_tokens": block,
        "preemption": draw(st.sampled_from(["recompute", "swap"])),
        "kv_pool_blocks": draw(st.sampled_from([None, 64, None, 24])),
        "layer_events": draw(st.booleans()),
        "max_model_len": draw(st.sampled_from([None, None, None, 256])),
        "gpu_memory_utilization": 1.0,
        "check": True,
    }
    return {
        "seed": draw(st.integers(0, 2**16)),
        "model": SMALL_MODEL,
        "hardware": hardware,
        "workload": {**draw(workloads()), **draw(clients())},
        "engine": {k: v for k, v in engine.items() if v is not None},
        "kv": kv,
    }


def run(data: dict[str, Any]):
    """Build and simulate a config; configs the loader or start-up refuse are not examples."""
    try:
        config = build_config(copy.deepcopy(data), "<fuzz>")
        check_fits(config)  # the model leaves HBM for KV (else start-up refuses it)
    except ConfigError:
        assume(False)
    return simulate(config)


def stressed(mode: str, **engine: Any) -> dict[str, Any]:
    """16 long requests at once on 24 MiB of HBM: eviction, fetches, preemption all happen."""
    return {
        "seed": 0,
        "model": SMALL_MODEL,
        "hardware": {"profile": "h100-sxm", "hbm": {"capacity": "24MiB", "runtime_reserve": 0,
                                                          "driver_reserve": 0}},
        "workload": {"kind": "synthetic", "num_requests": 16, "arrival": {"kind": "all_at_once"},
                     "prompt_tokens": 400, "output_tokens": 32, "shared_prefix_tokens": 256},
        "engine": {"max_num_seqs": 16, "max_batched_tokens": 256, "gpu_memory_utilization": 1.0,
                   "check": True, **engine},
        "kv": {"mode": mode, "dram_capacity": "64MiB"},
    }  # fmt: skip


def shared_swap() -> dict[str, Any]:
    """16 requests sharing a 4-block prefix, swapped out of a 64-block pool."""
    data = stressed("hbm", preemption="swap", chunked_prefill=False, block_tokens=8,
                    kv_pool_blocks=64)  # fmt: skip
    data["workload"].update(prompt_tokens=50, output_tokens=48, shared_prefix_tokens=32)
    data["kv"] = {"mode": "hbm", "prefix_caching": True}
    return data


def shared_swap_multi_turn() -> dict[str, Any]:
    """4 sessions sharing a 10-block system prompt, swapped out of a 24-block pool."""
    data = stressed("hbm", preemption="swap", block_tokens=32, kv_pool_blocks=24)
    data["workload"] = {
        "kind": "multi_turn", "num_sessions": 4, "session_arrival": {"kind": "all_at_once"},
        "turns": 1, "think_time": 0.0, "user_tokens": 200, "output_tokens": 24,
        "system_prompt_tokens": 300,
    }  # fmt: skip
    data["kv"] = {"mode": "hbm", "prefix_caching": True}
    return data


@budget(ci_examples=100)
@given(configs())
# found by this test: staging buffers larger than the HBM left put HBM above capacity
@example(stressed("dram_centric", max_batched_tokens=512))
@example(stressed("hbm", preemption="swap"))
@example(stressed("offload", preemption="recompute"))
# found by this test: swapping out a request took the prefix it shared out of HBM
@example(shared_swap())
# and a shared system prompt kept in HBM for swapped-out requests alone filled the pool
@example(shared_swap_multi_turn())
def test_random_runs_keep_every_invariant(data):
    result = run(data)  # engine.check: a broken invariant raises
    requests = result.requests
    assert set(requests.status) <= {"finished", "rejected"}
    finished = requests[requests.status == "finished"]
    assert (finished.first_token_s >= finished.arrival_s).all()
    assert (finished.finish_s >= finished.first_token_s).all()
    assert (requests[requests.status == "rejected"].reject_reason != "").all()


@budget(ci_examples=25)
@given(configs())
def test_same_seed_same_results(data):
    first, second = run(data), run(data)
    pd.testing.assert_frame_equal(first.requests, second.requests)
    pd.testing.assert_frame_equal(first.timeline, second.timeline)
    first.summary.pop("wall_time_s"), second.summary.pop("wall_time_s")
    assert json.dumps(first.summary, sort_keys=True) == json.dumps(second.summary, sort_keys=True)


@budget(ci_examples=80)
@given(
    st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=12), min_size=1, max_size=30),
    st.integers(1, 30),
    st.integers(1, 10),
)
def test_more_capacity_never_lowers_lru_hit_rate(requests, capacity, more):
    trace = AccessTrace.from_requests(requests)
    for fast in (True, False):
        rows = replay_table(trace, {"lru": "lru"}, [capacity, capacity + more], jobs=1,
                            fast=fast, progress=False)  # fmt: skip
        small, large = sorted(rows, key=lambda r: r.capacity_blocks)
        assert large.hits >= small.hits


@budget(ci_examples=20)
@given(workloads(closed=True), accesses(), st.integers(0, 2**16), st.sampled_from([2.0, 10.0]))
def test_more_link_bandwidth_never_raises_stall(workload, access, seed, factor):
    """A closed batch in dram_centric (write-through, LRU): the schedule does not depend on
    time, so the steps are the same and only their transfers get faster."""
    data = {
        "seed": seed,
        "model": SMALL_MODEL,
        "hardware": {"profile": "h100-sxm", "link": {"h2d": "8GB/s", "d2h": "8GB/s"}},
        "workload": workload,
        "engine": {"max_num_seqs": 4, "max_batched_tokens": 256, "check": True},
        "kv": {"mode": "dram_centric", "access": access, "eviction": "lru"},
    }
    slow = run(data)
    fast_link = f"{8 * factor}GB/s"
    data["hardware"]["link"] = {"h2d": fast_link, "d2h": fast_link}
    fast = run(data)
    same = ["batch_size", "step_tokens", "h2d_bytes", "hbm_kv_bytes"]
    pd.testing.assert_frame_equal(slow.timeline[same], fast.timeline[same])  # same schedule
    assert fast.summary["stall_s"] <= slow.summary["stall_s"] * (1 + 1e-9) + 1e-12
    assert np.all(fast.timeline.stall_s.to_numpy() <= slow.timeline.stall_s.to_numpy() + 1e-12)
