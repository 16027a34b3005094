"""The step planner (sim/instance/step_planner.py): where it plans runs, and its prices are
the cost model's.

That its runs change nothing is tests/test_decode_runs.py's (every case with both planners).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sim.config import build_config
from sim.cost.roofline import CostModel
from sim.instance import step_planner as steprun
from sim.run import Simulation
from sim.workload import build_requests
from tests.conftest import make_config, synthetic
from tests.test_costtable import TINY, run_config, tiny_table


def _engine(config) -> Simulation:
    return Simulation(config, build_requests(config.workload, config.seed, block_tokens=16))


@pytest.mark.parametrize(
    ("model", "hardware"),
    [("llama-3-8b", "h100-sxm"), ("llama-2-7b", "h100-sxm"), ("qwen2.5-7b", "h200-sxm"),
     ("mixtral-8x7b", "h200-sxm"), ("llama-3-70b", "mi300x"), ("mistral-7b", "h100-sxm")],
)  # fmt: skip
def test_runs_without_prefix_caching_are_planned_a_step_at_a_time(model, hardware):
    """The bundled models' sums stay exact on their GPUs' pools (the largest: 4 KV heads
    on 141 GB), so their runs are planned here (mistral-7b's sliding window too)."""
    config = make_config(
        f"model={model}", f"hardware={hardware}", workload=synthetic(20, 300, 50, 5.0)
    )
    engine = _engine(config)
    assert steprun.exact(engine) and engine.decode_runs.planner is not None
    result = engine.run()
    assert engine.decode_runs.steps > len(result.timeline) // 2


@pytest.mark.parametrize("why", ["prefix caching", "no runs"])
def test_runs_with_prefix_caching_are_planned_in_pieces(why):
    """Prefix caching (cached blocks, evictions) leaves the runs to sim/instance/runs.py."""
    if why == "prefix caching":
        config = make_config(workload=synthetic(20, 300, 50, 5.0, shared=64))
    else:
        config = make_config("engine.decode_runs=false", workload=synthetic(5, 100, 10))
    engine = _engine(config)
    assert not steprun.applies(engine) or why == "no runs"
    assert engine.decode_runs.planner is None


@pytest.mark.parametrize(
    "why",
    ["measured tables", "inexact byte count", "odd FLOP count", "sums past 2**53"],
)
def test_steps_are_priced_by_the_cost_model_where_sums_could_be_inexact(why, tmp_path):
    """A cost model other than the roofline, or attention sums that could be inexact (a
    per-token KV size that is not a whole number of bytes, an odd FLOP count per pair, sums
    past 2**53: float sums whose order matters) price each step with the cost model's call."""
    if why == "measured tables":
        hardware = {
            "profile": "cpu-host",
            "cost_model": "table",
            "cost_table": tiny_table(tmp_path),
        }
        config = build_config(run_config(TINY, hardware, num_requests=5, output_tokens=10), "<t>")
    else:
        config = make_config(workload=synthetic(5, 100, 10))
    engine = _engine(config)
    if why == "inexact byte count":
        engine.cost.kv_bytes_per_token_layer = 4096.3
    elif why == "odd FLOP count":  # a half-integer pair count times it is not an integer
        engine.cost.attention_flops_per_pair = 8191.0
    elif why == "sums past 2**53":  # a whole pool's context times the bytes of a token
        engine.cost.kv_bytes_per_token_layer = float(2**53 // engine.kv.home.capacity)
    assert steprun.applies(engine) and not steprun.exact(engine)
    if why == "measured tables":  # as the engine builds it
        assert engine.decode_runs.planner is not None and not engine.decode_runs.planner.exact


@st.composite
def _sequences(draw) -> tuple[int, int, int, int]:
    """A running sequence (tokens this step, computed, prompt, generated), as the scheduler
    keeps them: it never computes past its known tokens."""
    prompt, generated = draw(st.integers(1, 20_000)), draw(st.integers(0, 300))
    computed = draw(st.integers(0, prompt + generated - 1))
    tokens = draw(st.sampled_from([0, 1, 1, 1, 2, 7, 300, 512]))
    return min(tokens, prompt + generated - computed), computed, prompt, generated


@settings(max_examples=200, deadline=None)
@given(
    batch=st.lists(_sequences(), min_size=1, max_size=40),
    efficiency=st.sampled_from([0.25, 1e-4]),  # reads-bound, FLOPs-bound decodes
    latency=st.sampled_from([0.0, 3e-6]),
    window=st.sampled_from([None, 64, 4096]),  # sliding-window attention
)
def test_a_steps_tally_is_the_batch_and_cost_models_to_the_bit(batch, efficiency, latency, window):
    """:meth:`StepPlanner.tally` on plain ints against the scheduler's batch arrays as the
    normal loop reads them (engine._record) and :meth:`CostModel.attention_time`."""
    engine = _engine(make_config(workload=synthetic(1, 10, 2)))
    params = dataclasses.replace(
        engine.cost.params, attention_efficiency=efficiency, attention_latency_s=latency
    )
    model = engine.cost.model.model_copy(update={"sliding_window": window})
    engine.cost = cost = CostModel(model, params)
    planner = steprun.StepPlanner(engine, limit=1)
    tokens, computed, prompt, generated = (list(column) for column in zip(*batch, strict=True))
    got = planner.tally(tokens, computed, prompt, generated)
    new, ctx, known = np.array(tokens), np.array(computed), np.array(prompt) + generated
    active = new > 0
    new, ctx, known, first = new[active], ctx[active], known[active], np.array(prompt)[active]
    decodes = int(((new == 1) & (ctx >= first)).sum())
    assert got.tokens == new.sum() and got.prefill == new.sum() - decodes
    assert got.sampled == (ctx + new == known).sum()
    assert got.reads == (-(-ctx // 16)).sum()
    assert got.attention == (cost.attention_time(new, ctx) if active.any() else 0.0)


@settings(max_examples=100, deadline=None)
@example(computed=[100, 3, 99], window=100)  # one at the window, one a step short of it
@given(
    computed=st.lists(st.integers(1, 200), min_size=1, max_size=30),
    window=st.sampled_from([None, 1, 16, 100]),
)
def test_decode_steps_attend_up_to_the_window(computed, window):
    """The attended-token sum a decode stretch starts from and grows by, step after step,
    against each step's sum taken directly."""
    engine = _engine(make_config(workload=synthetic(1, 10, 2)))
    model = engine.cost.model.model_copy(update={"sliding_window": window})
    engine.cost = CostModel(model, engine.cost.params)
    planner = steprun.StepPlanner(engine, limit=1)
    planner.ids, planner.computed = list(range(len(computed))), computed
    spans, growth, full = planner._spans()
    for step in range(250):
        contexts = np.array(computed) + step
        attended = np.minimum(contexts, window) if window else contexts
        assert spans == (attended + 1).sum(), step
        spans += growth  # as StepPlanner._decode_steps goes on
        growth -= full.get(step + 1, 0)
