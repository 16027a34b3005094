"""``sim.observe.metrics`` request table and summary on a hand-built run with a rejected request."""

import numpy as np
import pytest

from sim.instance.timeline import Timeline
from sim.observe.metrics import request_frame, summarize
from sim.workload.requests import Requests

NAN = float("nan")


def test_throughput_and_latency_count_finished_requests_only():
    """Two finished requests and one rejected (at arrival): the throughputs over the 8 s run
    count the finished ones' tokens and requests only (30 out, 300 in, 2 requests), and the
    latency figures are theirs, computed by hand."""
    requests = Requests(
        arrival_s=np.array([0.0, 1.0, 2.0]),
        prompt_tokens=np.array([100, 200, 5000]),
        output_tokens=np.array([10, 20, 500]),
    )
    frame = request_frame(
        requests,
        scheduled_s=np.array([0.5, 1.5, NAN]),
        first_token_s=np.array([1.0, 2.0, NAN]),
        finish_s=np.array([3.0, 6.0, NAN]),
        preemptions=np.array([0, 1, 0]),
        reject_reason={2: "too long"},
    )
    assert frame.status.tolist() == ["finished", "finished", "rejected"]
    assert frame.tpot_s[:2].tolist() == pytest.approx([2.0 / 9, 4.0 / 19])
    s = summarize(frame, Timeline().to_frame(), 8.0)
    assert s["requests_finished"] == 2 and s["requests_rejected"] == 1
    assert s["rejected_reasons"] == {"too long": 1}
    assert s["output_tokens_per_s"] == pytest.approx(30 / 8)
    assert s["input_tokens_per_s"] == pytest.approx(300 / 8)
    assert s["requests_per_s"] == pytest.approx(2 / 8)
    assert s["ttft_mean_s"] == pytest.approx(1.0)
    assert s["e2e_mean_s"] == pytest.approx(4.0)
    assert s["preemptions"] == 1 and s["steps"] == 0
