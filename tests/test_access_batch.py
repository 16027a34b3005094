"""``AccessModel.decode_blocks_many`` against its reference, a plain loop of ``decode_blocks``.

Every case runs both on copies of the same inputs and generator state and compares the read
sets (values and dtype), the heat array and the generator state afterwards.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.kv.access
from sim.config.kv import FullAccess, SparseAccess
from sim.kv.access import AccessModel
from sim.run import simulate
from tests.conftest import make_config


def sparse(**fields) -> SparseAccess:
    return SparseAccess(kind="sparse", **fields)


def run_both(spec, seqs, heat, rng=None):
    """(reference, batched): each a tuple of read sets, heat after, generator state after."""
    rng = rng if rng is not None else np.random.default_rng(7)
    results = []
    for batched in (False, True):
        gen = np.random.Generator(type(rng.bit_generator)())
        gen.bit_generator.state = rng.bit_generator.state
        model, h = AccessModel(spec, gen), heat.copy()
        inputs = [b.copy() for b in seqs]
        if batched:
            reads = model.decode_blocks_many(inputs, h)
        else:
            reads = [model.decode_blocks(b, h) for b in inputs]
        for before, after in zip(seqs, inputs, strict=True):
            assert np.array_equal(before, after)  # inputs are not modified
        results.append((reads, h, gen.bit_generator.state))
    return results


def assert_same(spec, seqs, heat, rng=None):
    (ref, ref_heat, ref_state), (got, got_heat, got_state) = run_both(spec, seqs, heat, rng)
    assert len(got) == len(ref)
    for a, b in zip(ref, got, strict=True):
        assert a.dtype == b.dtype
        assert np.array_equal(a, b)
    assert np.array_equal(ref_heat, got_heat)
    assert same_state(ref_state, got_state)
    return ref


def same_state(a, b) -> bool:
    """Bit generator states equal (MT19937's and Philox's hold arrays)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[key], b[key]) for key in a)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def shared_batch(rng, n_seqs=12, prefix=300, table=5000):
    """Sequences that all start with the same ``prefix`` blocks, then blocks of their own."""
    ids = rng.permutation(table)
    common, rest = ids[:prefix], ids[prefix:]
    seqs, at = [], 0
    for _ in range(n_seqs):
        own = int(rng.integers(0, 250))
        seqs.append(np.concatenate((common, rest[at : at + own])).astype(np.int64))
        at += own
    return seqs, rng.random(table)


def test_shared_blocks_see_earlier_redraws():
    rng = np.random.default_rng(1)
    seqs, heat = shared_batch(rng)
    spec = sparse(sink_blocks=1, window_blocks=4, topk_blocks=20, drift=0.3)
    ref = assert_same(spec, seqs, heat)
    # the case the batch must get right: a later sequence's top-k holds a shared block
    shared = set(seqs[0][1:300].tolist())
    assert any(shared & set(r.tolist()) for r in ref[1:])


def test_redrawing_only_shared_blocks():
    # every sequence is the same blocks: each redraw is seen by all the later ones
    rng = np.random.default_rng(2)
    seqs = [np.arange(200, dtype=np.int64)] * 6
    for drift in (0.05, 0.5, 1.0):
        assert_same(sparse(topk_blocks=10, drift=drift), seqs, rng.random(200))


def test_k_at_least_the_middle_reads_all_and_draws_nothing():
    rng = np.random.default_rng(3)
    seqs = [np.arange(n, dtype=np.int64) for n in (0, 1, 5, 17, 40, 81)]
    spec = sparse(sink_blocks=1, window_blocks=16, topk_blocks=64)
    ref = assert_same(spec, seqs, rng.random(100))
    assert all(np.array_equal(r, b) for r, b in zip(ref, seqs, strict=True))
    heat = rng.random(100)
    model = AccessModel(spec, np.random.default_rng(7))
    assert all(r is b for r, b in zip(model.decode_blocks_many(seqs, heat), seqs, strict=True))
    assert model.rng.bit_generator.state == np.random.default_rng(7).bit_generator.state


