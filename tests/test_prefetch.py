"""Prefetch policies: config, a hand-computed queue-lookahead case, invariants, wins and no-ops."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.base import PrefetchView, non_negative, param_table
from policies.prefetch import HeatPredictive, NextTurn, QueueLookahead
from policies.registry import make_prefetch
from sim.config.errors import ConfigError
from sim.run import simulate
from sim.workload.requests import Requests
from tests.conftest import hbm_parts, make_config
from tests.test_tiering import CheckedEngine, shared_documents

BT = 16


def doc(d: int, blocks: int) -> np.ndarray:
    """Prefix hashes of document ``d``'s first ``blocks`` blocks."""
    return np.arange(blocks, dtype=np.uint64) + np.uint64(1 + d * 100_003)


def evicted_prefix_case() -> Requests:
    """r0 reads doc A (48 blocks), r1 doc B; r2, a short prompt with a long answer, keeps the
    engine busy (one sequence at a time) while r3 asks about doc A again: by then LRU has
    pushed most of A's blocks down to DRAM (they were written through when computed)."""
    prompts = [48 * BT + 1, 48 * BT + 1, BT + 1, 48 * BT + 1]
    hashes = [doc(0, 48), doc(1, 48), doc(2, 1), doc(0, 48)]
    return Requests(
        arrival_s=np.array([0.0, 0.001, 0.002, 0.003]),
        prompt_tokens=np.array(prompts),
        output_tokens=np.array([2, 2, 300, 2]),
        prefix_hashes=hashes,
    )


def run_case(prefetch):
    config = make_config(
        "engine.max_num_seqs=1",
        "engine.kv_pool_blocks=80",
        kv={"mode": "offload", "prefetch": prefetch},
    )
    return CheckedEngine(config, evicted_prefix_case()).run()


def test_queue_lookahead_takes_the_blocking_copy_off_a_waiting_requests_ttft():
    none, ahead = run_case("none"), run_case("queue_lookahead")
    link = none.config.hardware.link
    block = none.config.tier_block_bytes("dram")
    staged = ahead.summary["prefetch_blocks"]
    lookups = none.summary["prefix_lookup_blocks"]
    dram_hits = round(none.summary["dram_hit_rate"] * lookups)
    # on demand, r3 loads its DRAM blocks when it reaches the queue head; with the lookahead
    # exactly those blocks were staged while r2 ran, and r3 found them all in HBM
    assert staged == dram_hits > 20
    assert ahead.summary["dram_hit_rate"] == 0
    assert ahead.summary["prefetch_bytes"] == staged * block
    assert ahead.summary["prefetch_hits"] == staged and ahead.summary["prefetch_wasted"] == 0
    assert ahead.timeline.prefetch_bytes.sum() == staged * block
    # the load r3 waited for: the load's fixed cost, one latency, and its bytes at the
    # efficiency of the layout's chunks (h100-sxm's auto layout in offload mode, vLLM's
    # cross-layer blocks: one chunk a block, Llama-3-8B's 32 layers x K,V x 16 tokens x
    # 8 heads x 128 x 2 B = 2 MiB)
    chunk = 32 * 2 * 16 * 8 * 128 * 2
    assert none.config.copy_chunk_bytes() == chunk
    efficiency = (1 + (link.half_efficiency_bytes / chunk) ** link.chunk_blend) ** (
        -1 / link.chunk_blend
    )
    load_s = link.load_overhead + link.latency + staged * block / efficiency / link.h2d
    gain = none.requests.ttft_s[3] - ahead.requests.ttft_s[3]
    assert gain == pytest.approx(load_s, rel=1e-9)
    # everything else is the same run
    assert np.allclose(none.requests.ttft_s[:3], ahead.requests.ttft_s[:3], rtol=1e-12)
    assert none.summary["h2d_bytes"] == pytest.approx(ahead.summary["h2d_bytes"])


