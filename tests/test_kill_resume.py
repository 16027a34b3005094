"""No result lost: runs and sweeps killed with SIGKILL leave only complete files.

A ``kvsim run`` or ``kvsim sweep`` subprocess (its whole process group) is killed at a
seeded random moment: before or during its work, or while it writes its files. Every file
then present must be complete (parquet, JSON and YAML all readable; a run directory holds
all its files), temporary files are hidden ``.NAME.*`` siblings that the next writer
removes, and ``kvsim sweep --resume`` finishes the rest, running every point exactly once.
An output folder that cannot be written is refused before anything runs.

``KVSIM_KILL_ROUNDS`` sets the rounds per test (default 2; e.g. 20 locally).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import sim.rundir
from experiments import store
from sim.cli import main
from sim.rundir import RUN_FILES
from tests.conftest import REPO

ROUNDS = int(os.environ.get("KVSIM_KILL_ROUNDS", "2"))
BASE = {
    "seed": 0,
    "model": "llama-3-8b",
    "hardware": "h100-sxm",
    "workload": {
        "kind": "synthetic",
        "num_requests": 30,
        "arrival": {"kind": "poisson", "rate": 50.0},
        "prompt_tokens": {"kind": "uniform", "min": 128, "max": 1024},
        "output_tokens": {"kind": "uniform", "min": 8, "max": 64},
    },
    "engine": {"max_num_seqs": 16, "max_batched_tokens": 2048},
    "kv": {"mode": "offload"},
}
SWEEP = {
    "base": "base.yaml",
    "grid": {"kv.eviction": ["lru", "fifo", "s3fifo"], "engine.max_num_seqs": [4, 16]},
    "seeds": [0, 1],
}


def write_inputs(folder: Path) -> None:
    """``base.yaml`` and ``sweep.yaml`` in ``folder``."""
    (folder / "base.yaml").write_text(yaml.safe_dump(BASE))
    (folder / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    """``python -m sim ARGS`` in its own process group (SIGKILL takes its workers too)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "sim", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def kill_when(proc: subprocess.Popen, ready, delay: float, limit: float = 120.0) -> None:
    """SIGKILL the process group ``delay`` s after ``ready()`` holds (or after it exits)."""
    deadline = time.monotonic() + limit
    while proc.poll() is None and not ready() and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(delay)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def hidden(path: Path) -> bool:
    return path.name.startswith(".")


def assert_readable(path: Path) -> None:
    """A whole file: parquet, JSON or YAML that parses."""
    if path.suffix == ".parquet":
        pd.read_parquet(path)
    elif path.suffix == ".json":
        json.loads(path.read_text())
    elif path.suffix == ".yaml":
        yaml.safe_load(path.read_text())


def assert_run_dir(path: Path) -> None:
    """A complete run directory: every run file, each readable."""
    assert sorted(p.name for p in path.iterdir()) == sorted(RUN_FILES), path
    for name in RUN_FILES:
        assert_readable(path / name)


def assert_complete(root: Path) -> None:
    """Every visible file under ``root`` is whole; temporary entries are hidden."""
    for path in root.rglob("*"):
        if any(hidden(p) for p in path.relative_to(root).parents if str(p) != ".") or hidden(path):
            continue
        if path.is_file():
            assert_readable(path)
    points = root / store.POINTS
    if points.is_dir():
        for point in points.iterdir():
            if not hidden(point):
                assert_run_dir(point)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_killed_run_leaves_old_or_new_directory_whole(tmp_path, round_, capsys):
    rng = np.random.default_rng([7, round_])
    write_inputs(tmp_path)
    out = tmp_path / "run"
    assert main(["run", str(tmp_path / "base.yaml"), "--out", str(out)]) == 0
    old = json.loads((out / "summary.json").read_text())
    proc = start(["run", "base.yaml", "--out", "run", "--force", "--set", "seed=1"], tmp_path)
    in_write = rng.random() < 0.7  # mostly while it writes: the moment that matters
    if in_write:  # the temporary run directory exists: kill within the next 50 ms
        writing = lambda: any(p.is_dir() for p in tmp_path.glob(".run.*"))  # noqa: E731
        kill_when(proc, writing, rng.uniform(0, 0.05))
    else:
        kill_when(proc, lambda: True, rng.uniform(0, 3))  # anywhere: import, run or write
    if out.exists():
        assert_run_dir(out)
    else:  # killed between the two renames: the old directory is kept whole, hidden
        assert_run_dir(tmp_path / ".run.old")
    inputs = {"run", "base.yaml", "sweep.yaml"}
    assert {p.name for p in tmp_path.iterdir() if not hidden(p)} <= inputs
    rerun = ["run", str(tmp_path / "base.yaml"), "--out", str(out), "--force", "--set", "seed=1"]
    assert main(rerun) == 0
    assert_run_dir(out)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run")]  # cleaned
    assert json.loads((out / "summary.json").read_text()) != old