def test_mixed_batch_of_short_long_and_empty():
    rng = np.random.default_rng(4)
    seqs = [np.arange(n, dtype=np.int64) + 10 * n for n in (0, 3, 90, 2, 150, 0, 70)]
    heat = rng.random(2000)
    for spec in (sparse(topk_blocks=8), sparse(sink_blocks=0, window_blocks=0, topk_blocks=5)):
        assert_same(spec, seqs, heat)


@pytest.mark.parametrize("drift", [0.0, 0.01, 0.05, 0.5, 1.0])
def test_drift(drift):
    rng = np.random.default_rng(5)
    seqs, heat = shared_batch(rng, n_seqs=8, prefix=100)
    assert_same(sparse(topk_blocks=16, drift=drift), seqs, heat)


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.1, 0.5, 1.0])
def test_topk_fraction(fraction):
    rng = np.random.default_rng(6)
    seqs, heat = shared_batch(rng, n_seqs=10, prefix=50)
    assert_same(sparse(topk_fraction=fraction, window_blocks=3), seqs, heat)


def test_topk_zero_still_draws():
    rng = np.random.default_rng(8)
    seqs, heat = shared_batch(rng, n_seqs=5, prefix=40)
    spec = sparse(topk_blocks=0, drift=0.2)
    ref = assert_same(spec, seqs, heat)
    assert all(len(r) == 1 + 16 for r in ref)
    (_, _, state), _ = run_both(spec, seqs, heat)
    assert state != np.random.default_rng(7).bit_generator.state


def test_ties_at_the_kth_score_pick_the_same_set():
    # scores on a coarse grid tie at the k-th place: the per-middle argpartition decides
    rng = np.random.default_rng(9)
    seqs, _ = shared_batch(rng, n_seqs=8, prefix=60)
    heat = rng.integers(0, 4, 5000) / 4.0
    for drift in (0.0, 0.1):
        assert_same(sparse(topk_blocks=12, drift=drift), seqs, heat)


def test_skewed_scores_starve_the_threshold():
    # scores far from uniform: the prefilter keeps fewer than k, the per-middle path answers
    rng = np.random.default_rng(10)
    seqs, _ = shared_batch(rng, n_seqs=6, prefix=80)
    heat = rng.random(5000) * 1e-3
    assert_same(sparse(topk_blocks=30, drift=0.0), seqs, heat)
    assert_same(sparse(topk_blocks=30, drift=0.02), seqs, heat)


def test_more_draws_than_the_first_buffer(monkeypatch):
    monkeypatch.setattr(sim.kv.access, "_first_draws", lambda tests, drift: 1)
    rng = np.random.default_rng(11)
    seqs, heat = shared_batch(rng, n_seqs=9, prefix=120)
    for drift in (0.05, 0.9):
        assert_same(sparse(topk_blocks=10, drift=drift), seqs, heat)


def loop_redraws(spec, seqs, heat, seed=7):
    """The blocks each sequence of the plain loop redraws (those whose heat it changes)."""
    model, h = AccessModel(spec, np.random.default_rng(seed)), heat.copy()
    redrawn = []
    for blocks in seqs:
        before = h.copy()
        model.decode_blocks(blocks.copy(), h)
        redrawn.append(set(np.flatnonzero(h != before).tolist()))
    return redrawn


@pytest.mark.parametrize("drift", [0.05, 0.3, 0.9])
@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_shared_blocks_redrawn_by_several_middles(drift, scale):
    # scale 1e-3: a redrawn block outscores the others, so a middle that saw another's
    # redraw too early (or missed an earlier one's) picks another set
    seqs, heat = shared_batch(np.random.default_rng(20), n_seqs=12, prefix=150)
    spec = sparse(sink_blocks=1, window_blocks=4, topk_blocks=20, drift=drift)
    redrawn = loop_redraws(spec, seqs, heat * scale)
    shared = set(seqs[0][1:150].tolist())
    assert any(sum(b in r for r in redrawn) >= 2 for b in shared)  # early and again later
    assert any(b not in redrawn[0] and any(b in r for r in redrawn[1:]) for b in shared)
    assert_same(spec, seqs, heat * scale)


