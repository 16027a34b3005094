"""Runs (sim/instance/runs.py) change nothing but speed: runs on and off give the same files,
their step costs are the cost model's, and they are taken where they should be."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster.feed import delivery_times
from sim.config import build_config
from sim.cost.roofline import CostModel, CostParams
from sim.instance import runs as decoderun
from sim.instance import step_planner as steprun
from sim.instance.runlog import RunLog
from sim.instance.timeline import TIMELINE_COLUMNS, Timeline
from sim.run import Simulation
from sim.workload import build_requests
from sim.workload.requests import Requests
from tests.conftest import make_config, synthetic
from tests.test_costtable import TINY, run_config, tiny_table
from tests.test_fuzz import budget


def _run(config):
    requests = build_requests(config.workload, config.seed, block_tokens=config.engine.block_tokens)
    engine = Simulation(config, requests)
    return engine, engine.run()


def _same_results(config) -> int:
    """Run ``config`` with decode runs off and on; assert equal outputs; steps taken in runs."""
    off = config.model_copy(
        update={"engine": config.engine.model_copy(update={"decode_runs": False})}
    )
    loop, a = _run(off)
    engine, b = _run(config)
    # the same block ids, taken and freed in the same order
    assert loop.kv.table._free_ids == engine.kv.table._free_ids
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.timeline, b.timeline, check_exact=True)
    drop = ("wall_time_s",)
    assert {k: v for k, v in a.summary.items() if k not in drop} == {
        k: v for k, v in b.summary.items() if k not in drop
    }
    return engine.decode_runs.steps


LOGNORMAL = {"kind": "lognormal", "mean": 300, "sigma": 0.8}
LONG_OUTPUTS = {"kind": "uniform", "min": 20, "max": 300}
CASES = {
    "poisson, no prefix": (
        [],
        synthetic(60, LOGNORMAL, {"kind": "uniform", "min": 5, "max": 90}, 20.0),
    ),
    "shared prefix": ([], synthetic(60, LOGNORMAL, 40, 20.0, shared=256)),
    "shared prefix, finishes in prefill, small pool": (
        ["engine.kv_pool_blocks=150", "engine.max_batched_tokens=256"],
        synthetic(60, LOGNORMAL, {"kind": "uniform", "min": 1, "max": 4}, 30.0, shared=128),
    ),
    "small pool, recompute": (
        ["engine.kv_pool_blocks=120"],
        synthetic(40, 400, {"kind": "uniform", "min": 20, "max": 200}, 50.0),
    ),
    "small pool, swap": (
        ["engine.kv_pool_blocks=120", "engine.preemption=swap"],
        synthetic(40, 400, {"kind": "uniform", "min": 20, "max": 200}, 50.0),
    ),
    "prompts in chunks": (
        ["engine.max_batched_tokens=512"],
        synthetic(40, {"kind": "lognormal", "mean": 1500, "sigma": 0.5}, 80, 5.0),
    ),
    "seats full": (["engine.max_num_seqs=4"], synthetic(30, 100, 50, 100.0)),
    "no chunked prefill": (
        ["engine.chunked_prefill=false", "engine.max_batched_tokens=2048"],
        synthetic(30, LOGNORMAL, 60, 10.0),
    ),
    "all at once": ([], {**synthetic(50, 200, 30, 1.0), "arrival": {"kind": "all_at_once"}}),
    # host time about as long as the steps (~6.7 ms): the GPU waits for it in some steps only
    # (187 of 500)
    "asynchronous scheduling": (
        [
            "engine.async_scheduling=true",
            "hardware.efficiency.async_step_gap=150us",
            "hardware.efficiency.step_overhead=6ms",
            "hardware.efficiency.sequence_overhead=100us",
        ],
        synthetic(60, LOGNORMAL, {"kind": "uniform", "min": 5, "max": 90}, 20.0),
    ),
    # one decoder leaves a prompt one token a step: such steps are not prefill chunks (the
    # run's chunk pricing needs two or more), each is priced as the loop prices it
    "a budget of one token beside a decoder": (
        ["engine.max_batched_tokens=2", "engine.max_num_seqs=2"],
        synthetic(6, 40, 12, 50.0),
    ),
    "arrivals while others decode and prefill": (
        ["engine.max_batched_tokens=512"],
        synthetic(150, {"kind": "lognormal", "mean": 900, "sigma": 0.6}, LONG_OUTPUTS, 6.0),
    ),
}


# sim/instance/step_planner.py without prefix caching (its own sums, or each step's
# attention_time call),
# sim/instance/runs.py's pieces with it (here also without)
PLANNERS = ["steps", "priced", "pieces"]


def _use(planner: str, monkeypatch) -> None:
    """Plan runs a step at a time where that applies (``priced``: with the cost model's
    calls, as for measured tables), or always in pieces."""
    if planner == "pieces":
        monkeypatch.setattr(steprun, "applies", lambda engine: False)
    if planner == "priced":
        monkeypatch.setattr(steprun, "exact", lambda engine: False)


@pytest.mark.parametrize("planner", PLANNERS)
@pytest.mark.parametrize("name", list(CASES))
def test_decode_runs_change_nothing(name, planner, monkeypatch):
    _use(planner, monkeypatch)
    overrides, workload = CASES[name]
    taken = _same_results(make_config(*overrides, workload=workload))
    assert taken > 0  # the case exercises runs


def test_decode_runs_change_nothing_with_measured_tables(tmp_path):
    """The table cost model prices each run step with its own per-step call."""
    hardware = {"profile": "cpu-host", "cost_model": "table", "cost_table": tiny_table(tmp_path)}
    config = build_config(run_config(TINY, hardware, num_requests=20, output_tokens=40), "<t>")
    assert _same_results(config) > 0


@budget(25)  # $KVSIM_FUZZ_EXAMPLES searches longer (tests/test_fuzz.py)
@given(
    seed=st.integers(0, 10_000),
    rate=st.floats(1.0, 200.0),
    output=st.integers(1, 120),
    pool=st.integers(40, 400),
    swap=st.booleans(),
    shared=st.sampled_from([0, 64]),
    block=st.sampled_from([1, 16, 32]),
    budget=st.sampled_from([256, 4096]),
    seats=st.sampled_from([3, 64]),
    window=st.sampled_from([None, 64]),  # sliding-window attention
    planner=st.sampled_from(PLANNERS),
)
def test_decode_runs_change_nothing_anywhere(
    seed, rate, output, pool, swap, shared, block, budget, seats, window, planner
):
    config = make_config(
        f"seed={seed}",
        f"engine.kv_pool_blocks={pool * 16 // block}",
        f"engine.block_tokens={block}",
        f"engine.max_batched_tokens={budget}",
        f"engine.max_num_seqs={seats}",
        f"engine.preemption={'swap' if swap else 'recompute'}",
        workload=synthetic(
            25,
            {"kind": "uniform", "min": 1, "max": 600},
            {"kind": "uniform", "min": 1, "max": output},
            rate,
            shared,
        ),
    )
    config = _with_window(config, window)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _use(planner, monkeypatch)
        _same_results(config)


def _with_window(config, window: int | None):
    """``config`` with its model's attention limited to the last ``window`` tokens."""
    model = config.model.model_copy(update={"sliding_window": window})
    return config.model_copy(update={"model": model})


