"""The serving front end (``engine.frontend_latency``, ``frontend_token_latency``): a request
reaches the scheduler its front-end time after it was sent, in the order sent, and its
latencies count from the send. Checked against a run without it, where the engine sees the
same requests that much later: a hand-computed shift."""

from __future__ import annotations

import numpy as np
import pytest

from sim.errors import ConfigError
from sim.run import simulate
from sim.workload import build_requests
from tests.conftest import make_config

FRONT = ("engine.frontend_latency=10ms", "engine.frontend_token_latency=2us")


def _workload(n: int, prompt: int = 1000, concurrency: int | None = None) -> dict:
    section = {
        "kind": "synthetic",
        "num_requests": n,
        "arrival": {"kind": "all_at_once"},
        "prompt_tokens": prompt,
        "output_tokens": 3,
    }
    if concurrency is not None:
        section["max_concurrency"] = concurrency
    return section


def test_one_request_alone_waits_out_the_front_end_then_runs_as_before():
    """TTFT = 10 ms + 1000 tokens x 2 us + the engine's own TTFT, exactly."""
    alone = simulate(make_config(workload=_workload(1))).requests
    front = simulate(make_config(*FRONT, workload=_workload(1))).requests
    latency = 10e-3 + 1000 * 2e-6
    assert front.arrival_s[0] == 0.0 and front.scheduled_s[0] == latency
    assert front.ttft_s[0] == pytest.approx(alone.ttft_s[0] + latency, rel=1e-12)
    assert front.e2e_s[0] == pytest.approx(alone.e2e_s[0] + latency, rel=1e-12)


def test_a_closed_loop_slot_is_held_through_the_front_end():
    """One slot: each request is sent when the one before it finished, reaches the engine
    12 ms later, and runs alone as before: every latency is the lone one plus 12 ms."""
    alone = simulate(make_config(workload=_workload(1))).requests
    served = simulate(make_config(*FRONT, workload=_workload(4, concurrency=1))).requests
    latency = 12e-3
    sent, finish = served.arrival_s.to_numpy(), served.finish_s.to_numpy()
    assert sent[0] == 0.0 and np.array_equal(sent[1:], finish[:-1])
    np.testing.assert_allclose(served.scheduled_s - sent, latency, rtol=1e-9)
    np.testing.assert_allclose(served.ttft_s, alone.ttft_s[0] + latency, rtol=1e-9)


def test_requests_reach_the_scheduler_in_the_order_sent():
    """A long prompt sent first and a short one 1 ms later: the short one's own front-end
    time would bring it first (10.2 ms + 1 ms < 10 ms + 8 ms), but it waits for the long
    one, and both reach the scheduler at 18 ms."""
    config = make_config(*FRONT, workload=_workload(2))
    requests = build_requests(config.workload, config.seed, block_tokens=16)
    requests.arrival_s[:] = [0.0, 1e-3]
    requests.prompt_tokens[:] = [4000, 100]
    result = simulate(config, requests=requests).requests
    np.testing.assert_allclose(result.scheduled_s, [18e-3, 18e-3], rtol=1e-12)


def test_a_cluster_group_cannot_set_its_own_front_end():
    cluster = {"groups": [{"name": "a", "count": 1, "engine": {"frontend_latency": "5ms"}}]}
    with pytest.raises(ConfigError) as error:
        make_config(workload=_workload(2), cluster=cluster)
    message = str(error.value)
    assert "cluster.groups.0.engine.frontend_latency" in message and "one front end" in message


def test_an_implausible_front_end_names_the_key():
    with pytest.raises(ConfigError) as error:
        make_config("engine.frontend_latency=20s", workload=_workload(1))
    assert "engine.frontend_latency" in str(error.value) and "at most 10 s" in str(error.value)