@pytest.mark.parametrize("spare", [0, 1, 3])
def test_scores_past_the_first_buffer(monkeypatch, spare):
    # the first buffer ends just past the first middle's tests: its scores draw more
    seqs, heat = shared_batch(np.random.default_rng(21), n_seqs=4, prefix=100)
    spec = sparse(sink_blocks=1, window_blocks=4, topk_blocks=10, drift=0.5)
    tests = len(seqs[0]) - 5  # the first middle's
    monkeypatch.setattr(sim.kv.access, "_first_draws", lambda _, __: tests + spare)
    assert_same(spec, seqs, heat)


def test_negative_ids_read_as_numpy_indexes_them():
    seqs, heat = shared_batch(np.random.default_rng(22), n_seqs=5, prefix=40, table=400)
    assert_same(sparse(topk_blocks=8, drift=0.2), [s - 400 for s in seqs], heat)


def test_buffered_half_word_survives():
    # a 32-bit draw leaves half a 64-bit output buffered; random() keeps it, and so must we
    rng = np.random.default_rng(12)
    rng.integers(0, 2**31, dtype=np.uint32)
    assert rng.bit_generator.state["has_uint32"] == 1
    seqs, heat = shared_batch(np.random.default_rng(13), n_seqs=5, prefix=60)
    assert_same(sparse(topk_blocks=10, drift=0.1), seqs, heat, rng)


@pytest.mark.parametrize("bitgen", [np.random.MT19937, np.random.Philox, np.random.PCG64DXSM])
def test_other_bit_generators(bitgen):
    seqs, heat = shared_batch(np.random.default_rng(14), n_seqs=5, prefix=60)
    assert_same(sparse(topk_blocks=10, drift=0.1), seqs, heat, np.random.Generator(bitgen(3)))


def test_walk_drift_and_full_access():
    seqs, heat = shared_batch(np.random.default_rng(15), n_seqs=6, prefix=60)
    assert_same(sparse(topk_blocks=10, drift=0.2, drift_kind="walk"), seqs, heat)
    ref = assert_same(FullAccess(kind="full"), seqs, heat)
    assert all(r is not None and len(r) == len(s) for r, s in zip(ref, seqs, strict=True))


def test_redraw_batches_without_the_loop(monkeypatch):
    seqs, heat = shared_batch(np.random.default_rng(17), n_seqs=6, prefix=60)
    ref = assert_same(sparse(topk_blocks=10, drift=0.1), seqs, heat)

    def refuse(*_):
        raise AssertionError("the batch fell back to decode_blocks")

    monkeypatch.setattr(AccessModel, "decode_blocks", refuse)
    model = AccessModel(sparse(topk_blocks=10, drift=0.1), np.random.default_rng(7))
    got = model.decode_blocks_many(seqs, heat.copy())
    assert all(np.array_equal(a, b) for a, b in zip(ref, got, strict=True))


def test_int32_ids():
    seqs, heat = shared_batch(np.random.default_rng(16), n_seqs=6, prefix=60)
    assert_same(sparse(topk_blocks=10), [s.astype(np.int32) for s in seqs], heat)


@st.composite
def batches(draw):
    table = draw(st.integers(1, 400))
    pool = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    seqs = []
    for _ in range(draw(st.integers(0, 10))):
        n = draw(st.integers(0, min(table, 120)))
        if seqs and draw(st.booleans()):  # a shared prefix with an earlier sequence
            base = seqs[draw(st.integers(0, len(seqs) - 1))]
            cut = draw(st.integers(0, len(base)))
            rest = np.setdiff1d(pool.permutation(table), base[:cut], assume_unique=True)
            seqs.append(np.concatenate((base[:cut], rest[: max(n - cut, 0)])))
        else:
            seqs.append(pool.permutation(table)[:n])
    levels = draw(st.sampled_from([0, 3, 50]))  # 0: continuous scores, else ties
    heat = pool.random(table) if not levels else pool.integers(0, levels, table) / levels
    if draw(st.booleans()):
        top = {"topk_fraction": draw(st.floats(0, 1))}
    else:
        top = {"topk_blocks": draw(st.integers(0, 40))}
    spec = sparse(
        sink_blocks=draw(st.integers(0, 4)),
        window_blocks=draw(st.integers(0, 8)),
        drift=draw(st.sampled_from([0.0, 0.02, 0.1, 0.5, 1.0]) | st.floats(0, 1)),
        **top,
    )
    return spec, [s.astype(np.int64) for s in seqs], heat, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_batch_equals_loop(case):
    spec, seqs, heat, seed = case
    assert_same(spec, seqs, heat, np.random.default_rng(seed))


