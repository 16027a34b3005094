"""A prefix load from DRAM overlaps the other requests' steps (as vLLM's offloading connector
does), and costs the loading request its load time: a hand-computed case; with
``kv.prefix_loads: in_step`` (LMCache's connector) it holds up the step instead."""

import numpy as np
import pytest

from sim.errors import ConfigError
from sim.run import simulate
from sim.workload.requests import Requests
from tests.conftest import make_config

BT = 16
DOC = 400  # blocks of the document r3 asks about again (6400 tokens, 800 MiB of Llama-3-8B KV)
ARRIVE = 1.0  # r3's arrival: r0 and r1 are done, r2 decodes


def doc(d: int, blocks: int) -> np.ndarray:
    """Prefix hashes of document ``d``'s first ``blocks`` blocks."""
    return np.arange(blocks, dtype=np.uint64) + np.uint64(1 + d * 100_003)


def case(with_r3: bool) -> Requests:
    """r0 reads doc A, r1 doc B (which pushes A's blocks out of an 600-block HBM pool to
    DRAM, where write-through put them); r2 decodes 400 tokens; r3 asks about doc A again."""
    n = 4 if with_r3 else 3
    prompts = [DOC * BT + 1, DOC * BT + 1, BT + 1, DOC * BT + 1][:n]
    hashes = [doc(0, DOC), doc(1, DOC), doc(2, 1), doc(0, DOC)][:n]
    return Requests(
        arrival_s=np.array([0.0, 0.001, 0.002, ARRIVE][:n]),
        prompt_tokens=np.array(prompts),
        output_tokens=np.array([2, 2, 400, 2][:n]),
        prefix_hashes=hashes,
    )


def test_a_dram_hit_loads_while_another_request_decodes_and_costs_its_load_time():
    config = make_config("engine.kv_pool_blocks=600", kv={"mode": "offload"})
    run, alone = simulate(config, case(True)), simulate(config, case(False))
    block = config.tier_block_bytes("dram")
    loaded = run.summary["h2d_bytes"] / block  # only r3's load crosses H2D in offload mode
    assert loaded == int(loaded) and loaded > 100
    # by hand: h100-sxm's link, Llama-3-8B's 32 KiB (layer, block, K|V) chunks
    chunk = BT * 8 * 128 * 2
    efficiency = (1 + (30.4 * 1024 / chunk) ** 2.271) ** (-1 / 2.271)
    assert efficiency == pytest.approx(0.7556, abs=1e-3)
    load_s = 100e-6 + 5e-6 + loaded * block / (55e9 * efficiency)
    tl = run.timeline
    starts = tl.time_s.to_numpy()
    s1 = starts[starts >= ARRIVE].min()  # r3 is admitted into loading at the next step
    done = s1 + load_s
    s2 = starts[starts >= done].min()  # ... and joins the first step after its load
    during = tl[(tl.time_s >= s1) & (tl.time_s < s2)]
    # the engine kept stepping r2 alone while r3 loaded ...
    assert len(during) >= 2 and (during.batch_size == 1).all()
    # ... at the same step times as without r3: its decode reads HBM and writes through
    # over D2H, the load uses H2D: no link is shared, so no contention to add
    ref = alone.timeline.set_index("time_s").step_s
    np.testing.assert_allclose(during.step_s, ref.loc[during.time_s].to_numpy(), rtol=1e-12)
    # r3's first token: queueing to s1, its load, the wait for the step in flight, then one
    # step computing its uncached token beside r2's decode (no stall: its KV is home)
    joined = tl[tl.time_s == s2].iloc[0]
    assert joined.batch_size == 2 and joined.stall_s == 0
    ttft = s2 + joined.step_s - ARRIVE
    assert run.requests.ttft_s[3] == pytest.approx(ttft, rel=1e-12)
    assert ttft > s1 - ARRIVE + load_s  # the hit was not free