@pytest.mark.parametrize("planner", PLANNERS)
def test_decode_runs_change_nothing_with_a_sliding_window(planner, monkeypatch):
    """Contexts cross a 100-token window in prefill chunks and in decode steps."""
    _use(planner, monkeypatch)
    workload = synthetic(30, {"kind": "uniform", "min": 20, "max": 400}, 150, 20.0)
    config = make_config("engine.max_batched_tokens=128", workload=workload)
    assert _same_results(_with_window(config, 100)) > 0


def test_one_request_alone_decodes_at_the_cost_model_times():
    """A single request: every decode step is a run step, and its finish time is the
    prefill plus the cost model's decode step at each context, added up in order."""
    config = make_config(workload=synthetic(1, 1000, 200, 1.0))
    engine, result = _run(config)
    assert engine.decode_runs.planner is not None  # a step at a time (sim/instance/step_planner.py)
    cost = engine.cost
    t = cost.prefill_time(1000)
    for context in range(1000, 1199):
        t += cost.decode_time(np.array([context]))
    finish = result.requests["finish_s"].iloc[0] - result.requests["arrival_s"].iloc[0]
    assert finish == pytest.approx(t, rel=1e-12)
    assert engine.decode_runs.steps == 199


def test_runs_are_not_taken_where_tiers_move_data():
    config = make_config("kv.mode=offload", workload=synthetic(20, 300, 50, 5.0))
    engine, _ = _run(config)
    assert engine.decode_runs.steps == 0


