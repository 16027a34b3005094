"""Goodput against latency targets (``metrics.slo``), counted by hand on a small table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.config.loader import build_config
from sim.observe.metrics import goodput
from sim.run import simulate

FRAME = pd.DataFrame(
    {
        "status": ["finished", "finished", "finished", "finished", "rejected"],
        "ttft_s": [0.5, 2.5, 1.0, 0.1, np.nan],
        "tpot_s": [0.05, 0.01, 0.2, np.nan, np.nan],  # the 4th: one output token
    }
)


def test_goodput_counts_requests_meeting_both_targets():
    # met: #0 (both), #3 (ttft, no tpot); missed: #1 ttft, #2 tpot, #4 rejected
    assert goodput(FRAME, 10.0, ttft=2.0, tpot=0.1) == {"goodput_rps": 0.2, "slo_attainment": 0.4}


def test_a_missing_target_always_holds():
    assert goodput(FRAME, 4.0, ttft=None, tpot=0.1)["goodput_rps"] == 3 / 4.0
    assert goodput(FRAME, 4.0, ttft=2.0, tpot=None)["slo_attainment"] == 3 / 5


def test_a_run_with_an_slo_reports_it_and_one_without_does_not():
    data = {
        "model": "llama-3-8b",
        "hardware": "h100-sxm",
        "workload": {"kind": "synthetic", "num_requests": 40, "prompt_tokens": 512,
                     "output_tokens": 32, "arrival": {"kind": "poisson", "rate": 10}},
    }  # fmt: skip
    plain = simulate(build_config(data)).summary
    assert "goodput_rps" not in plain
    result = simulate(build_config({**data, "metrics": {"slo": {"ttft": "25ms"}}}))
    r = result.requests
    expected = int(((r.status == "finished") & (r.ttft_s <= 0.025)).sum())
    assert 0 < expected < len(r)
    assert result.summary["goodput_rps"] == expected / result.summary["sim_time_s"]
    assert result.summary["slo_attainment"] == expected / len(r)
