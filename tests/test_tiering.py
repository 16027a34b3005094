"""Tiered KV: modes agree when HBM is plentiful, conservation holds, the headline effects show."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.memory.links
from sim.instance.step import layerwise_step_s
from sim.kv.modes import MODES as MODE_RULES
from sim.observe.invariants import Invariants
from sim.run import Simulation, simulate
from sim.workload import build_requests
from sim.workload.requests import Requests
from tests.conftest import hbm_parts, make_config

MODES = ("hbm", "offload", "dram_centric")


def closed_batch(n, prompt, output):
    return {
        "kind": "synthetic",
        "num_requests": n,
        "arrival": {"kind": "all_at_once"},
        "prompt_tokens": prompt,
        "output_tokens": output,
    }


def shared_documents(
    n=120, docs=12, doc_tokens=4096, question=256, rate=4.0, seed=0, bt=16, output=32
):
    """Requests that ask questions about a few long documents (prefix hashes shared per doc)."""
    rng = np.random.default_rng(seed)
    doc = rng.integers(0, docs, n)
    hashes = []
    for i in range(n):
        shared = np.arange(doc_tokens // bt, dtype=np.uint64) + np.uint64(1 + int(doc[i]) * 100_003)
        own = np.arange(question // bt, dtype=np.uint64) + np.uint64(10**9 + i * 1_000)
        hashes.append(np.concatenate((shared, own)))
    return Requests(
        arrival_s=np.cumsum(rng.exponential(1 / rate, n)),
        prompt_tokens=np.full(n, doc_tokens + question),
        output_tokens=np.full(n, output),
        prefix_hashes=hashes,
    )


def test_plentiful_hbm_gives_identical_latency_in_every_mode():
    results = {
        mode: simulate(make_config(workload=closed_batch(8, 2048, 64), kv={"mode": mode}))
        for mode in MODES
    }
    base = results["hbm"].requests
    for mode in ("offload", "dram_centric"):
        other = results[mode].requests
        assert np.allclose(other.ttft_s, base.ttft_s, rtol=1e-12)
        assert np.allclose(other.tpot_s, base.tpot_s, rtol=1e-12)
        assert results[mode].summary["stall_s"] == 0
    # dram_centric writes every token's KV through to DRAM: 8 x (2048 + 63) tokens x 128 KiB
    assert results["dram_centric"].summary["d2h_bytes"] == 8 * (2048 + 63) * 131072


def check_accounting(engine: Simulation) -> None:
    """The block accounting's invariants (tiers, reference counts, places, the index)."""
    checks = Invariants(engine.instance, engine.fabric)
    checks.check_tiers()
    checks.check_blocks()


class CheckedEngine(Simulation):
    """Checks the KV accounting after every step."""

    def __init__(self, *args):
        super().__init__(*args)
        complete = self.scheduler.complete

        def checked(batch, now):
            done = complete(batch, now)
            check_accounting(self)
            return done

        self.scheduler.complete = checked


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(MODES),
    capacity_gib=st.integers(20, 26),
    dram_gib=st.sampled_from([1, 4, 64]),
    ssd_gib=st.sampled_from([0, 8]),
    sparse=st.booleans(),
    swap=st.booleans(),
    write_back=st.booleans(),
    n=st.integers(1, 30),
    rate=st.floats(1, 40),
    seed=st.integers(0, 1000),
)
def test_conservation_in_every_mode(
    mode, capacity_gib, dram_gib, ssd_gib, sparse, swap, write_back, n, rate, seed
):
    kv = {
        "mode": mode,
        "dram_capacity": f"{dram_gib}GiB",
        "ssd_capacity": f"{ssd_gib}GiB",
        "access": {"kind": "sparse", "window_blocks": 4, "topk_blocks": 8} if sparse else "full",
        "write_policy": "write_back" if write_back else "write_through",
    }
    config = make_config(
        f"hardware.hbm.capacity={capacity_gib}GiB",
        f"engine.preemption={'swap' if swap else 'recompute'}",
        "engine.max_batched_tokens=2048",
        f"seed={seed}",
        kv=kv,
    )
    requests = shared_documents(n=n, docs=3, doc_tokens=2048, rate=rate, seed=seed)
    result = CheckedEngine(config, requests).run()
    statuses = set(result.requests.status)
    assert statuses <= {"finished", "rejected"}
    t = result.timeline
    assert (hbm_parts(t) <= config.hardware.hbm.capacity).all()
    assert (t.dram_kv_bytes <= dram_gib * 2**30).all()
    assert (t.ssd_kv_bytes <= ssd_gib * 2**30).all()
    for column in ("h2d_bytes", "d2h_bytes", "ssd_read_bytes", "ssd_write_bytes"):
        assert t[column].sum() <= result.summary[column] * (1 + 1e-9) + 1


