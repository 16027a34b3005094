"""A closed-loop client (``workload.max_concurrency``, sim/cluster/feed.py ClosedLoopFeed).

Checked against what such a client does by definition: at most C requests in flight, request
i sent at max(its arrival, the (i - C)-th earliest time a request left), latencies counted
from the send; and against a lone request's closed form."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.errors import ConfigError
from sim.run import simulate
from sim.workload import build_requests
from tests.conftest import make_config


def _workload(n: int, arrival: dict, prompt=512, output=8, concurrency=None) -> dict:
    section = {
        "kind": "synthetic",
        "num_requests": n,
        "arrival": arrival,
        "prompt_tokens": prompt,
        "output_tokens": output,
    }
    if concurrency is not None:
        section["max_concurrency"] = concurrency
    return section


AT_ONCE = {"kind": "all_at_once"}


def _requests(config):
    return build_requests(config.workload, config.seed, block_tokens=config.engine.block_tokens)


def _replay(earliest: np.ndarray, left: np.ndarray, slots: int) -> np.ndarray:
    """A closed-loop client written plainly: request i is sent at its time or when the
    (i - slots)-th request to leave left (``left`` sorted), whichever is later."""
    free = [0.0] * slots + list(left)  # slots free at start, then as requests leave, in order
    return np.array([max(at, free[i]) for i, at in enumerate(earliest)])


def test_one_slot_serves_requests_one_after_another_each_as_if_alone():
    alone = simulate(make_config(workload=_workload(1, AT_ONCE))).requests
    served = simulate(make_config(workload=_workload(5, AT_ONCE, concurrency=1))).requests
    assert np.allclose(served["ttft_s"], alone["ttft_s"].iloc[0], rtol=1e-12)
    assert np.allclose(served["e2e_s"], alone["e2e_s"].iloc[0], rtol=1e-12)
    # each is sent when the one before it finished
    assert served["arrival_s"].iloc[0] == 0.0
    assert np.array_equal(served["arrival_s"].to_numpy()[1:], served["finish_s"].to_numpy()[:-1])


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(2, 10),
    longest_output=st.integers(1, 40),
    longest_prompt=st.integers(16, 3000),
    slots=st.integers(1, 4),
    poisson=st.booleans(),
    mode=st.sampled_from(["hbm", "offload"]),
    seed=st.integers(0, 1000),
    frontend=st.sampled_from([0.0, 3e-3]),
)
def test_the_client_keeps_at_most_c_in_flight_and_sends_as_slots_free(
    n, longest_output, longest_prompt, slots, poisson, mode, seed, frontend
):
    arrival = {"kind": "poisson", "rate": 20.0} if poisson else AT_ONCE
    workload = _workload(n, arrival, concurrency=slots)
    workload["output_tokens"] = {"kind": "uniform", "min": 1, "max": longest_output}
    workload["prompt_tokens"] = {"kind": "uniform", "min": 16, "max": longest_prompt}
    config = make_config(
        f"seed={seed}", workload=workload, kv={"mode": mode},
        engine={"check": True, "frontend_latency": frontend},
    )  # fmt: skip
    earliest = _requests(config).arrival_s
    result = simulate(config).requests
    sent, left = result["arrival_s"].to_numpy(), result["finish_s"].to_numpy()
    assert np.allclose(sent, _replay(earliest, np.sort(left), slots), rtol=0, atol=1e-12)
    for t in np.concatenate([sent, left]):  # in flight at every instant something changes
        assert ((sent <= t) & (t < left)).sum() <= slots
    assert (result["scheduled_s"] >= sent + frontend - 1e-12).all()  # through the front end
    assert np.allclose(result["ttft_s"], result["first_token_s"] - sent)


def test_a_rejected_request_frees_its_slot():
    # request 1 cannot fit the pool at all: rejected when sent, the client goes on
    config = make_config(
        "engine.kv_pool_blocks=64",
        workload=_workload(4, AT_ONCE, concurrency=1),
    )
    requests = _requests(config)
    requests.prompt_tokens[1] = 4096  # 256 blocks of 16 > the 64-block pool
    result = simulate(config, requests=requests).requests
    assert list(result["status"]) == ["finished", "rejected", "finished", "finished"]
    # sent when request 0 finished, and request 2 sent at the same moment
    assert result["arrival_s"].iloc[1] == result["arrival_s"].iloc[2] == result["finish_s"][0]


def test_the_callers_request_table_is_left_as_it_was():
    config = make_config(workload=_workload(6, AT_ONCE, concurrency=2))
    requests = _requests(config)
    before = requests.arrival_s.copy()
    result = simulate(config, requests=requests).requests
    assert np.array_equal(requests.arrival_s, before)
    assert result["arrival_s"].max() > 0


def test_a_cluster_shares_one_client():
    config = make_config(
        workload=_workload(12, AT_ONCE, output=16, concurrency=3),
        cluster={"instances": 2, "router": {"kind": "round_robin"}},
        engine={"check": True},
    )
    result = simulate(config).requests
    sent, left = result["arrival_s"].to_numpy(), result["finish_s"].to_numpy()
    for t in np.concatenate([sent, left]):
        assert ((sent <= t) & (t < left)).sum() <= 3
    assert np.allclose(sent, _replay(np.zeros(12), np.sort(left), 3), rtol=0, atol=1e-12)


@pytest.mark.parametrize("bad", [0, -2])
def test_max_concurrency_must_be_positive(bad):
    with pytest.raises(ConfigError, match="max_concurrency"):
        make_config(workload=_workload(2, AT_ONCE, concurrency=bad))


def test_a_disaggregated_cluster_counts_a_request_once_it_has_decoded():
    # prefill on one instance, decode on another: the slot frees at the decode's finish
    cluster = {
        "groups": [
            {"name": "p", "role": "prefill", "count": 1},
            {"name": "d", "role": "decode", "count": 1},
        ],
        "disaggregation": {"decider": "always"},
        "router": {"prefill": {"kind": "least_loaded"}, "decode": {"kind": "round_robin"}},
        "network": {"bandwidth": "50GB/s", "latency": "10us"},
    }
    config = make_config(workload=_workload(8, AT_ONCE, output=12, concurrency=2), cluster=cluster)
    result = simulate(config).requests
    sent, left = result["arrival_s"].to_numpy(), result["finish_s"].to_numpy()
    assert (result["status"] == "finished").all()
    assert np.allclose(sent, _replay(np.zeros(8), np.sort(left), 2), rtol=0, atol=1e-12)
