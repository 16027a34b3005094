"""docs/outputs.md names every file, column and key that kvsim writes (so it cannot drift)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sim.config.loader import load_config
from sim.replay import CSV_COLUMNS
from sim.run import simulate
from sim.rundir import write_run

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "outputs.md"
QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.yaml"
SMALL = (
    "workload={kind: synthetic, num_requests: 6, arrival: {kind: all_at_once}, "
    "prompt_tokens: 256, output_tokens: 4, shared_prefix_tokens: 64}"
)
MODES = (
    ["kv.mode=hbm", "engine.preemption=swap"],
    ["kv.mode=offload"],
    ["kv={mode: dram_centric, access: {kind: sparse}}", "engine.kv_heat=true"],
)


def documented(heading: str, anywhere: bool = False) -> set[str]:
    """Backticked names in the first cell (or any cell) of the tables under ``heading``."""
    names: set[str] = set()
    inside = False
    for line in DOC.read_text().splitlines():
        if line.startswith("#"):
            inside = heading in line
            continue
        if inside and line.startswith("| ") and not line.startswith("|---"):
            cells = line.split(" | ") if anywhere else [line.split(" | ")[0]]
            for cell in cells:
                names |= set(re.findall(r"`([^`]+)`", cell))
    assert names, f"docs/outputs.md has no table under a heading with {heading!r}"
    return names


def _flat(summary: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in summary.items():
        keys.add(prefix + key)
        if isinstance(value, dict) and key != "rejected_reasons":
            keys |= _flat(value, f"{prefix}{key}.")
        if key == "instances":  # a cluster's: beside its 4 own keys, each entry's are above
            own = {"index", "group", "hardware", "requests", "prefills"}
            keys |= {k for entry in value for k in _flat(entry)} - own
    return keys


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    """Run directories of small runs in every KV mode, and one from a trace workload."""
    tmp = tmp_path_factory.mktemp("runs")
    trace = tmp / "tiny.jsonl"
    rows = [{"timestamp": 1000 * i, "input_length": 600, "output_length": 3,
             "hash_ids": [0, i + 1]} for i in range(3)]  # fmt: skip
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [[SMALL, *mode] for mode in MODES]
    overrides.append([f"workload={{kind: trace, format: mooncake, path: {trace}}}"])
    pool = "{capacity: 1GiB, bandwidth: 100GB/s}"
    overrides.append([SMALL, f"cluster={{instances: 2, kv_pool: {pool}}}"])
    split = (
        "cluster={groups: [{name: p, role: prefill}, {name: d, role: decode}], "
        "disaggregation: {decider: always}}"
    )
    overrides.append([SMALL, split])
    overrides[0].append("metrics={slo: {ttft: 1s, tpot: 50ms}}")
    overrides.append([SMALL, "engine.tensor_parallel_size=2"])  # comm_s
    out = []
    for i, sets in enumerate(overrides):
        result = simulate(load_config(QUICKSTART, sets))
        out.append(write_run(result, tmp / f"run{i}"))
    return out


def test_run_directory_files(runs):
    files = {p.name for run in runs for p in run.iterdir()}
    assert files <= documented("A run directory")


def test_summary_keys(runs):
    keys = set().union(*(_flat(json.loads((r / "summary.json").read_text())) for r in runs))
    assert "workload.rows_in_file" in keys  # the trace run's load report is there
    expected = documented("`summary.json`")
    assert not keys - expected, f"undocumented summary.json keys: {sorted(keys - expected)}"


@pytest.mark.parametrize("name", ["requests.parquet", "timeline.parquet", "kv_heat.parquet"])
def test_table_columns(runs, name):
    tables = [pd.read_parquet(r / name) for r in runs if (r / name).is_file()]
    assert tables, f"no run wrote {name}"
    columns = set().union(*(table.columns for table in tables))
    missing = columns - documented(f"`{name}`")
    assert not missing, f"undocumented {name} columns: {sorted(missing)}"


def test_sweep_files_and_results_columns(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        f"base: {QUICKSTART}\nset:\n  workload.num_requests: 4\ngrid:\n  kv.mode: [hbm, offload]\n"
    )
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "sim", "sweep", str(sweep), "--out", str(out), "--workers", "1"]
    subprocess.run([*cmd, "--quiet"], check=True, capture_output=True)
    listed = {name.split("/")[0] for name in documented("A sweep directory")}
    assert {p.name for p in out.iterdir()} <= listed
    results = pd.read_parquet(out / "results.parquet")
    axes = json.loads((out / "sweep.json").read_text())["axes"]
    summary = documented("`summary.json`")
    missing = set(results.columns) - set(axes) - summary - documented("`results.parquet`")
    assert not missing, f"undocumented results.parquet columns: {sorted(missing)}"


def test_replay_columns():
    assert set(CSV_COLUMNS) <= documented("kvsim replay")


def _report_keys() -> set[str]:
    """String keys of the dicts validation/report.py builds, and of report[...] assignments."""
    tree = ast.parse((ROOT / "validation" / "report.py").read_text())
    keys = set()
    for func in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        if func.name in ("summary_markdown", "write_report", "step_kinds", "measured_steps"):
            continue  # Markdown, file names, masks and a DataFrame: not report keys
        updates = {id(k.value) for k in ast.walk(func) if isinstance(k, ast.keyword)}
        for node in ast.walk(func):
            if isinstance(node, ast.Dict) and id(node) not in updates:
                keys |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
                        keys.add(target.slice.value)
    return keys


def test_validation_report_keys():
    keys = _report_keys()
    assert {"step_mape", "e2e_error", "modes"} <= keys  # the walk found the report
    names = {n.rsplit(".", 1)[-1] for n in documented("`report.json`", anywhere=True)}
    assert not keys - names, f"undocumented report.json keys: {sorted(keys - names)}"


def test_validation_files():
    source = (ROOT / "validation" / "report.py").read_text()
    written = set(re.findall(r'out / "([a-z_.]+)"', source))
    assert written and written <= documented("kvsim validate")