def test_links_deliver_every_byte_sent():
    config = make_config(
        "hardware.hbm.capacity=24GiB", "engine.preemption=swap", kv={"mode": "offload"}
    )
    engine = Simulation(config, shared_documents())
    engine.run()
    for link in engine.links.all():
        assert link.bytes_delivered == pytest.approx(link.bytes_submitted)
        assert link.in_flight == 0


def test_offload_turns_recomputation_into_dram_hits():
    requests = shared_documents(n=150, docs=16, doc_tokens=8192, rate=4.0)
    hbm = simulate(make_config("hardware.hbm.capacity=24GiB", kv={"mode": "hbm"}), requests).summary
    off = simulate(
        make_config("hardware.hbm.capacity=24GiB", kv={"mode": "offload"}), requests
    ).summary
    assert hbm["dram_hit_rate"] == 0 and hbm["h2d_bytes"] == 0
    assert off["dram_hit_rate"] > 0.3
    assert off["prefix_hit_tokens"] > hbm["prefix_hit_tokens"]
    assert off["ttft_p50_s"] < hbm["ttft_p50_s"] / 2


def test_swap_preemption_moves_kv_out_and_back():
    requests = shared_documents(n=40, docs=40, doc_tokens=2048, rate=50.0, output=1024)
    config = make_config(
        "hardware.hbm.capacity=22GiB", "engine.preemption=swap", kv={"mode": "hbm"}
    )
    s = simulate(config, requests).summary
    assert s["swaps"] > 0 and s["recomputed_tokens"] == 0
    assert s["h2d_bytes"] == pytest.approx(s["d2h_bytes"])  # every swapped block came back
    recompute = simulate(make_config("hardware.hbm.capacity=22GiB", kv={"mode": "hbm"}), requests)
    assert recompute.summary["recomputed_tokens"] > 0 and recompute.summary["swaps"] == 0


def classic(model, mode, access, batch=32, context=8192):
    kv = {"mode": mode, "access": access}
    config = make_config(
        "engine.max_num_seqs=64", model=model, workload=closed_batch(batch, context, 128), kv=kv
    )
    return simulate(config)


def test_classic_sweep_point_hbm_pool_limit_vs_dram_centric():
    # llama-2-7b (512 KiB/token): 32 x 8192 tokens need 128 GiB of KV; the H100 pool holds ~54
    hbm = classic("llama-2-7b", "hbm", "full").summary
    sparse = {"kind": "sparse", "sink_blocks": 1, "window_blocks": 16, "topk_blocks": 64}
    dram = classic("llama-2-7b", "dram_centric", sparse).summary
    assert hbm["preemptions"] > 0
    assert dram["preemptions"] == 0
    assert dram["output_tokens_per_s"] > 1.5 * hbm["output_tokens_per_s"]


def test_classic_sweep_llama_3_8b_fits_at_32_x_8192_and_binds_at_64():
    # GQA: 128 KiB/token, so the corner (32 x 8192 + 128) needs 32.5 GiB of KV and
    # the H100's ~54 GiB pool holds it; the pool limit binds past ~54 GiB, e.g. 64 x 8192
    sparse = {"kind": "sparse", "sink_blocks": 1, "window_blocks": 16, "topk_blocks": 64}
    corner = classic("llama-3-8b", "hbm", "full")
    kv_needed = 32 * (8192 + 128) * corner.config.model.kv_bytes_per_token()
    assert kv_needed < corner.timeline.hbm_kv_pool_bytes.iloc[0]
    assert corner.summary["preemptions"] == 0
    hbm = classic("llama-3-8b", "hbm", "full", batch=64).summary
    dram = classic("llama-3-8b", "dram_centric", sparse, batch=64).summary
    assert hbm["preemptions"] > 0 and dram["preemptions"] == 0
    assert dram["output_tokens_per_s"] > hbm["output_tokens_per_s"]


