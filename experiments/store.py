"""The sweep directory: its manifest, one run directory per point, and ``results.parquet``.

Layout of ``DIR``::

    sweep.json            the points (id, axis values, seed) and the axes, in run order
    points/ID/            each finished point's run directory (written atomically)
    failures/ID.json      each failed point's error and traceback
    results.parquet       one row per point: point_id, axes, seed, summary, status, error
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.sweep import Sweep, format_value
from sim.errors import KvsimError
from sim.rundir import current_umask

MANIFEST = "sweep.json"
POINTS = "points"
FAILURES = "failures"
RESULTS = "results.parquet"
STATUSES = ("done", "failed", "pending")


def run_dir(out: str | Path, point_id: str) -> Path:
    """The run directory of a point."""
    return Path(out) / POINTS / point_id


def is_done(out: str | Path, point_id: str) -> bool:
    """Whether a point's run directory is complete (it appears whole or not at all)."""
    return (run_dir(out, point_id) / "summary.json").is_file()


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file through a temporary sibling renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~current_umask())  # NOTE: mkstemp makes it private (0600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_manifest(out: Path, sweep: Sweep) -> None:
    """Record the sweep's axes and points (the rows of ``results.parquet``, in order)."""
    points = [{"point_id": p.point_id, "params": p.params, "seed": p.seed} for p in sweep.points]
    manifest = {"source": sweep.source, "axes": list(sweep.axes), "points": points}
    write_atomic(out / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())


def read_manifest(out: str | Path) -> dict[str, Any]:
    """The manifest of a sweep directory."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise KvsimError(f"{out}: not a sweep directory (no {MANIFEST}); run 'kvsim sweep' first")
    return json.loads(path.read_text())


def record_failure(out: Path, point_id: str, error: str, detail: str) -> None:
    """Keep a failed point's one-line error and its traceback."""
    body = {"point_id": point_id, "error": error, "traceback": detail}
    write_atomic(out / FAILURES / f"{point_id}.json", (json.dumps(body, indent=1) + "\n").encode())


def clear_failure(out: Path, point_id: str) -> None:
    """Forget an earlier failure of a point that has now finished."""
    (out / FAILURES / f"{point_id}.json").unlink(missing_ok=True)


def remove_partial(out: Path) -> None:
    """Delete the temporary files and directories a sweep killed mid-write left behind."""
    for pattern in (f".{MANIFEST}.*", f".{RESULTS}.*"):
        for path in out.glob(pattern):
            path.unlink(missing_ok=True)
    for folder in (out / POINTS, out / FAILURES):
        if not folder.is_dir():
            continue
        for path in folder.glob(".*"):
            if path.is_dir():
                for child in path.iterdir():
                    child.unlink()
                path.rmdir()
            else:
                path.unlink()


def _cell(value: Any) -> Any:
    """A summary value as a parquet cell (mappings and lists as JSON text)."""
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value


def _axis_column(values: list[Any]) -> list[Any]:
    """Axis values as one column: kept if all numbers, all bools or all strings, else text."""
    kinds = {bool if isinstance(v, bool) else (float if isinstance(v, int | float) else type(v))
             for v in values}  # fmt: skip
    if len(kinds) == 1 and kinds <= {bool, float, str}:
        return values
    return [format_value(v) for v in values]


def _status(out: Path, point_id: str) -> tuple[str, str, dict[str, Any]]:
    """(status, error, summary) of a point from the files on disk."""
    if is_done(out, point_id):
        summary = json.loads((run_dir(out, point_id) / "summary.json").read_text())
        return "done", "", summary
    failure = out / FAILURES / f"{point_id}.json"
    if failure.is_file():
        return "failed", json.loads(failure.read_text())["error"], {}
    return "pending", "", {}


def results_frame(out: str | Path) -> pd.DataFrame:
    """One row per point of the sweep in ``out``, from its manifest and run directories.

    A summary key named like an axis (a trace run's ``workload`` report, where ``workload``
    is an axis) is left out: the axis keeps its column, the key stays in ``summary.json``.
    """
    out = Path(out)
    manifest = read_manifest(out)
    axes: list[str] = manifest["axes"]
    points = manifest["points"]
    states = [_status(out, p["point_id"]) for p in points]
    columns: dict[str, Iterable[Any]] = {"point_id": [p["point_id"] for p in points]}
    for axis in axes:
        columns[axis] = _axis_column([p["params"][axis] for p in points])
    columns["seed"] = [p["seed"] for p in points]
    taken = {"point_id", *axes, "seed", "status", "error"}  # NOTE: an axis keeps its column
    keys = [k for k in dict.fromkeys(k for _, _, s in states for k in s) if k not in taken]
    for key in keys:
        columns[key] = [_cell(summary.get(key)) for _, _, summary in states]
    columns["status"] = [status for status, _, _ in states]
    columns["error"] = [error for _, error, _ in states]
    frame = pd.DataFrame(columns)
    frame.attrs["axes"] = axes
    return frame


def write_results(out: str | Path) -> Path:
    """Write ``DIR/results.parquet`` atomically from the points on disk."""
    out = Path(out)
    frame = results_frame(out)
    fd, tmp = tempfile.mkstemp(prefix=f".{RESULTS}.", dir=out)
    os.close(fd)
    try:
        frame.to_parquet(tmp, index=False)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, out / RESULTS)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out / RESULTS


def load(out: str | Path) -> pd.DataFrame:
    """``DIR/results.parquet`` as a DataFrame; ``frame.attrs['axes']`` names the axis columns."""
    out = Path(out)
    path = out / RESULTS
    if not path.is_file():
        raise KvsimError(f"{out}: no {RESULTS}; run 'kvsim sweep SWEEP.yaml --out {out}' first")
    frame = pd.read_parquet(path)
    frame.attrs["axes"] = read_manifest(out)["axes"]
    return frame