@pytest.mark.parametrize("sliding", [None, 256])
@pytest.mark.parametrize("attention_efficiency", [0.25, 1e-4])  # reads-bound, FLOPs-bound
def test_decode_steps_equal_one_step_at_a_time(
    sliding, attention_efficiency, tiny_model, cost_params: CostParams
):
    model = tiny_model.model_copy(update={"sliding_window": sliding})
    params = dataclasses.replace(cost_params, attention_efficiency=attention_efficiency)
    cost = CostModel(model, params)
    assert cost.decode_reads_bound == (attention_efficiency == 0.25)
    context = np.random.default_rng(3).integers(0, 5000, size=37)
    linear, attention, overhead = cost.decode_steps(context, 50)
    ones = np.ones(len(context), dtype=np.int64)
    for j in range(50):
        step = cost.step(ones, context + j, len(context))
        assert (step.linear_s, step.attention_s, step.overhead_s) == (
            linear,
            attention[j],
            overhead[j],
        )


def test_record_many_equals_rows_one_at_a_time():
    rng = np.random.default_rng(0)
    data = rng.random((Timeline.CHUNK_ROWS + 50, len(TIMELINE_COLUMNS)))
    one, many = Timeline(), Timeline()
    for row in data[:10]:
        one.record(**dict(zip(TIMELINE_COLUMNS, row.tolist(), strict=True)))
    for row in data[10:]:
        one.record(**dict(zip(TIMELINE_COLUMNS, row.tolist(), strict=True)))
    many.record_many(10, **{c: data[:10, i] for i, c in enumerate(TIMELINE_COLUMNS)})
    constant = {c: data[10:, i] for i, c in enumerate(TIMELINE_COLUMNS)}
    many.record_many(len(data) - 10, **constant)
    pd.testing.assert_frame_equal(one.to_frame(), many.to_frame(), check_exact=True)
    scalar = Timeline()
    scalar.record_many(3, **{c: 1.5 for c in TIMELINE_COLUMNS})
    assert (scalar.to_frame()["time_s"] == 1.5).all() and len(scalar) == 3


def test_the_option_is_a_config_key():
    config = build_config(
        {"model": "llama-3-8b", "hardware": "h100-sxm", "workload": synthetic(1, 10, 2, 1.0),
         "engine": {"decode_runs": False}},
        "<test>",
    )  # fmt: skip
    engine, _ = _run(config)
    assert engine.decode_runs.steps == 0


@pytest.mark.parametrize("planner", PLANNERS)
def test_runs_take_admissions_prefill_chunks_and_finishes(planner, monkeypatch):
    """Without prefix caching nothing needs the clock between steps: every step is a run's."""
    _use(planner, monkeypatch)
    config = make_config(
        "engine.max_batched_tokens=512",
        workload=synthetic(40, {"kind": "lognormal", "mean": 900, "sigma": 0.6}, 50, 6.0),
    )
    engine, result = _run(config)
    running_before = result.timeline["running"].shift(fill_value=0)
    idle_starts = int((running_before == 0).sum())  # a step after idling: the normal loop's
    assert engine.decode_runs.steps == len(result.timeline) - idle_starts > 0
    assert (result.timeline["prefill_tokens"] > 0).sum() > 40  # chunks of every prompt