def test_dram_centric_full_access_is_bound_by_the_host_link():
    result = classic("llama-2-7b", "dram_centric", "full")
    config = result.config
    t = result.timeline
    decode = t[(t.decode_tokens == t.step_tokens) & (t.batch_size == 32)]
    # each decode step reads all KV; what the HBM cache lacks crosses the link at <= h2d bandwidth
    assert len(decode) > 0
    assert (decode.step_s >= decode.h2d_bytes / config.hardware.link.h2d * (1 - 1e-9)).all()
    kv_per_step = 32 * 8192 * config.model.kv_bytes_per_token()
    cache = decode.hbm_kv_pool_bytes
    assert (decode.step_s >= (kv_per_step - cache) / config.hardware.link.h2d).all()


def test_layer_events_agree_with_the_closed_form_without_contention():
    kv = {"mode": "dram_centric", "write_policy": "write_back"}
    workload = closed_batch(16, 8192, 4)
    args = ("hardware.hbm.capacity=24GiB", "engine.max_num_seqs=64")
    analytic = simulate(make_config(*args, workload=workload, kv=kv, model="llama-2-7b"))
    events = simulate(
        make_config(*args, "engine.layer_events=true", workload=workload, kv=kv, model="llama-2-7b")
    )
    assert analytic.summary["h2d_bytes"] > 0
    assert np.allclose(analytic.timeline.step_s, events.timeline.step_s, rtol=1e-9)


def test_layerwise_closed_form():
    # transfer bound (x = 2 > c = 1): the whole transfer, then the last layer's compute
    assert layerwise_step_s(64.0, 1.0, 32) == pytest.approx(64 + 1)
    # compute bound (x = 0.1 < c = 2): the first layer's transfer, then all the compute
    assert layerwise_step_s(3.2, 2.0, 32) == pytest.approx(0.1 + 32 * 2)


def test_same_seed_same_sparse_access():
    config = make_config(
        "model=llama-2-7b", workload=closed_batch(8, 4096, 32),
        kv={"mode": "dram_centric", "access": {"kind": "sparse", "topk_blocks": 8}},
    )  # fmt: skip
    a, b = simulate(config), simulate(config)
    assert a.timeline.equals(b.timeline)


def test_direct_read_needs_a_coherent_link():
    from sim.errors import ConfigError

    with pytest.raises(ConfigError, match="coherent host link"):
        make_config(kv={"mode": "dram_centric", "direct_read": True})
    config = make_config("hardware=gh200", kv={"mode": "dram_centric", "direct_read": True})
    assert config.kv.direct_read


def test_requests_without_prefix_hashes_still_run_in_every_mode():
    for mode in MODES:
        config = make_config(kv={"mode": mode})
        result = simulate(config, build_requests(config.workload, config.seed))
        assert result.summary["requests_finished"] == 20


def test_compressed_dram_tier_moves_fewer_bytes():
    # fp8 in DRAM halves every byte on the link; dequantising costs step time instead
    args = ("hardware.hbm.capacity=24GiB", "engine.max_num_seqs=64")
    workload = closed_batch(16, 4096, 16)
    bf16 = simulate(
        make_config(*args, workload=workload, model="llama-2-7b", kv={"mode": "dram_centric"})
    )
    fp8 = simulate(
        make_config(
            *args,
            workload=workload,
            model="llama-2-7b",
            kv={"mode": "dram_centric", "dram_dtype": "fp8"},
        )
    )
    assert fp8.summary["d2h_bytes"] == pytest.approx(bf16.summary["d2h_bytes"] / 2)
    assert fp8.config.tier_block_bytes("dram") == bf16.config.tier_block_bytes("dram") / 2
    assert 0 < fp8.summary["h2d_bytes"] < bf16.summary["h2d_bytes"]


