"""Write a run's files: the resolved config, summary, requests and timeline tables."""

from __future__ import annotations

import errno
import glob
import json
import math
import os
import tempfile
from pathlib import Path

from sim.config.loader import dump_config
from sim.errors import KvsimError
from sim.run import RunResult

RUN_FILES = ("config.resolved.yaml", "summary.json", "requests.parquet", "timeline.parquet")


def _json_safe(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


PROBE_BYTES = 1 << 16  # written and removed up front: a full disk fails here, not after a run


def check_writable(out: str | Path) -> Path:
    """Fail now, with a clear message, if ``out`` cannot become a run directory.

    Refuses an ``out`` that is a file, then probes its parent with :func:`probe_folder`.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise KvsimError(f"{out}: exists and is not a directory; expected an output directory")
    probe_folder(out.parent, out.name, shown=out)
    return out


def probe_folder(folder: Path, name: str = "", shown: Path | None = None) -> None:
    """Create ``folder`` and write, sync and remove a small probe file in it.

    A read-only folder or a full disk fails here, before a run, not after it.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{name}.probe.", dir=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(b"\0" * PROBE_BYTES)
                handle.flush()
                os.fsync(handle.fileno())
        finally:
            Path(probe).unlink(missing_ok=True)
    except OSError as exc:
        raise _unwritable(shown or folder, exc) from None


def current_umask() -> int:
    """The process umask (read by setting it, then restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _unwritable(out: Path, exc: OSError) -> KvsimError:
    why = exc.strerror or str(exc)
    hint = "free some space" if exc.errno == errno.ENOSPC else "choose another --out"
    return KvsimError(f"{out}: cannot write the output directory ({why}); {hint}")


def _remove_tree(path: Path) -> None:
    """Remove a temporary run directory (files only, one level), ignoring what is gone."""
    if path.is_dir():
        for child in path.iterdir():
            child.unlink(missing_ok=True)
        path.rmdir()


def remove_stale(out: Path) -> None:
    """Remove what an earlier writer of ``out`` killed mid-way left: ``.NAME.*`` siblings."""
    if not out.parent.is_dir():
        return
    for path in out.parent.glob(f".{glob.escape(out.name)}.*"):
        if path.is_dir():
            _remove_tree(path)
        else:
            path.unlink(missing_ok=True)


def write_run(result: RunResult, out: str | Path) -> Path:
    """Write the run directory atomically (a temporary sibling renamed into place).

    A reader sees the old directory, or the new one whole, never a part: a writer killed
    at any point leaves ``.NAME.*`` siblings only, which the next write removes.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        os.chmod(tmp, 0o777 & ~current_umask())  # NOTE: mkdtemp makes it private (0700)
        (tmp / "config.resolved.yaml").write_text(dump_config(result.config))
        (tmp / "summary.json").write_text(json.dumps(_json_safe(result.summary), indent=2) + "\n")
        result.requests.to_parquet(tmp / "requests.parquet", index=False)
        result.timeline.to_parquet(tmp / "timeline.parquet", index=False)
        if result.kv_heat is not None:  # engine.kv_heat: true (the heatmap's data)
            result.kv_heat.to_parquet(tmp / "kv_heat.parquet", index=False)
    except OSError as exc:
        _remove_tree(tmp)
        raise _unwritable(out, exc) from None
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        os.replace(out, old)
        os.replace(tmp, out)
        _remove_tree(old)
    else:
        os.replace(tmp, out)
    return out