def test_grow_each_allocates_as_one_call_each():
    config = make_config(workload=synthetic(5, 100, 10))
    requests = build_requests(config.workload, config.seed, block_tokens=16)
    one, many = Simulation(config, requests).kv, Simulation(config, requests).kv
    rids = np.array([0, 1, 0, 2, 2, 2, 4, 1, 3, 0])
    nth = np.array([int((rids[:i] == r).sum()) for i, r in enumerate(rids)])
    for kv in (one, many):
        for rid in range(5):
            kv.allocate(rid, 100)
    for rid in rids.tolist():
        one.allocate(rid, int(one.held[rid]) * one.bt + 1)
    many.grow_each(rids, many.held[rids] + nth)
    assert one.blocks == many.blocks and (one.held == many.held).all()
    n = one.table.size
    for name in ("ref", "owner", "position", "heat", "hash", "dirty"):
        assert (getattr(one.table, name)[:n] == getattr(many.table, name)[:n]).all(), name
    assert (one.table.where[:, :n] == many.table.where[:, :n]).all()
    assert one.tiers[0].resident == many.tiers[0].resident


def _plain_new_blocks(held: np.ndarray, context: np.ndarray, n: int, bt: int) -> list[tuple]:
    """(step, index) of each block started, a step at a time in batch order."""
    holds, out = held.tolist(), []
    for step in range(n):
        for i, c in enumerate(context.tolist()):
            if c + step + 1 > holds[i] * bt:  # its next token starts a block
                out.append((step, i))
                holds[i] += 1
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 70), st.integers(0, 2)), min_size=1, max_size=80),
    st.integers(1, 40),
    st.sampled_from([1, 4, 16]),
)
def test_new_blocks_are_the_step_by_step_order(seqs, n, bt):
    # each sequence: its context tokens, and blocks held beyond those its context fills
    context = np.array([c for c, _ in seqs], dtype=np.int64)
    held = -(-context // bt) + np.array([extra for _, extra in seqs], dtype=np.int64)
    at, owner = decoderun.new_blocks(held, context, n, bt)
    got = list(zip(at.tolist(), owner.tolist(), strict=True))
    assert got == _plain_new_blocks(held, context, n, bt)


def _requests(arrival: list[float], prompt: int = 300, output: int = 40) -> Requests:
    n = len(arrival)
    return Requests(
        np.array(arrival), np.full(n, prompt, dtype=np.int64), np.full(n, output, dtype=np.int64)
    )


def test_delivery_times_are_when_simpy_hands_requests_over():
    """The clock adds ``at - now`` to ``now``: not always exactly ``at``."""
    rng = np.random.default_rng(1)
    gaps = rng.exponential(0.3, 60) * rng.choice([1e-6, 1.0, 1e3], 60)
    arrival = [0.7, 3.1, *(3.1 + np.cumsum(gaps)).tolist()]  # 0.7 + (3.1 - 0.7) != 3.1
    config = make_config("engine.decode_runs=false")
    engine = Simulation(config, _requests(arrival, 50, 5))
    seen: list[float] = []
    add = engine.scheduler.add
    engine.scheduler.add = lambda rid: seen.append(engine.env.now) or add(rid)
    engine.run()
    assert seen == delivery_times(np.array(arrival)).tolist()
    assert seen != arrival  # the case exercises rounding


@pytest.mark.parametrize("planner", PLANNERS)
def test_an_arrival_at_exactly_a_step_end_is_seen_as_without_runs(planner, monkeypatch):
    """SimPy's event order decides whether a request delivered at a step's very end joins
    the next step; a run must leave that step to its own timeout, as the loop does."""
    _use(planner, monkeypatch)
    config = make_config()
    off = config.model_copy(
        update={"engine": config.engine.model_copy(update={"decode_runs": False})}
    )
    base = [0.0, 0.001]
    _, first = _run_with(off, _requests(base))
    ends = first.timeline["time_s"].to_numpy()[5:30]  # step boundaries while both decode
    tied = [t for t in ends.tolist() if delivery_times(np.array([*base, t]))[-1] == t]
    assert tied  # some boundary the clock can land on exactly
    requests = _requests([*base, tied[0]])
    _, a = _run_with(off, requests)
    _, b = _run_with(config, requests)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.timeline, b.timeline, check_exact=True)
    assert a.requests["scheduled_s"].iloc[2] == tied[0]  # it joined the very next step