def test_per_step_columns_place_the_staging_and_the_hits():
    """In the hand case above the blocks are staged a few per step while r2 decodes, and r3
    reads them all on its one prefill step, after the last staging: the per-step columns
    must show each count on its own step (not running totals, not each other's)."""
    result = run_case("queue_lookahead")
    t, staged = result.timeline, result.summary["prefetch_blocks"]
    block = result.config.tier_block_bytes("dram")
    assert t.prefetch_blocks.sum() == staged > 20
    assert (t.prefetch_bytes == t.prefetch_blocks * block).all()
    hit_steps = np.flatnonzero(t.prefetch_hits.to_numpy() > 0)
    assert len(hit_steps) == 1 and t.prefetch_hits.iloc[hit_steps[0]] == staged
    assert hit_steps[0] > np.flatnonzero(t.prefetch_blocks.to_numpy() > 0).max()


def test_prefetch_none_adds_no_columns_or_figures():
    result = run_case("none")
    assert not any(c.startswith("prefetch") for c in result.timeline.columns)
    assert not any(k.startswith("prefetch") for k in result.summary)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(["offload", "dram_centric"]),
    prefetch=st.sampled_from(
        ["queue_lookahead", {"name": "queue_lookahead", "depth": 1, "max_bytes_per_step": 2**23},
         "next_turn", "heat"]
    ),
    capacity_gib=st.integers(20, 26),
    dram_gib=st.sampled_from([1, 4, 64]),
    ssd_gib=st.sampled_from([0, 8]),
    sparse=st.booleans(),
    n=st.integers(1, 30),
    rate=st.floats(1, 40),
    seed=st.integers(0, 1000),
)  # fmt: skip
def test_invariants_hold_with_prefetch_on(
    mode, prefetch, capacity_gib, dram_gib, ssd_gib, sparse, n, rate, seed
):
    if prefetch == "heat" and mode != "dram_centric":
        mode = "dram_centric"
    kv = {
        "mode": mode,
        "dram_capacity": f"{dram_gib}GiB",
        "ssd_capacity": f"{ssd_gib}GiB",
        "access": {"kind": "sparse", "window_blocks": 4, "topk_blocks": 8} if sparse else "full",
        "prefetch": prefetch,
    }
    config = make_config(
        f"hardware.hbm.capacity={capacity_gib}GiB", "engine.max_batched_tokens=2048",
        f"seed={seed}", kv=kv,
    )  # fmt: skip
    requests = shared_documents(n=n, docs=3, doc_tokens=2048, rate=rate, seed=seed)
    engine = CheckedEngine(config, requests)  # the block accounting after every step
    result = engine.run()
    assert set(result.requests.status) <= {"finished", "rejected"}
    t = result.timeline
    assert (hbm_parts(t) <= config.hardware.hbm.capacity).all()
    for link in engine.links.all():
        assert link.bytes_delivered == pytest.approx(link.bytes_submitted)
        assert link.in_flight == 0
    s = result.summary
    assert s["prefetch_hits"] + s["prefetch_wasted"] == s["prefetch_blocks"]
    assert s["prefetch_bytes"] <= s["h2d_bytes"] * (1 + 1e-12)
    assert not engine.kv.prefetch.inflight


@pytest.mark.parametrize("layout", ["layer_kv", "block"])
def test_queue_lookahead_lowers_ttft_when_requests_queue(layout):
    """Requests queue behind a cap of two sequences, their documents evicted to DRAM: the
    lookahead loads a queued request's document while the two ahead of it compute, so it
    starts with its prefix in HBM instead of loading it after admission."""
    requests = shared_documents(n=150, docs=16, doc_tokens=8192, rate=10.0)
    # a 4.19 GiB pool: 0.9 x 23.93 GiB - 14.96 GiB weights - 2 GiB - 0.39 GiB activations
    args = (
        "hardware.hbm.capacity=23.93GiB", f"hardware.link.copy_layout={layout}",
        "engine.max_num_seqs=2",
    )  # fmt: skip
    base = make_config(*args, kv={"mode": "offload"})
    ahead = make_config(*args, kv={"mode": "offload", "prefetch": "queue_lookahead"})
    none, pf = simulate(base, requests).summary, simulate(ahead, requests).summary
    assert pf["prefetch_hits"] > 0
    assert pf["ttft_p50_s"] < none["ttft_p50_s"]
    assert pf["ttft_mean_s"] < none["ttft_mean_s"]


