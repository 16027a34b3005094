"""Decode runs (sim/decoderun.py) change nothing but speed: runs on and off give the same
files, their step costs are the cost model's, and they are taken where they should be."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.config import build_config
from sim.costmodel import CostModel, CostParams
from sim.engine import Engine
from sim.metrics import TIMELINE_COLUMNS, Timeline
from sim.workload import build_requests
from tests.conftest import make_config, synthetic
from tests.test_costtable import TINY, run_config, tiny_table


def _run(config):
    requests = build_requests(config.workload, config.seed, block_tokens=config.engine.block_tokens)
    engine = Engine(config, requests)
    return engine, engine.run()


def _same_results(config) -> int:
    """Run ``config`` with decode runs off and on; assert equal outputs; steps taken in runs."""
    off = config.model_copy(
        update={"engine": config.engine.model_copy(update={"decode_runs": False})}
    )
    _, a = _run(off)
    engine, b = _run(config)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.timeline, b.timeline, check_exact=True)
    drop = ("wall_time_s",)
    assert {k: v for k, v in a.summary.items() if k not in drop} == {
        k: v for k, v in b.summary.items() if k not in drop
    }
    return engine.decode_runs.steps


LOGNORMAL = {"kind": "lognormal", "mean": 300, "sigma": 0.8}
CASES = {
    "poisson, no prefix": (
        [],
        synthetic(60, LOGNORMAL, {"kind": "uniform", "min": 5, "max": 90}, 20.0),
    ),
    "shared prefix": ([], synthetic(60, LOGNORMAL, 40, 20.0, shared=256)),
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
}


@pytest.mark.parametrize("name", list(CASES))
def test_decode_runs_change_nothing(name):
    overrides, workload = CASES[name]
    taken = _same_results(make_config(*overrides, workload=workload))
    assert taken > 0  # the case exercises runs


def test_decode_runs_change_nothing_with_measured_tables(tmp_path):
    """The table cost model prices each run step with its own per-step call."""
    hardware = {"profile": "cpu-host", "cost_model": "table", "cost_table": tiny_table(tmp_path)}
    config = build_config(run_config(TINY, hardware, num_requests=20, output_tokens=40), "<t>")
    assert _same_results(config) > 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    rate=st.floats(1.0, 200.0),
    output=st.integers(1, 120),
    pool=st.integers(40, 400),
    swap=st.booleans(),
    shared=st.sampled_from([0, 64]),
    block=st.sampled_from([1, 16, 32]),
    budget=st.sampled_from([256, 4096]),
)
def test_decode_runs_change_nothing_anywhere(seed, rate, output, pool, swap, shared, block, budget):
    config = make_config(
        f"seed={seed}",
        f"engine.kv_pool_blocks={pool * 16 // block}",
        f"engine.block_tokens={block}",
        f"engine.max_batched_tokens={budget}",
        f"engine.preemption={'swap' if swap else 'recompute'}",
        workload=synthetic(
            25,
            {"kind": "uniform", "min": 1, "max": 600},
            {"kind": "uniform", "min": 1, "max": output},
            rate,
            shared,
        ),
    )
    _same_results(config)


def test_one_request_alone_decodes_at_the_cost_model_times():
    """A single request: every decode step is a run step, and its finish time is the
    prefill plus the cost model's decode step at each context, added up in order."""
    config = make_config(workload=synthetic(1, 1000, 200, 1.0))
    engine, result = _run(config)
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
def test_decode_steps_equal_one_step_at_a_time(sliding, tiny_model, cost_params: CostParams):
    model = tiny_model.model_copy(update={"sliding_window": sliding})
    cost = CostModel(model, cost_params)
    context = np.random.default_rng(3).integers(0, 5000, size=37)
    linear, attention, overhead = cost.decode_steps(context, 50)
    ones = np.ones(len(context), dtype=np.int64)
    for j in range(50):
        step = cost.step(ones, context + j, len(context))
        assert (step.linear_s, step.attention_s, step.overhead_s) == (
            linear,
            attention[j],
            overhead,
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