def _run_with(config, requests):
    engine = Simulation(config, requests)
    return engine, engine.run()


def test_the_kv_manager_sees_each_step_time_as_without_runs():
    """Cached blocks are stamped with the clock when released or evicted: a run, planning
    ahead of SimPy, gives the KV manager the time of the step it plans."""
    overrides, workload = CASES["shared prefix, finishes in prefill, small pool"]
    seen = {}
    for runs in (False, True):
        flag = f"engine.decode_runs={str(runs).lower()}"
        config = make_config(*overrides, flag, workload=workload)
        engine = Simulation(config, build_requests(config.workload, config.seed, block_tokens=16))
        kv, log = engine.kv, []
        for owner, name in ((kv, "release"), (kv.cascade, "make_room")):
            setattr(owner, name, _noting_the_clock(kv, owner, name, log))
        engine.run()
        seen[runs] = log
    assert seen[True] == seen[False]
    assert {"release", "make_room"} <= {name for name, _ in seen[True]}
    assert engine.decode_runs.steps > 0


@pytest.mark.parametrize("planner", PLANNERS)
def test_runs_cut_at_their_step_bound_change_nothing(planner, monkeypatch):
    """A run's rows wait in memory until it ends, so runs end every MAX_RUN_STEPS steps."""
    _use(planner, monkeypatch)
    monkeypatch.setattr(decoderun, "MAX_RUN_STEPS", 7)
    overrides, workload = CASES["arrivals while others decode and prefill"]
    assert _same_results(make_config(*overrides, workload=workload)) > 0


def _noting_the_clock(kv, owner, name: str, log: list):
    call = getattr(owner, name)

    def noted(*args):
        log.append((name, kv.now))
        return call(*args)

    return noted


@pytest.mark.parametrize("planner", PLANNERS)
def test_an_arrival_waits_in_a_run_while_a_prefill_takes_the_budget(planner, monkeypatch):
    """A request arriving during a 4,000-token prompt's 512-token chunks cannot join until
    the last, shorter chunk: the chunks before it stay in the run, the newcomer joins the
    last chunk's step, and nothing changes."""
    _use(planner, monkeypatch)
    config = make_config("engine.max_batched_tokens=512")
    off = config.model_copy(
        update={"engine": config.engine.model_copy(update={"decode_runs": False})}
    )
    _, alone = _run_with(off, _requests([0.0], 4000, 5))
    second = float(alone.timeline["time_s"].iloc[1]) / 2  # during the first chunk
    requests = _requests([0.0, second], 4000, 5)
    _, a = _run_with(off, requests)
    engine, b = _run_with(config, requests)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.timeline, b.timeline, check_exact=True)
    joined = int(np.argmax(b.timeline["batch_size"].to_numpy() == 2))
    assert joined == 4000 // 512  # 7 full chunks, then 416 tokens and the newcomer's 96
    assert b.timeline["step_tokens"].iloc[joined] == 512
    assert engine.decode_runs.steps > joined


@pytest.mark.parametrize("planner", PLANNERS)
def test_an_arrival_due_as_a_run_would_start_is_left_to_simpy(planner, monkeypatch):
    """A step that began before a request's arrival event was scheduled ends exactly at its
    arrival: SimPy wakes the engine first, with the request not yet handed over. A run
    starting then must take no step and leave it to the loop (which schedules without the
    request), not plan from that instant again and again."""
    _use(planner, monkeypatch)
    config = make_config("engine.max_num_seqs=2")  # the newcomers wait: the two decode
    off = config.model_copy(
        update={"engine": config.engine.model_copy(update={"decode_runs": False})}
    )
    base = [0.0, 0.001]
    _, first = _run_with(off, _requests(base))
    t0, t1 = first.timeline["time_s"].iloc[10:12].tolist()  # a step while both decode
    arrivals = np.array([*base, (t0 + t1) / 2, t1])  # one during the step, one at its end
    assert delivery_times(arrivals)[-1] == t1
    calls = []
    plan = decoderun.DecodeRuns._next

    def bounded(self):
        calls.append(1)
        assert len(calls) < 100_000, "a run plans the same instant forever"
        return plan(self)

    monkeypatch.setattr(decoderun.DecodeRuns, "_next", bounded)
    _, a = _run_with(off, _requests(arrivals.tolist()))
    engine, b = _run_with(config, _requests(arrivals.tolist()))
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.timeline, b.timeline, check_exact=True)
    assert engine.decode_runs.steps > 0