def test_direct_read_streams_without_staging_or_caching():
    args = ("hardware=gh200", "hardware.hbm.capacity=40GiB", "engine.max_num_seqs=64")
    workload = closed_batch(16, 8192, 64)
    kv = {"mode": "dram_centric", "direct_read": True}
    run = simulate(make_config(*args, workload=workload, model="llama-2-7b", kv=kv))
    t = run.timeline
    assert (t.hbm_staging_bytes == 0).all()
    assert run.summary["h2d_bytes"] > 0
    copy = simulate(
        make_config(*args, workload=workload, model="llama-2-7b", kv={"mode": "dram_centric"})
    )
    assert (copy.timeline.hbm_staging_bytes > 0).any()


def test_hits_are_counted_once_per_block_even_when_prefill_is_chunked():
    requests = shared_documents(n=2, docs=1, doc_tokens=4096, rate=0.1)
    config = make_config("engine.max_batched_tokens=512", kv={"mode": "hbm"})
    s = simulate(config, requests).summary
    # the second request finds the 256 document blocks of the first, once
    assert s["prefix_hit_tokens"] == 4096
    # each lookup covers the prompt's full blocks but the last token: (4352 - 1) // 16 = 271
    assert s["hbm_hit_rate"] == pytest.approx(256 / (2 * 271))


ONLINE = [
    "fifo",
    "lru",
    "lfu",
    "arc",
    "s3fifo",
    "sieve",
    "gds",
    "heat",
    "length_aware",
    "scheduler_aware",
]


@pytest.mark.parametrize("policy", ONLINE)
def test_every_online_policy_runs_in_the_engine_with_invariants(policy):
    requests = shared_documents(n=30, docs=6, doc_tokens=2048, rate=20.0)
    for mode in ("offload", "dram_centric"):
        kv = {"mode": mode, "eviction": policy, "dram_capacity": "2GiB", "ssd_capacity": "4GiB"}
        config = make_config("hardware.hbm.capacity=21GiB", kv=kv)
        result = CheckedEngine(config, requests).run()
        assert result.summary["requests_finished"] == 30


def test_gds_evicts_the_end_of_a_cached_prefix_before_its_start():
    # A caches its 8 prompt blocks; B (5 blocks) finds 4 free and evicts one of A's; C repeats
    # A's prompt. Losing A's first block would make the whole chain unreachable: GDS must
    # evict its last (cost 16 tokens against 128), so C finds the 7 blocks a lookup covers.
    a = np.arange(1, 9, dtype=np.uint64)
    requests = Requests(
        arrival_s=np.array([0.0, 10.0, 20.0]),
        prompt_tokens=np.array([128, 80, 128]),
        output_tokens=np.array([1, 1, 1]),
        prefix_hashes=[a, np.arange(100, 105, dtype=np.uint64), a],
    )
    config = make_config("engine.kv_pool_blocks=12", kv={"mode": "hbm", "eviction": "gds"})
    s = simulate(config, requests).summary
    assert s["prefix_hit_tokens"] == 7 * 16  # (128 - 1) // 16 = 7 blocks looked up, all hit


@pytest.mark.parametrize(
    ("mode", "blocks", "kept"),
    [
        ("hbm", [100, 500, 900], [False] * 3),  # hbm mode: DRAM holds swaps only
        ("offload", [100, 500, 900], [True, True, False]),  # the SSD's victims are gone
        ("offload", [100, 500, 0], [True, False, False]),
        ("offload", [100, 0, 900], [False, True, False]),  # no DRAM: an HBM victim is gone
        ("dram_centric", [100, 500, 0], [True, False, False]),  # HBM caches DRAM
    ],
)
def test_victims_are_lost_where_no_tier_below_has_room(mode, blocks, kept):
    assert MODE_RULES[mode].keeps_below(blocks) == kept