def test_queue_lookahead_changes_nothing_without_dram_hits():
    # every request has its own prompt: no prefix is ever found below HBM
    requests = shared_documents(n=40, docs=40, doc_tokens=2048, rate=8.0)
    requests = Requests(
        requests.arrival_s, requests.prompt_tokens, requests.output_tokens,
        prefix_hashes=[h + np.uint64(i * 7_000_000) for i, h in enumerate(requests.prefix_hashes)],
    )  # fmt: skip
    base = simulate(make_config(kv={"mode": "offload"}), requests)
    pf = simulate(make_config(kv={"mode": "offload", "prefetch": "queue_lookahead"}), requests)
    assert pf.summary["prefetch_blocks"] == 0
    assert np.array_equal(base.requests.ttft_s, pf.requests.ttft_s)
    assert base.summary["h2d_bytes"] == pf.summary["h2d_bytes"]


# --- config ------------------------------------------------------------------------------


def test_prefetch_specs_are_validated_like_eviction_specs():
    config = make_config(
        kv={"mode": "offload", "prefetch": {"name": "queue_lookahead", "depth": 2}}
    )
    assert config.kv.prefetch_name == "queue_lookahead"
    with pytest.raises(ConfigError, match=r"known: .*heat.*next_turn.*none.*queue_lookahead"):
        make_config(kv={"mode": "offload", "prefetch": "lookahead"})
    with pytest.raises(ConfigError, match="depth"):
        make_config(kv={"mode": "offload", "prefetch": {"name": "queue_lookahead", "depth": 0}})
    with pytest.raises(ConfigError, match=r"kv\.layerwise"):
        make_config(kv={"mode": "offload", "prefetch": "layerwise"})
    with pytest.raises(ConfigError, match="dram_centric"):
        make_config(kv={"mode": "offload", "prefetch": "heat"})
    with pytest.raises(ConfigError, match="offload or dram_centric"):
        make_config(kv={"mode": "hbm", "prefetch": "queue_lookahead"})


def test_a_user_prefetcher_by_dotted_path_runs():
    spec = "tests.test_prefetch:HeadOnly"
    config = make_config(kv={"mode": "offload", "prefetch": spec})
    assert type(make_prefetch(config.kv.prefetch)).__name__ == "HeadOnly"
    none, head = run_case("none"), run_case(spec)
    assert head.summary["prefetch_hits"] > 0
    assert head.requests.ttft_s[3] < none.requests.ttft_s[3]


class HeadOnly(QueueLookahead):
    """A user policy: the queue head only."""

    name = "head_only"
    params = param_table(max_bytes_per_step=non_negative(0.0))

    def __init__(self, max_bytes_per_step: float = 0.0):
        super().__init__(depth=1, max_bytes_per_step=max_bytes_per_step)


# --- the policies alone -------------------------------------------------------------------


def test_queue_lookahead_orders_by_queue_then_prefix():
    policy = QueueLookahead(depth=2)
    view = PrefetchView(now=0.0, waiting=[np.array([5, 6]), np.array([7]), np.array([9])])
    assert policy.propose(view) == [(5, 0.0), (6, 0.0), (7, -1.0)]


def test_heat_predictive_keeps_an_ema_per_key_and_picks_top_k():
    policy = HeatPredictive(alpha=0.5, margin=0.0)
    heat = np.array([0.0, 0.9, 0.1, 0.5])
    keys = np.array([1, 2, 3])
    first = policy.propose(PrefetchView(now=0, batch=[keys], topk=[1], heat=heat))
    assert first == [(1, 0.9)]  # a new key starts at its heat
    heat = np.array([0.0, 0.1, 0.1, 0.9])
    # EMA: key 1 -> 0.5*0.1 + 0.5*0.9 = 0.5, key 3 -> 0.5*0.9 + 0.5*0.5 = 0.7
    second = policy.propose(PrefetchView(now=1, batch=[keys], topk=[2], heat=heat))
    assert second == [(3, pytest.approx(0.7)), (1, pytest.approx(0.5))]
    # a margin adds the runners-up: ceil(0.5 x 2) = 1 more key
    wider = HeatPredictive(alpha=1.0, margin=0.5)
    third = wider.propose(PrefetchView(now=2, batch=[keys], topk=[2], heat=heat))
    assert [k for k, _ in third] == [3, 1, 2]


