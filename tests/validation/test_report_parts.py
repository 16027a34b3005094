"""Report arithmetic against hand-computed figures; torch stays out of ``sim``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from sim.config.loader import load_hardware
from validation.profile import fmt_bandwidth, fmt_seconds, set_value

STEPS = pd.DataFrame(
    {
        "step_s": [0.10, 0.02, 0.03, 0.05],
        "prefill_tokens": [100, 0, 0, 40],
        "decode_tokens": [0, 4, 4, 3],
        "h2d_bytes": [0, 0, 1000, 0],
        "d2h_bytes": [0, 0, 0, 0],
    }
)


def test_errors_by_hand():
    pytest.importorskip("torch")
    from validation.report import errors

    simulated = np.array([0.11, 0.02, 0.024, 0.06])  # APE: 10%, 0%, 20%, 20%
    report = errors(STEPS, simulated, measured_total=0.20, sim_total=0.23)
    assert report["step_mape"] == pytest.approx(0.125)
    assert report["e2e_error"] == pytest.approx(0.15)
    kinds = report["by_kind"]
    assert kinds["prefill"]["steps"] == 1 and kinds["prefill"]["step_mape"] == pytest.approx(0.1)
    assert kinds["decode"]["steps"] == 2 and kinds["decode"]["step_mape"] == pytest.approx(0.1)
    assert kinds["mixed"]["step_mape"] == pytest.approx(0.2)
    assert kinds["with_transfers"]["steps"] == 1


def test_measured_steps_take_median_or_minimum_per_step():
    pytest.importorskip("torch")
    from validation.engine import EngineRun
    from validation.report import measured_steps

    runs = []
    for times in ([1.0, 5.0], [3.0, 4.0], [2.0, 9.0]):
        frame = pd.DataFrame({"time_s": [0.0, 1.0], "step_s": times, "step_tokens": [8, 1]})
        runs.append(EngineRun(frame, sum(times), {}))
    assert list(measured_steps(runs).step_s) == [2.0, 5.0]
    assert list(measured_steps(runs, "min").step_s) == [1.0, 4.0]


def test_replay_adds_link_time_to_the_cost_model():
    pytest.importorskip("torch")
    from sim.cost.roofline import CostModel, CostParams
    from validation.report import replay
    from validation.scenario import scenario_config

    hw = load_hardware("cpu-host")
    config = scenario_config(hw, "validate", "cpu", "dram_centric", quick=True)
    steps = pd.DataFrame({"new_tokens": [[4, 1]], "context": [[0, 30]], "sampled": [2],
                          "h2d_bytes": [4e6], "d2h_bytes": [0]})  # fmt: skip
    cost = CostModel(config.model, CostParams.from_hardware(hw))
    compute = cost.step(np.array([4, 1]), np.array([0, 30]), 2).total_s
    link = 1e-6 + 4e6 / 40e9  # cpu-host: 1 us latency, 40 GB/s
    assert replay(config, hw, steps)[0] == pytest.approx(compute + link)


def test_units_render_and_parse_back():
    from sim.units import BANDWIDTH, DURATION

    for value in (5.62e-6, 4.2e-3, 999.8e-9, 1.5):
        assert DURATION.parse(fmt_seconds(value)) == pytest.approx(value, rel=1e-3)
    assert BANDWIDTH.parse(fmt_bandwidth(24.38e9)) == pytest.approx(24.38e9, rel=1e-3)
    assert fmt_seconds(0.0) == "0us"


def test_set_value_replaces_or_adds_a_key():
    text = "name: x\nlink:\n  kind: memcpy\n  h2d: 1GB/s   # old\nssd:\n  read: 1GB/s\n"
    text = set_value(text, "link", "h2d", "5GB/s", "new")
    text = set_value(text, "link", "latency", "2us", "added")
    assert "  h2d: 5GB/s" in text and "# new" in text and "# old" not in text
    assert text.index("latency: 2us") < text.index("ssd:")


def test_sim_and_the_cli_never_import_torch():
    code = (
        "import sys; import sim.cli, sim.run, sim.cost.roofline, validation.commands, "
        "validation.opsfit, validation.calibrate; sim.cli.build_parser(); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