def test_gds_above_a_tier_that_keeps_the_copies_evicts_as_lru():
    # In offload mode an HBM victim goes down to DRAM, where a match still finds it: a miss
    # costs one load whatever the block, and GDS with one cost for every key is LRU. (With the
    # chain cost in HBM too, HBM hits fall from 44.0% to 41.2% here.)
    requests = shared_documents(n=60, docs=8, doc_tokens=4096, rate=8.0)
    runs = {
        policy: simulate(
            make_config(
                "hardware.hbm.capacity=21GiB",
                kv={"mode": "offload", "eviction": policy, "dram_capacity": "64GiB"},
            ),
            requests,
        )
        for policy in ("gds", "lru")
    }
    assert runs["lru"].summary["dram_hit_rate"] > 0.3  # HBM evicts, DRAM never does
    pd.testing.assert_frame_equal(runs["gds"].requests, runs["lru"].requests)


def test_offline_and_tree_policies_are_refused_by_the_engine():
    from sim.errors import ConfigError

    with pytest.raises(ConfigError, match="offline policy"):
        make_config(kv={"mode": "offload", "eviction": "opt"})
    with pytest.raises(ConfigError, match=r"kv.dram.eviction.*not available in the engine"):
        make_config(kv={"mode": "offload", "dram": {"eviction": "prefix_lru"}})


TINY_MODEL = {
    "name": "tiny", "layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32,
    "intermediate": 256, "vocab": 512, "dtype": "fp32",
}  # fmt: skip
TINY_BLOCK = 2 * 2 * 2 * 32 * 4 * 8  # layers x K,V x kv_heads x head_dim x 4 B x 8 tokens


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_offload_eviction_cascades_keep_block_ids_and_tiers_honest(seed):
    # a 16-block HBM pool over an 8-block DRAM, no SSD, shared documents: making room in HBM
    # copies victims down, which evicts DRAM copies of (a) other victims of the same batch and
    # (b) blocks being loaded for a hit. (a) once freed a block id twice; (b) read the lost
    # copy from an SSD of capacity 0. Now: each id is free at most once, no SSD byte moves.
    workload = {
        "kind": "documents", "num_requests": 16, "arrival": {"kind": "all_at_once"},
        "num_documents": 6, "document_tokens": {"kind": "uniform", "min": 24, "max": 64},
        "question_tokens": {"kind": "uniform", "min": 4, "max": 16},
        "output_tokens": {"kind": "uniform", "min": 2, "max": 8},
        "zipf_s": 0.5, "system_prompt_tokens": 8,
    }  # fmt: skip
    config = make_config(
        f"seed={seed}", "hardware=cpu-host", "engine.max_num_seqs=2",
        "engine.max_batched_tokens=64", "engine.block_tokens=8", "engine.kv_pool_blocks=16",
        model=TINY_MODEL, workload=workload,
        kv={"mode": "offload", "layerwise": False, "ssd_capacity": 0,
            "dram_capacity": 8 * TINY_BLOCK},
    )  # fmt: skip
    requests = build_requests(config.workload, config.seed, block_tokens=8)
    engine = Simulation(config, requests)
    result = engine.run()
    free = engine.kv.table._free_ids
    assert len(free) == len(set(free))
    assert result.summary["ssd_read_bytes"] == 0 and result.summary["dram_hit_rate"] > 0
    check_accounting(engine)


def _tier_with(policy: str, capacity: int = 4):
    from policies.registry import make_eviction
    from sim.memory.blocks import BlockTable
    from sim.memory.tiers import Tier

    table = BlockTable()
    ids = [table.new(owner=0, position=i, heat=0.0) for i in range(capacity)]
    return Tier(0, "hbm", capacity, 1.0, make_eviction(policy, capacity=capacity), table), ids


def test_a_cached_block_reused_by_hits_keeps_its_history_in_the_policy():
    # LFU: block a is hit three times (pinned by a request, then released), block b is
    # cached once, later: a has 4 uses, b 1, so b goes first. Had each hit made the policy
    # forget a and insert it anew, both would have one use and a, the older, would go.
    tier, (a, b, *_) = _tier_with("lfu")
    tier.add(a, 0.0, evictable=True)
    for now in (1.0, 2.0, 3.0):
        tier.pin(a)
        tier.make_evictable(a, now)
    tier.add(b, 4.0, evictable=True)
    assert tier.evict(1) == [b]