def test_a_piece_starting_at_the_next_arrival_takes_no_step():
    """:meth:`DecodeRuns._steps_taken`: steps start before the next arrival only; when the
    first would start at it (or after), none is taken and the run ends there (an arrival
    cutting a piece later ends it through the delivery instead)."""
    runs = decoderun.DecodeRuns.__new__(decoderun.DecodeRuns)
    runs.engine = SimpleNamespace(
        kv=SimpleNamespace(available=100), arrivals=SimpleNamespace(next_arrival_s=1.0)
    )
    runs.bounded = False
    counts = np.zeros(3, dtype=np.int64)
    for start, taken, last in ((1.0, 0, True), (1.5, 0, True), (0.0, 1, False), (-9.0, 3, False)):
        log = RunLog(start)
        times = start + np.arange(4.0)  # steps of one second from ``start``
        assert runs._steps_taken(counts, times, log) == taken
        assert log.last is last
    runs.bounded = True  # in a cluster: steps that *end* before the arrival (a tie is not)
    for start, taken, last in ((0.0, 0, True), (-0.5, 1, False), (-9.0, 3, False)):
        log = RunLog(start)
        assert runs._steps_taken(counts, start + np.arange(4.0), log) == taken
        assert log.last is last


@pytest.mark.parametrize("planner", PLANNERS)
def test_a_last_chunk_of_one_token_beside_a_decoder_is_priced_as_the_loop_prices_it(
    planner, monkeypatch
):
    """A 1,023-token prompt beside one decoder gets 511 tokens a step: 511, 511, then 1. That
    last token runs as a decode kernel with the decoder's (not a prefill chunk): runs price it
    as the loop does, so the timelines are identical."""
    _use(planner, monkeypatch)
    config = make_config("engine.max_batched_tokens=512")
    off = config.model_copy(
        update={"engine": config.engine.model_copy(update={"decode_runs": False})}
    )
    requests = Requests(np.array([0.0, 0.05]), np.array([100, 1023]), np.array([300, 20]))
    _, a = _run_with(off, requests)
    engine, b = _run_with(config, requests)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.timeline, b.timeline, check_exact=True)
    both = b.timeline[b.timeline["batch_size"] == 2]
    assert both["prefill_tokens"].head(3).tolist() == [511, 511, 1]
    assert engine.decode_runs.steps > 0


def test_runs_leave_every_full_block_registered(monkeypatch):
    """With prefix caching, a block that fills during a run is findable when the run ends,
    as after the normal loop's steps (an arrival's lookup right after may hit it): every
    running request has registered its full hashed blocks (runs cut short, so that they
    end while requests decode)."""
    workload = {
        "kind": "multi_turn", "num_sessions": 12,
        "session_arrival": {"kind": "poisson", "rate": 4.0},
        "turns": 3, "think_time": {"kind": "exponential", "mean": "0.2s"}, "user_tokens": 64,
        "output_tokens": {"kind": "uniform", "min": 20, "max": 200}, "system_prompt_tokens": 128,
    }  # fmt: skip
    config = make_config(workload=workload)
    checked = []
    write = RunLog.write

    def checking(log, engine):
        kv, s = engine.kv, engine.scheduler
        ids = s.running
        full = np.minimum(s.computed[ids] // kv.bt, kv.index.hashed_blocks[ids])
        assert (kv.index.registered[ids] == full).all()
        checked.append(len(ids))
        write(log, engine)

    monkeypatch.setattr(RunLog, "write", checking)
    monkeypatch.setattr(decoderun, "MAX_RUN_STEPS", 3)  # runs end while requests decode
    engine, _ = _run(config)
    assert engine.kv.prefix and engine.kv.index.hashes is not None and sum(checked) > 0