def test_neutral_link_keys_load_at_the_links_peak():
    """Whole-block chunks, no chunk cost and no load overhead: r3's load takes one latency
    plus its bytes at 55 GB/s, and it joins the first step after that."""
    config = make_config(
        "engine.kv_pool_blocks=600", "hardware.link.copy_layout=block",
        "hardware.link.half_efficiency_bytes=0", "hardware.link.load_overhead=0",
        kv={"mode": "offload"},
    )  # fmt: skip
    run = simulate(config, case(True))
    loaded_bytes = run.summary["h2d_bytes"]
    starts = run.timeline.time_s.to_numpy()
    s1 = starts[starts >= ARRIVE].min()
    s2 = starts[starts >= s1 + 5e-6 + loaded_bytes / 55e9].min()
    joined = run.timeline[run.timeline.time_s == s2].iloc[0]
    assert run.requests.ttft_s[3] == pytest.approx(s2 + joined.step_s - ARRIVE, rel=1e-12)


def test_a_kernel_copier_loads_at_its_own_bandwidth_whatever_the_chunks():
    """hardware.link.h2d_copier: sm (a kernel reading pinned host memory, as LMCache loads),
    in_step: the step that schedules r3 stalls for exactly its load, one latency plus its
    bytes at h100-sxm's sm_h2d, 37.8 GB/s (nvbandwidth's host_to_device_memcpy_sm on Hopper),
    although the copy layout cuts them into 32 KiB (layer, block, K|V) chunks, which would
    cost the copy engines a quarter of their 55 GB/s."""
    config = make_config(
        "engine.kv_pool_blocks=600", "hardware.link.h2d_copier=sm",
        "hardware.link.load_overhead=0", "hardware.link.copy_layout=layer_kv",
        kv={"mode": "offload", "prefix_loads": "in_step"},
    )  # fmt: skip
    assert config.copy_chunk_bytes() == 16 * 8 * 128 * 2
    run = simulate(config, case(True))
    tl = run.timeline
    step = tl[tl.time_s == tl.time_s[tl.time_s >= ARRIVE].min()].iloc[0]
    assert step.stall_s == pytest.approx(5e-6 + run.summary["h2d_bytes"] / 37.8e9, rel=1e-9)


def test_an_in_step_load_holds_up_the_step_that_schedules_it():
    """kv.prefix_loads: in_step (LMCache's synchronous connector): r3 is scheduled at the first
    step after it arrives, beside r2's decode, and that step first waits out r3's whole load
    (the neutral link keys: one latency plus the bytes at 55 GB/s), then computes both."""
    config = make_config(
        "engine.kv_pool_blocks=600", "hardware.link.copy_layout=block",
        "hardware.link.half_efficiency_bytes=0", "hardware.link.load_overhead=0",
        kv={"mode": "offload", "prefix_loads": "in_step"},
    )  # fmt: skip
    run, alone = simulate(config, case(True)), simulate(config, case(False))
    load_s = 5e-6 + run.summary["h2d_bytes"] / 55e9
    tl = run.timeline
    s1 = tl.time_s[tl.time_s >= ARRIVE].min()
    step = tl[tl.time_s == s1].iloc[0]
    assert step.batch_size == 2  # r3 is in the batch at once, not loading aside
    # the step is the load, then the compute of r3's uncached token beside r2's decode
    compute = step.step_s - step.stall_s
    assert step.stall_s == pytest.approx(load_s, rel=1e-9)
    assert run.requests.ttft_s[3] == pytest.approx(s1 + load_s + compute - ARRIVE, rel=1e-9)
    # and r2, decoding, waited for it: it finishes about a load later than without r3
    delay = run.requests.finish_s[2] - alone.requests.finish_s[2]
    assert load_s <= delay < load_s + 3 * compute


def test_in_step_loads_are_refused_where_no_prefix_lives_below_hbm():
    with pytest.raises(ConfigError, match="prefix_loads"):
        make_config(kv={"mode": "hbm", "prefix_loads": "in_step"})