@st.composite
def crowded_batches(draw):
    """Sequences of a few blocks in any order: most blocks are in many middles."""
    table = draw(st.integers(1, 80))
    pool = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    seqs = [
        pool.permutation(table)[: draw(st.integers(0, table))].astype(np.int64)
        for _ in range(draw(st.integers(1, 16)))
    ]
    spec = sparse(
        sink_blocks=draw(st.integers(0, 2)),
        window_blocks=draw(st.integers(0, 4)),
        topk_blocks=draw(st.integers(0, 12)),
        drift=draw(st.sampled_from([0.05, 0.3, 0.9, 1.0]) | st.floats(0, 1)),
    )
    heat = pool.random(table) * draw(st.sampled_from([1.0, 1e-3]))
    first = draw(st.sampled_from([None, 1, 5, 40]))  # a first buffer of that many doubles
    return spec, seqs, heat, first, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded_batches())
def test_crowded_batch_equals_loop(case):
    spec, seqs, heat, first, seed = case
    with pytest.MonkeyPatch.context() as patch:
        if first is not None:
            patch.setattr(sim.kv.access, "_first_draws", lambda _, __: first)
        assert_same(spec, seqs, heat, np.random.default_rng(seed))


def test_engine_same_with_the_loop(monkeypatch):
    """A sparse run with shared prefixes is the same when every step takes the plain loop."""
    workload = {
        "kind": "synthetic",
        "num_requests": 16,
        "arrival": {"kind": "all_at_once"},
        "prompt_tokens": 1536,
        "output_tokens": 24,
        "shared_prefix_tokens": 1024,
    }
    kv = {
        "mode": "dram_centric",
        "access": {"kind": "sparse", "window_blocks": 4, "topk_blocks": 12, "drift": 0.3},
    }
    config = make_config(workload=workload, kv=kv)
    batched = simulate(config)
    calls = []

    def loop(self, seqs, heat):
        calls.append(len(seqs))
        return [self.decode_blocks(b, heat) for b in seqs]

    monkeypatch.setattr(AccessModel, "decode_blocks_many", loop)
    plain = simulate(config)
    assert max(calls) > 1  # steps did batch several decodes
    assert plain.timeline.equals(batched.timeline)
    assert plain.requests.equals(batched.requests)
    for summary in (plain.summary, batched.summary):
        summary.pop("wall_time_s", None)
    assert plain.summary == batched.summary


def test_one_k_read_sets_are_rows_of_one_array():
    # a fixed topk_blocks: the batch's read sets are the rows of one array, laid out as the
    # loop's (sink, sorted top-k, window), C-contiguous and not the inputs
    seqs, heat = shared_batch(np.random.default_rng(18), n_seqs=7, prefix=90)
    for sink, window in ((0, 0), (1, 16), (3, 2)):
        spec = sparse(sink_blocks=sink, window_blocks=window, topk_blocks=9, drift=0.1)
        ref = assert_same(spec, seqs, heat)
        assert all(len(r) == sink + 9 + window for r in ref)
        model = AccessModel(spec, np.random.default_rng(7))
        got = model.decode_blocks_many(seqs, heat.copy())
        assert all(
            r.flags.c_contiguous and not np.shares_memory(r, s)
            for r, s in zip(got, seqs, strict=True)
        )


