"""Trace workloads end to end through ``kvsim run`` (the shipped experiment configs).

The Mooncake conversation trace runs in ``hbm`` and ``offload`` mode on its first requests,
to stay within a few seconds.
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


@pytest.mark.parametrize("mode", ["hbm", "offload"])
def test_mooncake_conversation_runs_end_to_end(traces_env: Path, tmp_path: Path, mode: str) -> None:
    out = tmp_path / "run"
    argv = [
        "run",
        str(CONFIGS / "mooncake-conversation.yaml"),
        "--out",
        str(out),
        "--set",
        "workload.max_requests=40",
        "--set",
        f"kv.mode={mode}",
    ]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests_finished"] + summary["requests_rejected"] == 40
    assert summary["requests_finished"] == 40
    assert summary["prefix_hit_tokens"] > 0  # every request shares the trace's block 0
    # offload writes computed prompt blocks through to DRAM; hbm moves nothing
    assert (summary["d2h_bytes"] > 0) == (mode == "offload")
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