def test_a_held_block_is_never_a_victim_and_leaves_the_policy_when_removed():
    tier, (a, b, c, _) = _tier_with("lru")
    for now, block in enumerate((a, b, c)):
        tier.add(block, float(now), evictable=True)
    tier.pin(a)  # the LRU block, in use by a hit
    assert tier.available == 1 + 2 and tier.evict(1) == [b]
    tier.remove(a)
    assert a not in tier.held and tier.evict(5) == [c]


def test_s3fifo_counts_each_use_of_a_held_block():
    # S3-FIFO walks and re-queues pinned keys, so a tier takes a held block out of its queue
    # (on_hold) and puts it back at the new end with the use counted (on_release): at the
    # head of S the block reused twice is promoted to M, and the newer, unused c goes instead
    tier, (a, b, c, *_) = _tier_with("s3fifo", capacity=40)  # S holds 4
    tier.add(a, 0.0, evictable=True)
    tier.add(b, 1.0, evictable=True)
    for now in (2.0, 3.0):  # two uses: move_threshold 2, as in libCacheSim
        tier.pin(a)
        assert a not in tier.policy.small
        tier.make_evictable(a, now)  # S: b, a
    tier.add(c, 4.0, evictable=True)  # S: b, a, c
    assert tier.evict(2) == [b, c]


def test_a_full_tier_refuses_another_block_and_stays_as_it_was():
    """``resident <= capacity`` is a tier's invariant: once full, every way of adding a
    block (one or many, evictable or in use) raises and leaves the tier unchanged."""
    from policies.registry import make_eviction
    from sim.memory.blocks import BlockTable
    from sim.memory.tiers import Tier

    table = BlockTable()
    ids = [table.new(owner=0, position=i, heat=0.0) for i in range(6)]
    tier = Tier(0, "hbm", 4, 1.0, make_eviction("lru", capacity=4), table)
    tier.add(ids[0], 0.0, evictable=True)
    tier.add_pinned([ids[1]])
    tier.add_pinned([ids[2], ids[3]])
    assert tier.resident == 4 and tier.free_slots == 0
    for add in (
        lambda: tier.add(ids[4], 1.0, evictable=True),
        lambda: tier.add(ids[4], 1.0, evictable=False),
        lambda: tier.add_pinned([ids[4]]),
        lambda: tier.add_pinned([ids[4], ids[5]]),
        lambda: tier.add_evictable_many(np.array([ids[4]]), 1.0),
    ):
        with pytest.raises(RuntimeError, match="full"):
            add()
        assert tier.resident == 4 and not table.where[0, ids[4]] and not table.where[0, ids[5]]
        assert set(tier.evictable) == {ids[0]}


def test_a_tier_shrunk_below_its_residents_has_no_free_slot():
    """HBM in ``dram_centric`` may shrink below its residents for an instant: it then has
    no free slot (not a negative count), and only its evictable blocks are available."""
    tier, ids = _tier_with("lru", capacity=4)
    for now, b in enumerate(ids):
        tier.add(b, float(now), evictable=now < 2)  # two cached, two in use
    tier.capacity = 1
    assert tier.free_slots == 0
    assert tier.available == 2


def test_a_length_aware_tier_evicts_the_earliest_block_of_a_request_first():
    """Length-aware LFU breaks ties by the block's index in its request (its table
    position), smallest first, whatever the order blocks were cached in: the tier hands
    each new evictable block's position to the policy."""
    tier, ids = _tier_with("length_aware", capacity=4)  # positions 0, 1, 2, 3
    for now, b in enumerate((ids[3], ids[1], ids[2])):  # cached last block first
        tier.add(b, float(now), evictable=True)
    assert tier.evict(3) == [ids[1], ids[2], ids[3]]


