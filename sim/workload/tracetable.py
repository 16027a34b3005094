"""A trace file's valid rows as arrays: times in seconds, lengths, sessions, prefix-block ids.

Every field is converted column-wise; a row whose value is missing, malformed or out of
range is a *bad row*. ``on_bad_rows: error`` raises one :class:`KvsimError` naming the file,
the line, the field and the value (the earliest bad line); ``skip`` drops and counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from sim.errors import KvsimError
from sim.workload.hashing import offsets_of
from sim.workload.rawcolumns import RawColumns, datetimes_ns, factorize, is_missing, numbers
from sim.workload.tracefile import Layout, RawRows, flatten_lists, int_lists, read_raw

SECONDS_PER_UNIT = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}
SKIP_HINT = "set on_bad_rows: skip to skip bad rows"


@dataclass(frozen=True)
class TraceTable:
    """A trace's valid rows in file order, before any selection.

    Attributes:
        path: the file.
        line: 1-based line number of each row.
        arrival_s: seconds since the file's earliest valid timestamp.
        prompt_tokens, output_tokens: lengths (int64, > 0).
        session: session code per row (-1: none), or None without a session column.
        hash_ids: flat int64 prefix-block ids at the trace's own block size, or None;
            row i owns ``hash_ids[hash_offsets[i]:hash_offsets[i + 1]]``.
        hash_offsets: row offsets into ``hash_ids`` (length rows + 1), or None.
        hash_block_tokens: tokens per trace block (512 for Mooncake), or None.
        columns: the raw columns, for ``filter``.
        rows_in_file: data rows in the file; bad_rows: rows skipped as bad;
        failed_rows: failed requests dropped (BurstGPT rows with 0 response tokens).
    """

    path: Path
    line: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    session: np.ndarray | None
    hash_ids: np.ndarray | None
    hash_offsets: np.ndarray | None
    hash_block_tokens: int | None
    columns: RawColumns
    rows_in_file: int
    bad_rows: int = 0
    failed_rows: int = 0

    def __len__(self) -> int:
        return len(self.line)

    def take(self, index: np.ndarray) -> TraceTable:
        """The rows at ``index`` (int positions, in that order)."""
        hash_ids = offsets = None
        if self.hash_ids is not None and self.hash_offsets is not None:
            counts = np.diff(self.hash_offsets)[index]
            offsets = offsets_of(counts)
            shift = np.repeat(self.hash_offsets[index] - offsets[:-1], counts)
            hash_ids = self.hash_ids[np.arange(offsets[-1]) + shift]
        return replace(
            self,
            line=self.line[index],
            arrival_s=self.arrival_s[index],
            prompt_tokens=self.prompt_tokens[index],
            output_tokens=self.output_tokens[index],
            session=None if self.session is None else self.session[index],
            hash_ids=hash_ids,
            hash_offsets=offsets,
            columns=self.columns.take(index),
        )


class BadRows:
    """Collects bad rows (a mask per problem) and resolves them by ``on_bad_rows``."""

    def __init__(self, path: Path, raw: RawRows):
        self.path = path
        self.line = raw.line
        self.bad = np.zeros(len(raw.line), dtype=bool)
        self.first: tuple[int, str] | None = None
        self.unparsable = len(raw.unparsable) + raw.skipped
        for line, problem, text in raw.unparsable:
            self._note(line, f"{problem}, got {_shorten(text)}")

    def _note(self, line: int, message: str) -> None:
        if self.first is None or line < self.first[0]:
            self.first = (line, message)

    def add(self, mask: np.ndarray, field: str, expected: str, values: np.ndarray) -> None:
        """Mark the rows in ``mask`` bad: ``field`` held ``values`` where ``expected`` was due."""
        if not mask.any():
            return
        self.bad |= mask
        i = int(np.flatnonzero(mask)[0])
        value = values[i]
        shown = "nothing (missing)" if is_missing(value) else _shorten(value)
        self._note(int(self.line[i]), f"field '{field}': expected {expected}, got {shown}")

    @property
    def count(self) -> int:
        """Bad rows found so far, unparsable lines included."""
        return int(self.bad.sum()) + self.unparsable

    def resolve(self, skip: bool) -> np.ndarray:
        """The mask of good rows; raise on the earliest bad line unless ``skip``."""
        if self.first is not None and not skip:
            line, message = self.first
            more = f" ({self.count} bad rows in all)" if self.count > 1 else ""
            raise KvsimError(f"{self.path}:{line}: {message}{more}; {SKIP_HINT}")
        return ~self.bad


def _shorten(value: object, limit: int = 80) -> str:
    if isinstance(value, np.generic):
        value = value.item()  # NOTE: -5, not np.int64(-5)
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_trace(path: Path, layout: Layout, skip_bad: bool) -> TraceTable:
    """Read and check a whole trace file (see the module docstring for bad rows)."""
    raw = read_raw(path, layout.reader, skip_bad)
    columns = raw.columns
    if len(columns) == 0:
        if not raw.unparsable:
            raise KvsimError(f"{path}: no data rows")
        BadRows(path, raw).resolve(skip_bad)
        raise KvsimError(f"{path}: no valid rows ({len(raw.unparsable)} bad)")
    for name in (layout.arrival, layout.prompt_tokens, layout.output_tokens, layout.hash_ids):
        if name is not None:
            _require_column(path, layout, columns, name)
    session_column = next((c for c in layout.session if c in columns), None)
    if layout.session_required and session_column is None:
        _require_column(path, layout, columns, layout.session[0])

    bad = BadRows(path, raw)
    times = _times(columns, layout, bad)
    prompt = _tokens(columns, layout.prompt_tokens, bad, allow_zero=False)
    output = _tokens(columns, layout.output_tokens, bad, allow_zero=layout.zero_output_is_failure)
    hashes = _hash_ids(columns, layout, prompt, bad) if layout.hash_ids else None
    keep = bad.resolve(skip_bad)
    failed = keep & (output == 0)
    keep &= ~failed
    if not keep.any():
        raise KvsimError(f"{path}: no valid rows ({bad.count} bad, {int(failed.sum())} failed)")

    table = TraceTable(
        path=path,
        line=raw.line,
        arrival_s=times,
        prompt_tokens=prompt,
        output_tokens=output,
        session=factorize(columns, session_column) if session_column else None,
        hash_ids=None if hashes is None else hashes[0],
        hash_offsets=None if hashes is None else offsets_of(hashes[1]),
        hash_block_tokens=layout.hash_block_tokens if hashes is not None else None,
        columns=columns,
        rows_in_file=len(columns) + bad.unparsable,
        bad_rows=bad.count,
        failed_rows=int(failed.sum()),
    )
    if not keep.all():
        table = table.take(np.flatnonzero(keep))
    origin = table.arrival_s.min()
    return replace(table, arrival_s=table.arrival_s - origin)


def _require_column(path: Path, layout: Layout, columns: RawColumns, name: str) -> None:
    if name in columns:
        return
    where = f"{path}:1: column" if layout.reader == "csv" else f"{path}: no row has the key"
    found = ", ".join(map(repr, columns.names)) or "none"
    raise KvsimError(f"{where} '{name}' (expected for this format); found: {found}")


def _times(columns: RawColumns, layout: Layout, bad: BadRows) -> np.ndarray:
    """Timestamps in seconds (any origin); bad values become 0 and are marked bad."""
    values = columns[layout.arrival]
    if layout.time_unit == "datetime":
        ns, invalid = datetimes_ns(columns, layout.arrival)
        bad.add(invalid, layout.arrival, "a date-time such as 2023-11-16 18:17:03.98", values)
        seconds = (ns - (ns[~invalid].min() if (~invalid).any() else 0)) / 1e9
        return np.where(invalid, 0.0, seconds)
    numeric = numbers(columns, layout.arrival)
    invalid = ~np.isfinite(numeric)
    bad.add(invalid, layout.arrival, f"a number (time in {layout.time_unit})", values)
    return np.where(invalid, 0.0, numeric) * SECONDS_PER_UNIT[layout.time_unit]


def _tokens(columns: RawColumns, name: str, bad: BadRows, allow_zero: bool) -> np.ndarray:
    """A token-count column as int64; bad values become 1 and are marked bad."""
    values = numbers(columns, name)
    with np.errstate(invalid="ignore"):
        invalid = ~np.isfinite(values) | (values != np.floor(values))
        invalid |= values < 0 if allow_zero else values <= 0
    expected = "a whole number of tokens >= 0" if allow_zero else "a whole number of tokens > 0"
    bad.add(invalid, name, expected, columns[name])
    return np.where(invalid, 1, values).astype(np.int64)


def _hash_ids(
    columns: RawColumns, layout: Layout, prompt: np.ndarray, bad: BadRows
) -> tuple[np.ndarray, np.ndarray]:
    """Flat prefix-block ids and per-row counts (at most one id per started block)."""
    assert layout.hash_ids is not None and layout.hash_block_tokens is not None
    column = values = np.asarray(columns[layout.hash_ids], dtype=object)
    flat = flatten_lists(values)
    if flat is None:  # slow path, only for a broken file: find the rows that are not lists
        good = int_lists(values)
        bad.add(~good, layout.hash_ids, "a list of integer block ids", column)
        values = values.copy()
        for i in np.flatnonzero(~good).tolist():
            values[i] = []
        flat = flatten_lists(values)
        assert flat is not None
    ids, counts = flat
    row_of = np.repeat(np.arange(len(counts)), counts)
    negative = np.zeros(len(counts), dtype=bool)
    negative[row_of[ids < 0]] = True
    if negative.any():
        bad.add(negative, layout.hash_ids, "block ids >= 0", column)
    blocks = -(-prompt // layout.hash_block_tokens)
    too_many = counts > blocks
    if too_many.any():
        bad.add(
            too_many,
            layout.hash_ids,
            f"at most one id per {layout.hash_block_tokens}-token block of {layout.prompt_tokens}",
            np.array([f"{len(v)} ids" if isinstance(v, list) else v for v in column], object),
        )
    return ids, counts
