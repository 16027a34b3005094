"""The HBM-resident engine against closed forms and invariants."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cost.roofline import CostModel, CostParams
from sim.memory.hbm_plan import plan_hbm
from sim.run import Simulation, simulate
from sim.rundir import write_run
from sim.workload.requests import Requests
from tests.conftest import hbm_parts, make_config


def closed_batch(n, prompt, output, *overrides):
    workload = {
        "kind": "synthetic",
        "num_requests": n,
        "arrival": {"kind": "all_at_once"},
        "prompt_tokens": prompt,
        "output_tokens": output,
    }
    return make_config(*overrides, workload=workload)


def cost_of(config):
    return CostModel(config.model, CostParams.from_hardware(config.hardware), config.kv_dtype_bytes)


def test_one_request_alone_ttft_and_tpot_are_the_cost_model_times():
    prompt, output = 1000, 50
    config = closed_batch(1, prompt, output)
    result = simulate(config)
    cost = cost_of(config)
    row = result.requests.iloc[0]
    assert row.ttft_s == pytest.approx(cost.prefill_time(prompt), rel=1e-12)
    decode = [cost.decode_time(np.array([prompt + i])) for i in range(output - 1)]
    assert row.tpot_s == pytest.approx(sum(decode) / (output - 1), rel=1e-12)
    assert result.summary["steps"] == output


def test_chunked_prefill_splits_a_long_prompt_by_the_token_budget():
    config = closed_batch(1, 5000, 2, "engine.max_batched_tokens=2048")
    result = simulate(config)
    cost = cost_of(config)
    chunks = [(2048, 0), (2048, 2048), (904, 4096)]
    expected = sum(
        cost.step(np.array([n]), np.array([c]), sampled=int(c + n == 5000)).total_s
        for n, c in chunks
    )
    assert result.requests.ttft_s.iloc[0] == pytest.approx(expected, rel=1e-12)
    assert list(result.timeline.step_tokens) == [2048, 2048, 904, 1]


def test_without_chunked_prefill_a_prompt_waits_for_a_step_it_fits_whole():
    config = closed_batch(
        2, 600, 2, "engine.chunked_prefill=false", "engine.max_batched_tokens=1000"
    )
    result = simulate(config)
    # A's 600 tokens leave 400: B waits and prefills whole in the next step, beside A's decode
    assert list(result.timeline.step_tokens) == [600, 601, 1]
    chunked = simulate(closed_batch(2, 600, 2, "engine.max_batched_tokens=1000"))
    assert list(chunked.timeline.step_tokens) == [1000, 201, 1]  # B split 400 + 200


def test_equal_requests_decode_together():
    config = closed_batch(8, 256, 20)
    result = simulate(config)
    cost = cost_of(config)
    # one prefill step of 8 x 256 tokens, then 19 decode steps of batch 8
    assert list(result.timeline.batch_size) == [8] * 20
    decode = [cost.decode_time(np.full(8, 256 + i)) for i in range(19)]
    assert result.requests.tpot_s.to_numpy() == pytest.approx(np.full(8, sum(decode) / 19))


def test_throughput_grows_with_batch_until_pool_is_full_then_preemptions():
    figures = {}
    for batch in (1, 2, 4, 8, 32):
        config = closed_batch(batch, 2048, 512, "hardware.hbm.capacity=24GiB")
        result = simulate(config)
        figures[batch] = (result.summary["output_tokens_per_s"], result.summary["preemptions"])
        assert result.summary["requests_finished"] == batch
    pool_tokens = plan_hbm(config, cost_of(config)).pool_blocks * 16
    assert 8 * 2560 < pool_tokens < 32 * 2560  # the pool holds 8 sequences, not 32
    rates = [figures[b][0] for b in (1, 2, 4, 8)]
    assert rates == sorted(rates) and rates[-1] > 4 * rates[0]
    assert all(figures[b][1] == 0 for b in (1, 2, 4, 8))
    assert figures[32][1] > 0


def test_requests_that_can_never_fit_are_rejected_with_a_reason():
    config = closed_batch(2, 4096, 64, "hardware.hbm.capacity=20GiB")
    pool_tokens = plan_hbm(config, cost_of(config)).pool_blocks * 16
    too_long = closed_batch(1, pool_tokens + 16, 10, "hardware.hbm.capacity=20GiB")
    result = simulate(too_long)
    assert result.requests.status.tolist() == ["rejected"]
    assert result.summary["rejected_reasons"] == {"exceeds_kv_pool": 1}
    no_chunk = closed_batch(
        1, 5000, 10, "engine.chunked_prefill=false", "engine.max_batched_tokens=4096"
    )
    reason = simulate(no_chunk).requests.reject_reason.iloc[0]
    assert reason == "exceeds_max_batched_tokens_without_chunked_prefill"


def test_model_too_large_for_hbm_is_a_config_error():
    from sim.errors import ConfigError

    config = make_config(model="llama-3-70b")
    with pytest.raises(ConfigError, match="model 'llama-3-70b' does not fit"):
        Simulation(config, None)


class InvariantEngine(Simulation):
    """Checks block accounting after every step."""

    def __init__(self, *args):
        super().__init__(*args)
        complete = self.scheduler.complete

        def checked(batch, now):
            done = complete(batch, now)
            s = self.scheduler
            live = s.running
            expected = -(-s.computed[live] // config_block(self))
            assert np.array_equal(s.kv.held[live], expected)
            assert s.kv.home.resident - len(s.kv.home.evictable) == s.kv.held.sum()
            assert len(live) <= self.config.engine.max_num_seqs
            return done

        self.scheduler.complete = checked


def config_block(engine):
    return engine.config.engine.block_tokens


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity_gib=st.integers(20, 30),
    n=st.integers(1, 40),
    prompt_max=st.integers(16, 6000),
    output_max=st.integers(1, 300),
    rate=st.floats(0.5, 50),
    max_seqs=st.integers(1, 64),
    budget=st.sampled_from([512, 2048, 8192]),
    chunked=st.booleans(),
    block=st.sampled_from([8, 16, 32]),
    seed=st.integers(0, 2**16),
)
def test_hbm_never_above_capacity_and_every_request_ends(
    capacity_gib, n, prompt_max, output_max, rate, max_seqs, budget, chunked, block, seed
):
    workload = {
        "kind": "synthetic",
        "num_requests": n,
        "arrival": {"kind": "poisson", "rate": rate},
        "prompt_tokens": {"kind": "uniform", "min": 1, "max": prompt_max},
        "output_tokens": {"kind": "uniform", "min": 1, "max": output_max},
    }
    config = make_config(
        f"hardware.hbm.capacity={capacity_gib}GiB",
        f"engine.max_num_seqs={max_seqs}",
        f"engine.max_batched_tokens={budget}",
        f"engine.chunked_prefill={str(chunked).lower()}",
        f"engine.block_tokens={block}",
        f"seed={seed}",
        workload=workload,
    )
    from sim.workload import build_requests

    result = InvariantEngine(config, build_requests(config.workload, config.seed)).run()
    t = result.timeline
    parts = hbm_parts(t)
    hbm = config.hardware.hbm
    visible = hbm.capacity - hbm.driver_reserve  # what torch sees: free is counted from it
    assert (parts <= visible).all()
    assert (t.hbm_kv_bytes <= t.hbm_kv_pool_bytes).all()
    assert np.allclose(parts + t.hbm_free_bytes, visible)
    assert (t.step_tokens <= budget).all()
    assert set(result.requests.status) <= {"finished", "rejected"}
    rejected = result.requests[result.requests.status == "rejected"]
    assert (rejected.reject_reason != "").all()
    finished = result.requests[result.requests.status == "finished"]
    assert (finished.first_token_s >= finished.arrival_s).all()
    assert (finished.finish_s >= finished.first_token_s).all()


def test_same_seed_gives_identical_files(tmp_path):
    config = make_config("seed=7")
    a = write_run(simulate(config), tmp_path / "a")
    b = write_run(simulate(config), tmp_path / "b")
    for name in ("requests.parquet", "timeline.parquet", "config.resolved.yaml"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    other = simulate(make_config("seed=8")).requests
    assert not other.arrival_s.equals(pd.read_parquet(a / "requests.parquet").arrival_s)


def test_a_request_exactly_at_the_length_limit_runs_and_one_token_more_is_rejected():
    """``max_model_len`` bounds prompt + output: 100 + 20 = 120 tokens fit a limit of 120
    and run to the end; 101 + 20 does not, and is rejected with that reason."""
    config = make_config("engine.max_model_len=120")
    requests = Requests(np.zeros(2), np.array([100, 101]), np.array([20, 20]))
    result = Simulation(config, requests).run()
    assert result.requests.status.tolist() == ["finished", "rejected"]
    assert result.requests.reject_reason.tolist() == ["", "exceeds_max_model_len"]