@pytest.mark.parametrize("policy", ["lfu", "fifo", "arc", "sieve", "gds", "heat"])
def test_a_removed_held_block_leaves_a_policy_that_keeps_held_blocks(policy):
    """Policies that keep a block in use in their order (no hold hooks, access is not an
    insert) must forget it when it leaves the tier while held: it is never a victim
    afterwards, and its id can be cached again as a new block."""
    tier, (a, b, c, _) = _tier_with(policy)
    for now, block in enumerate((a, b, c)):
        tier.add(block, float(now), evictable=True)
    tier.pin(a)
    tier.remove(a)
    assert sorted(tier.evict(5)) == sorted([b, c])
    tier.add(a, 9.0, evictable=True)  # the id is reused for a new block
    assert tier.evict(5) == [a] and tier.resident == 0


def test_touching_blocks_in_bulk_leaves_held_ones_out():
    """:meth:`Tier.touch_many` is a hit on each evictable block, in order; a held block's
    use is counted when it is released, not by a touch: it stays out of the eviction order
    (a policy taking a step's touches in one call gets the evictable ones only)."""
    tier, (a, b, c, d) = _tier_with("lru")  # LRU takes a step's touches in one call
    for now, block in enumerate((a, b, c, d)):
        tier.add(block, float(now), evictable=True)
    tier.pin(b)
    tier.touch_many(np.array([c, b, a]), 9.0)  # LRU order now: d, c, a (b in use)
    assert tier.evict(4) == [d, c, a]
    assert tier.held == {b} and tier.resident == 1


def test_eviction_with_a_pinned_mask_spares_held_blocks_too():
    """A held block is never a victim, also when the caller pins other blocks with a
    mask (a step's reads): for a policy that keeps held blocks in its order, the tier adds
    them to the mask."""
    tier, (a, b, c, d) = _tier_with("lfu")
    for now, block in enumerate((a, b, c, d)):
        tier.add(block, float(now), evictable=True)
    tier.pin(a)  # the least used and oldest block, in use
    pinned = np.zeros(tier.table.size, dtype=bool)
    pinned[c] = True
    assert tier.evict(2, pinned) == [b, d]
    assert tier.evict(5) == [c] and tier.held == {a}


def test_a_touch_counts_when_a_single_block_is_evictable():
    """LFU: the only cached block, ``a``, is hit twice by bulk touches; ``b``, cached later
    and never hit, then has fewer uses and goes first (without the hits, ``a`` is older)."""
    tier, (a, b, c, _) = _tier_with("lfu")
    tier.add(a, 0.0, evictable=True)
    tier.add(c, 0.5, evictable=False)  # in use: not touched
    for now in (1.0, 2.0):
        tier.touch_many(np.array([a, c]), now)
    tier.add(b, 3.0, evictable=True)
    assert tier.evict(1) == [b]


@pytest.mark.parametrize(("layerwise", "pieces"), [(True, 32), (False, 1)])
def test_a_layer_by_layer_fetch_moves_one_layers_slice_of_a_block_a_chunk(
    monkeypatch, layerwise, pieces
):
    """``dram_centric`` on whole-block copies (vLLM's cross-layer blocks): a step that fetches
    before its compute copies whole blocks (2 MiB for Llama-3-8B); fetched layer by layer, each
    copy is one layer's K and V of a block (64 KiB), however the blocks are laid out."""
    chunks = []
    real = sim.memory.links.Link.transfer

    def recorded(self, nbytes, chunk_bytes=None, latencies=1):
        chunks.append(chunk_bytes)
        return real(self, nbytes, chunk_bytes, latencies)

    monkeypatch.setattr(sim.memory.links.Link, "transfer", recorded)
    config = make_config(
        "hardware.link.copy_layout=block", "hardware.hbm.capacity=20GiB",
        f"kv.layerwise={str(layerwise).lower()}",
        workload=closed_batch(24, 6000, 16), kv={"mode": "dram_centric"},
    )  # fmt: skip
    block = config.tier_block_bytes("dram")
    assert block == 2 * 1024 * 1024 and config.copy_chunk_bytes() == block
    simulate(config)
    assert block / pieces in chunks  # the step fetches
    assert all(c is None or c in (block, block / pieces) for c in chunks)
