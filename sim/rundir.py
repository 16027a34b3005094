"""Write a run's files: the resolved config, summary, requests and timeline tables."""

from __future__ import annotations

import errno
import glob
import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.config.loader import dump_config
from sim.errors import KvsimError
from sim.observe.metrics import Columns
from sim.run import RunResult

if TYPE_CHECKING:
    import pyarrow as pa

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


def write_parquet(columns: Columns, path: Path) -> None:
    """Write a table as pandas' ``to_parquet(index=False)`` writes its DataFrame, with
    pyarrow alone: the same column types and values (NaN stored as null, strings as
    ``large_string``, as pandas' ``str`` columns are), read back by pandas as equal."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays = [_arrow(values) for values in columns.values()]
    pq.write_table(pa.Table.from_arrays(arrays, names=list(columns)), path)


def _arrow(values: np.ndarray) -> pa.Array:
    """A column as pyarrow holds it when pandas converts it, built from its buffers
    (``pyarrow.array`` of a numpy array would import pandas): NaN as null, strings as
    ``large_string``, an empty column of objects as nulls."""
    import pyarrow as pa

    if values.dtype == object:
        if not len(values):
            return pa.nulls(0)
        encoded = [value.encode() for value in values.tolist()]  # (str only: else an error)
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(text) for text in encoded], out=offsets[1:])
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
        return pa.Array.from_buffers(pa.large_string(), len(values), buffers)
    valid = None
    if values.dtype.kind == "f" and np.isnan(values).any():
        valid = pa.py_buffer(np.packbits(~np.isnan(values), bitorder="little"))
    data = np.packbits(values, bitorder="little") if values.dtype == bool else values
    kind = pa.from_numpy_dtype(values.dtype)
    return pa.Array.from_buffers(
        kind, len(values), [valid, pa.py_buffer(np.ascontiguousarray(data))]
    )


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
        for name, columns in result.tables.items():  # kv_heat with engine.kv_heat: true
            write_parquet(columns, tmp / f"{name}.parquet")
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