def test_next_turn_learns_think_time_keeps_then_stages_then_releases():
    policy = NextTurn(initial_think_s=10.0, keep_factor=2.0, lead=0.5)
    policy.on_turn_end(1, np.array([4, 5]), now=0.0)
    policy.on_turn_start(1, now=6.0)  # observed think time: 6 s
    assert policy.think_s == 6.0
    policy.on_turn_end(1, np.array([4, 5, 8]), now=10.0)
    assert list(policy.protected(11.0)) == [4, 5, 8]
    assert policy.propose(PrefetchView(now=12.0)) == []  # staged from 10 + 6 - 3 = 13 s on
    assert [k for k, _ in policy.propose(PrefetchView(now=13.5))] == [4, 5, 8]
    assert policy.propose(PrefetchView(now=14.0)) == []  # staged once per turn
    assert len(policy.protected(22.5)) == 0  # released after 2 x 6 s


def sessions_in_a_flood(sessions=6, turns=4, think_s=5.0, turn_tokens=512, flood_rate=10.0):
    """Chat sessions (turn n+1 resends turn n's prompt and adds ``turn_tokens``) among one-off
    2k-token requests that fill the prefix cache with blocks nobody reuses."""
    rows = []  # (arrival, prompt tokens, hashes, session, turn)
    for s in range(sessions):
        for t in range(turns):
            blocks = (t + 1) * turn_tokens // BT
            rows.append((0.3 * s + t * think_s, blocks * BT + 1, doc(s, blocks), s, t))
    span = turns * think_s + 0.3 * sessions
    for i, at in enumerate(np.arange(0.05, span, 1 / flood_rate)):
        rows.append((float(at), 2048 + 1, doc(1000 + i, 2048 // BT), -1, 0))
    rows.sort(key=lambda r: r[0])
    return Requests(
        arrival_s=np.array([r[0] for r in rows]),
        prompt_tokens=np.array([r[1] for r in rows]),
        output_tokens=np.full(len(rows), 16),
        session=np.array([r[3] for r in rows]),
        prefix_hashes=[r[2] for r in rows],
        turn=np.array([r[4] for r in rows]),
    )


def test_next_turn_keeps_sessions_blocks_in_hbm_through_a_flood():
    requests = sessions_in_a_flood()
    later = (requests.session >= 0) & (requests.turn > 0)

    def run(prefetch):
        config = make_config(
            "engine.kv_pool_blocks=1500", kv={"mode": "offload", "prefetch": prefetch}
        )
        return CheckedEngine(config, requests).run()

    none, kept = run("none"), run({"name": "next_turn", "initial_think_s": 5.0})
    assert kept.summary["hbm_hit_rate"] > none.summary["hbm_hit_rate"]
    assert kept.requests.ttft_s[later].mean() < none.requests.ttft_s[later].mean()


def heat_run(prefetch, capacity="24GiB", drift_kind="walk"):
    access = {
        "kind": "sparse", "sink_blocks": 1, "window_blocks": 16, "topk_blocks": 64,
        "drift": 0.1, "drift_kind": drift_kind,
    }  # fmt: skip
    kv = {"mode": "dram_centric", "access": access, "prefetch": prefetch, "layerwise": False}
    workload = {
        "kind": "synthetic", "num_requests": 16, "arrival": {"kind": "all_at_once"},
        "prompt_tokens": 8192, "output_tokens": 64,
    }  # fmt: skip
    config = make_config(
        f"hardware.hbm.capacity={capacity}", "engine.max_num_seqs=64", workload=workload, kv=kv
    )
    return simulate(config).summary


def test_heat_prefetch_raises_the_decode_hit_rate_and_cuts_stall():
    # attention drifts gradually (walk): the runners-up of each top-k are the likely next
    # entries; staging them into the room cold blocks leave turns critical-path misses into hits
    none, heat = heat_run("none"), heat_run("heat")
    assert heat["prefetch_hits"] > 0
    assert heat["hbm_access_hit_rate"] > none["hbm_access_hit_rate"] + 0.01
    assert heat["stall_s"] < none["stall_s"]


def test_heat_prefetch_changes_nothing_when_hbm_holds_everything():
    none, heat = heat_run("none", "80GiB"), heat_run("heat", "80GiB")
    assert heat["prefetch_blocks"] == 0
    for key in ("ttft_p50_s", "tpot_p50_s", "stall_s", "h2d_bytes", "hbm_access_hit_rate"):
        assert heat[key] == none[key]
