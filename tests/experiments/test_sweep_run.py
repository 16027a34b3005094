"""Running sweeps: results.parquet, failures, resume, SIGTERM mid-way, point time limits."""

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

import experiments
from experiments import pool, store
from experiments.runner import run_sweep
from experiments.sweep import load_sweep
from experiments.tasks import Limits
from sim.cli import main
from sim.rundir import RUN_FILES
from tests.conftest import REPO
from tests.experiments.sweep_helpers import (
    FAST_BASE,
    HANG_VAR,
    hanging_run_task,
    small_sweep,
    write_sweep,
)

KVSIM = [sys.executable, "-m", "sim"]


def test_results_have_one_row_per_point_with_axes_seed_summary_status(tmp_path):
    sweep = load_sweep(small_sweep(tmp_path))
    results = run_sweep(sweep, tmp_path / "out", Limits(workers=1), progress=False)
    assert list(results.columns[:5]) == [
        "point_id", "workload.num_requests", "kv.mode", "kv.access", "seed",
    ]  # fmt: skip
    assert list(results.columns[-2:]) == ["status", "error"]
    assert results.attrs["axes"] == ["workload.num_requests", "kv.mode", "kv.access"]
    assert list(results.point_id) == [p.point_id for p in sweep.points]
    assert (results.status == "done").all() and (results.error == "").all()
    assert list(results["kv.access"][:2]) == ["full", "full"]
    assert results["kv.access"][2].startswith('{"kind":"sparse"')
    for _, row in results.iterrows():
        run = store.run_dir(tmp_path / "out", row.point_id)
        assert sorted(p.name for p in run.iterdir()) == sorted(RUN_FILES)
        summary = json.loads((run / "summary.json").read_text())
        for key, value in summary.items():
            if isinstance(value, dict):
                assert json.loads(row[key]) == value
            elif value is None:
                assert pd.isna(row[key])
            else:
                assert row[key] == value
    loaded = experiments.load(tmp_path / "out")
    pd.testing.assert_frame_equal(loaded, pd.read_parquet(tmp_path / "out" / "results.parquet"))
    assert loaded.attrs["axes"] == results.attrs["axes"]


def test_a_failing_point_is_recorded_and_the_others_finish(tmp_path, capsys):
    trace = {"kind": "trace", "format": "mooncake", "path": "no-such-trace.jsonl"}
    sweep = {"base": FAST_BASE, "grid": {"workload": [FAST_BASE["workload"], trace]},
             "seeds": [0, 1]}  # fmt: skip
    path = write_sweep(tmp_path, sweep)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--workers", "2", "--quiet"]) == 1
    assert "2 done, 2 failed" in capsys.readouterr().out
    results = experiments.load(out)
    assert list(results.status) == ["done", "done", "failed", "failed"]
    failed = results[results.status == "failed"]
    assert failed.error.str.contains("trace file 'no-such-trace.jsonl' not found").all()
    assert failed.output_tokens_per_s.isna().all()
    detail = json.loads((out / "failures" / f"{failed.point_id.iloc[0]}.json").read_text())
    assert "Traceback" in detail["traceback"]


def test_resume_skips_finished_points_and_reruns_failed_ones(tmp_path, capsys):
    path = small_sweep(tmp_path)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    assert main(["sweep", str(path), "--out", str(out), "--quiet"]) == 2
    assert "already holds a sweep; pass --resume" in capsys.readouterr().err
    first = store.run_dir(out, experiments.load(out).point_id[0])
    stamp = (first / "summary.json").stat().st_mtime_ns
    other = store.run_dir(out, experiments.load(out).point_id[1])
    for child in other.iterdir():
        child.unlink()
    other.rmdir()
    store.record_failure(out, other.name, "earlier error", "")
    assert store.results_frame(out).status.tolist() == ["done", "failed"] + ["done"] * 6
    assert main(["sweep", str(path), "--out", str(out), "--resume", "--quiet"]) == 0
    assert "8 done, 0 failed" in capsys.readouterr().out
    assert (first / "summary.json").stat().st_mtime_ns == stamp
    assert other.is_dir() and not (out / "failures" / f"{other.name}.json").exists()


def _finished(out):
    folder = out / "points"
    return (
        sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
        if folder.is_dir()
        else []
    )


def test_a_sweep_killed_mid_way_and_resumed_runs_every_point_exactly_once(tmp_path):
    closed = {"num_requests": 24, "output_tokens": 96, "arrival": {"kind": "all_at_once"}}
    base = {**FAST_BASE, "workload": {**FAST_BASE["workload"], **closed}}
    sweep = {"base": base, "grid": {"engine.max_num_seqs": [8, 12, 16, 24]}, "seeds": [0, 1, 2]}
    path = write_sweep(tmp_path, sweep)
    out = tmp_path / "out"
    command = [*KVSIM, "sweep", str(path), "--out", str(out), "--workers", "2", "--quiet"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while len(_finished(out)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err and "--resume" in err
    before = {name: (out / "points" / name / "summary.json").stat().st_mtime_ns
              for name in _finished(out)}  # fmt: skip
    assert 2 <= len(before) < 12
    partial = experiments.load(out)
    assert set(partial.status) == {"done", "pending"}
    assert (partial.status == "done").sum() == len(before)

    resumed = subprocess.run([*command, "--resume"], cwd=REPO, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    results = experiments.load(out)
    assert (results.status == "done").all() and results.point_id.is_unique
    assert _finished(out) == sorted(results.point_id)
    assert not [p for p in (out / "points").iterdir() if p.name.startswith(".")]
    for name, stamp in before.items():
        assert (out / "points" / name / "summary.json").stat().st_mtime_ns == stamp


def test_a_point_past_its_time_limit_is_stopped_and_recorded(tmp_path, monkeypatch):
    sweep = load_sweep(small_sweep(tmp_path))
    monkeypatch.setattr(pool, "run_task", hanging_run_task)
    monkeypatch.setenv(HANG_VAR, sweep.points[1].point_id)
    results = run_sweep(sweep, tmp_path / "out", Limits(workers=2, timeout_s=1.5), progress=False)
    assert results.status.tolist() == ["done", "failed"] + ["done"] * 6
    assert results.error[1] == "timed out after 1.5 s; the point was stopped"


@pytest.mark.parametrize("flags, message", [
    (["--workers", "0"], "--workers must be at least 1"),
    (["--point-timeout", "-1"], "--point-timeout must be positive"),
])  # fmt: skip
def test_bad_sweep_flags_are_one_line(tmp_path, capsys, flags, message):
    path = small_sweep(tmp_path)
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), *flags]) == 2
    assert message in capsys.readouterr().err


def test_the_default_uses_every_core():
    assert pool.default_workers() == len(os.sched_getaffinity(0))
