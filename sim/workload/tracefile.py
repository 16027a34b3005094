"""Trace file formats and raw readers: a file becomes raw columns plus each row's line number.

Readers are vectorised: CSV by :mod:`sim.workload.csvfast` (no pandas) or, for a file it
leaves alone, pandas' C parser; JSONL as one ``json.loads`` of the whole file wrapped into
an array. Only when that fails does a slow pass parse each line on its own, to name the
lines that are broken (and, with ``on_bad_rows: skip``, keep the rest).
"""

from __future__ import annotations

import itertools
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from sim.config.workload import TraceSource
from sim.errors import KvsimError
from sim.workload.csvfast import read_csv_fast
from sim.workload.rawcolumns import RawColumns


@dataclass(frozen=True)
class Layout:
    """Where one trace format keeps each field, and in which units.

    ``session`` lists candidate column names (the first present is used); it is optional
    for the named formats and required when a csv/jsonl mapping names it.
    """

    reader: Literal["csv", "jsonl"]
    arrival: str
    prompt_tokens: str
    output_tokens: str
    time_unit: str = "s"
    session: tuple[str, ...] = ()
    session_required: bool = False
    hash_ids: str | None = None
    hash_block_tokens: int | None = None
    zero_output_is_failure: bool = False


LAYOUTS: dict[str, Layout] = {
    "mooncake": Layout(
        "jsonl", "timestamp", "input_length", "output_length", "ms",
        hash_ids="hash_ids", hash_block_tokens=512,
    ),
    "azure": Layout("csv", "TIMESTAMP", "ContextTokens", "GeneratedTokens", "datetime"),
    "burstgpt": Layout(
        "csv", "Timestamp", "Request tokens", "Response tokens", "s",
        session=("Session ID", "SessionID"), zero_output_is_failure=True,
    ),
}  # fmt: skip


def layout_of(source: TraceSource) -> Layout:
    """The layout of a named format, or the one a csv/jsonl column mapping describes."""
    if source.format in LAYOUTS:
        return LAYOUTS[source.format]
    columns = source.columns
    assert columns is not None  # the schema requires it for csv/jsonl
    return Layout(
        "jsonl" if source.format == "jsonl" else "csv",
        columns.arrival,
        columns.prompt_tokens,
        columns.output_tokens,
        source.time_unit or "s",
        session=(columns.session,) if columns.session else (),
        session_required=columns.session is not None,
        hash_ids=columns.hash_ids,
        hash_block_tokens=source.hash_block_tokens,
    )


@dataclass(frozen=True)
class RawRows:
    """A file's parsed columns, their rows' 1-based line numbers, and the lines that did not
    parse.

    ``unparsable`` holds (line, problem, text) for rows the reader could not turn into
    fields at all; ``skipped`` counts malformed lines the CSV parser dropped itself.
    """

    columns: RawColumns
    line: np.ndarray
    unparsable: list[tuple[int, str, str]]
    skipped: int = 0


def read_raw(path: Path, reader: str, skip_bad: bool) -> RawRows:
    """Parse ``path`` as CSV or JSONL."""
    try:
        if reader == "jsonl":
            return read_jsonl(path)
        return read_csv(path, skip_bad)
    except OSError as exc:
        raise KvsimError(f"{path}: cannot read trace: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise KvsimError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_jsonl(path: Path) -> RawRows:
    """One JSON object per line; blank lines are ignored."""
    import pandas as pd  # (here, not at import: a run without a trace needs none)

    lines = [line.strip() for line in path.read_bytes().split(b"\n")]
    lengths = np.fromiter(map(len, lines), dtype=np.int64, count=len(lines))
    line_no = np.flatnonzero(lengths > 0) + 1
    texts = [lines[i - 1] for i in line_no.tolist()]
    try:
        records = json.loads(b"[" + b",".join(texts) + b"]")
    except ValueError:
        records = None
    if records is None or len(records) != len(texts) or set(map(type, records)) - {dict}:
        return _read_jsonl_slowly(texts, line_no)
    return RawRows(RawColumns.of_frame(pd.DataFrame.from_records(records)), line_no, [])


def _read_jsonl_slowly(texts: list[bytes], line_no: np.ndarray) -> RawRows:
    """Parse line by line, recording the lines that are not one JSON object."""
    import pandas as pd

    records, good, bad = [], [], []
    for line, text in zip(line_no.tolist(), texts, strict=True):
        try:
            record = json.loads(text)
        except ValueError as exc:
            bad.append((line, f"not valid JSON ({exc})", text.decode(errors="replace")))
            continue
        if not isinstance(record, dict):
            bad.append((line, "not a JSON object", text.decode(errors="replace")))
            continue
        records.append(record)
        good.append(line)
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame()
    return RawRows(RawColumns.of_frame(frame), np.asarray(good, dtype=np.int64), bad)


_FIELDS = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")
_SKIPPED = re.compile(r"Skipping line (\d+)")


def read_csv(path: Path, skip_bad: bool) -> RawRows:
    """A CSV with a header line; fully empty rows (blank lines) are dropped."""
    fast = read_csv_fast(path, path.read_bytes(), skip_bad)
    if fast is not None:
        return RawRows(RawColumns(fast.columns), fast.line, [], skipped=fast.skipped)
    return read_csv_with_pandas(path, skip_bad)


def read_csv_with_pandas(path: Path, skip_bad: bool) -> RawRows:
    """:func:`read_csv` by pandas' C parser (for files :mod:`sim.workload.csvfast` leaves)."""
    import pandas as pd

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            frame = pd.read_csv(
                path,
                skip_blank_lines=False,
                on_bad_lines="warn" if skip_bad else "error",
                low_memory=False,
            )
    except pd.errors.EmptyDataError:
        raise KvsimError(f"{path}: empty file, expected a CSV header line") from None
    except pd.errors.ParserError as exc:
        match = _FIELDS.search(str(exc))
        if match:
            want, line, saw = match.groups()
            raise KvsimError(
                f"{path}:{line}: expected {want} fields, saw {saw} "
                "(set on_bad_rows: skip to skip bad rows)"
            ) from None
        raise KvsimError(f"{path}: cannot parse CSV: {exc}") from None
    skipped = sorted(
        int(m) for w in caught for m in _SKIPPED.findall(str(w.message))
    )  # fmt: skip
    line = np.arange(len(frame), dtype=np.int64) + 2
    for physical in skipped:  # rows after a dropped line sit one line further down
        line[line >= physical] += 1
    blank = frame.isna().all(axis=1).to_numpy()
    if blank.any():
        frame, line = frame.loc[~blank].reset_index(drop=True), line[~blank]
    return RawRows(RawColumns.of_frame(frame), line, [], skipped=len(skipped))


def flatten_lists(values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Lists of ints as (flat int64, lengths); None unless every row is a list of ints."""
    if not set(map(type, values)) <= {list}:
        return None
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    flat = np.array(list(itertools.chain.from_iterable(values)))
    if flat.size == 0:
        return np.zeros(0, dtype=np.int64), lengths
    if flat.dtype.kind not in "iu" or (flat.dtype.kind == "u" and flat.max() > 2**63 - 1):
        return None
    return flat.astype(np.int64), lengths


def _is_int_list(value: object) -> bool:
    return isinstance(value, list) and all(type(v) is int and -(2**63) <= v < 2**63 for v in value)


def int_lists(values: np.ndarray) -> np.ndarray:
    """Which rows are lists of int64-sized ints (the slow check behind ``flatten_lists``)."""
    return np.fromiter(map(_is_int_list, values), dtype=bool, count=len(values))