def point_stamps(out: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of each finished point's summary: a rerun point would change them."""
    stamps = {}
    for point in (out / store.POINTS).glob("*"):
        summary = point / "summary.json"
        if not hidden(point) and summary.is_file():
            stat = summary.stat()
            stamps[point.name] = (stat.st_ino, stat.st_mtime_ns)
    return stamps


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_killed_sweep_resumes_every_point_exactly_once(tmp_path, round_, capsys):
    rng = np.random.default_rng([11, round_])
    write_inputs(tmp_path)
    out = tmp_path / "sweep"
    proc = start(["sweep", "sweep.yaml", "--out", "sweep", "--workers", "2", "--quiet"], tmp_path)
    done_before_kill = int(rng.integers(0, 12))
    finished = lambda: len(point_stamps(out)) >= done_before_kill  # noqa: E731
    kill_when(proc, finished, rng.uniform(0, 0.3))
    assert_complete(tmp_path)
    before = point_stamps(out)
    assert main(["sweep", str(tmp_path / "sweep.yaml"), "--out", str(out), "--resume",
                 "--workers", "1", "--quiet"]) == 0  # fmt: skip
    assert_complete(tmp_path)
    after = point_stamps(out)
    assert {k: after[k] for k in before} == before  # finished points were not run again
    manifest = store.read_manifest(out)
    ids = [p["point_id"] for p in manifest["points"]]
    assert len(ids) == 12 and sorted(after) == sorted(ids)
    results = store.load(out)
    assert results.point_id.tolist() == ids and (results.status == "done").all()
    assert not [p for p in out.rglob(".*")]  # every temporary entry is gone


def refuse_before_running(monkeypatch) -> None:
    """Make any simulation fail the test: the error must come first."""

    def no_run(*args, **kwargs):
        raise AssertionError("the run started before the output folder was checked")

    monkeypatch.setattr("sim.run.simulate", no_run)
    monkeypatch.setattr("experiments.tasks.simulate", no_run)


def fail_writes(monkeypatch, code: int) -> None:
    """Every fsync fails with ``code`` (the probe's write reaches the disk only there)."""

    def broken(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", broken)


@pytest.mark.parametrize(
    ("code", "words"),
    [(errno.ENOSPC, ("No space left on device", "free some space")),
     (errno.EACCES, ("Permission denied", "choose another --out"))],
)  # fmt: skip
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_unwritable_output_is_an_error_before_the_run(
    tmp_path, capsys, monkeypatch, command, code, words
):
    write_inputs(tmp_path)
    refuse_before_running(monkeypatch)
    fail_writes(monkeypatch, code)
    out = tmp_path / "out"
    source = tmp_path / ("base.yaml" if command == "run" else "sweep.yaml")
    quiet = ["--quiet"] if command == "sweep" else []
    assert main([command, str(source), "--out", str(out), *quiet]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsim: error: ") and err.count("\n") == 1, err
    assert "cannot write the output directory" in err, err
    assert all(word in err for word in words), err
    assert str(out) in err
    assert not [p for p in tmp_path.rglob("*probe*")]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_is_refused(tmp_path, capsys, monkeypatch):
    write_inputs(tmp_path)
    refuse_before_running(monkeypatch)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(["run", str(tmp_path / "base.yaml"), "--out", str(locked / "run")]) == 2
    finally:
        locked.chmod(0o700)
    assert "Permission denied" in capsys.readouterr().err


def test_output_that_is_a_file_is_refused(tmp_path, capsys, monkeypatch):
    write_inputs(tmp_path)
    refuse_before_running(monkeypatch)
    (tmp_path / "taken").write_text("not a folder")
    assert main(["run", str(tmp_path / "base.yaml"), "--out", str(tmp_path / "taken")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_disk_full_while_writing_leaves_nothing(tmp_path, capsys, monkeypatch):
    write_inputs(tmp_path)
    out = tmp_path / "run"

    def full(columns, path):
        Path(path).write_bytes(b"PAR1 partial")  # a torn file: must not survive
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sim.rundir, "write_parquet", full)
    assert main(["run", str(tmp_path / "base.yaml"), "--out", str(out)]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".run*"))