def test_mixed_k_and_a_short_threshold_in_one_batch():
    # topk_fraction gives each sequence its own k; skewed scores send some middles down
    # the per-middle path while the others take the threshold's rows
    rng = np.random.default_rng(19)
    seqs, heat = shared_batch(rng, n_seqs=10, prefix=70)
    heat[seqs[3]] *= 1e-3
    for drift in (0.0, 0.05):
        assert_same(sparse(topk_fraction=0.2, window_blocks=4, drift=drift), seqs, heat)
        assert_same(sparse(topk_blocks=12, window_blocks=4, drift=drift), seqs, heat)


def test_step_read_sets_match_the_block_lists(monkeypatch):
    """``KvManager._read_sets`` on a sparse run: every read set is the sequence's block list
    up to its context (or its sparse pick, for a decode), and attended tokens follow."""
    from sim.kv.manager import KvManager

    real_read, real_many = KvManager._read_sets, AccessModel.decode_blocks_many
    seen = {"steps": 0, "decodes": 0, "prefills": 0}

    def many(self, seqs, heat):
        seen["given"] = [s.copy() for s in seqs]
        seen["picked"] = real_many(self, seqs, heat)
        return seen["picked"]

    def read_sets(self, ids, context, new):
        seen["given"] = seen["picked"] = []
        reads, attended = real_read(self, ids, context, new)
        full = [
            np.asarray(self.blocks[r][: -(-c // self.bt)])
            for r, c in zip(ids, context, strict=True)
        ]
        decode = [
            i
            for i, (r, c, n) in enumerate(zip(ids, context, new, strict=True))
            if n == 1 and c >= self.prompt[r]
        ]
        assert len(seen["given"]) == len(decode)
        for i, gave, picked in zip(decode, seen["given"], seen["picked"], strict=True):
            assert np.array_equal(gave, full[i]) and reads[i] is picked
            assert attended[i] == min(context[i], len(picked) * self.bt)
        for i in set(range(len(ids))) - set(decode):
            assert np.array_equal(reads[i], full[i]) and attended[i] == context[i]
        seen["steps"] += 1
        seen["decodes"] += len(decode)
        seen["prefills"] += len(ids) - len(decode)
        return reads, attended

    monkeypatch.setattr(KvManager, "_read_sets", read_sets)
    monkeypatch.setattr(AccessModel, "decode_blocks_many", many)
    workload = {
        "kind": "synthetic",
        "num_requests": 24,
        "arrival": {"kind": "poisson", "rate": 20.0},
        "prompt_tokens": 900,
        "output_tokens": 80,
        "shared_prefix_tokens": 512,
    }
    kv = {
        "mode": "dram_centric",
        "access": {"kind": "sparse", "window_blocks": 4, "topk_blocks": 6},
    }
    simulate(make_config("engine.max_batched_tokens=1024", workload=workload, kv=kv))
    assert seen["steps"] > 50 and seen["decodes"] > 200 and seen["prefills"] > 10


def test_walk_without_drift_reads_the_top_k_and_draws_nothing():
    """``walk`` with drift 0 is a still heat map: sink 1, the 2 hottest middle blocks by hand
    (3 and 5), window 2; the heat and the generator are left as they were (the batch, which
    takes no draws at drift 0, must agree with the loop)."""
    spec = sparse(sink_blocks=1, window_blocks=2, topk_blocks=2, drift=0.0, drift_kind="walk")
    heat = np.array([0.9, 0.1, 0.2, 0.8, 0.3, 0.7, 0.95, 0.99])
    model = AccessModel(spec, np.random.default_rng(7))
    got = model.decode_blocks(np.arange(8, dtype=np.int64), heat)
    assert got.tolist() == [0, 3, 5, 6, 7]
    assert heat.tolist() == [0.9, 0.1, 0.2, 0.8, 0.3, 0.7, 0.95, 0.99]
    assert model.rng.bit_generator.state == np.random.default_rng(7).bit_generator.state
    seqs, heat = shared_batch(np.random.default_rng(23), n_seqs=5, prefix=60)
    assert_same(spec, seqs, heat)
