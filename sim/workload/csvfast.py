"""CSV traces read without pandas, to the same columns ``pandas.read_csv`` makes of them.

pandas' import alone costs about 0.2 s, more than reading a trace of 20,000 rows, so the
common file is read here: UTF-8, comma-separated, no quote character, ``\\n`` or ``\\r\\n``
line ends, a header of distinct non-empty names. Columns are typed as pandas' C parser
types them (``low_memory=False``, default ``na_values``): only whole numbers -> int64; only
numbers and missing values -> float64; a value that is certainly no number -> strings (with
NaN where missing); all missing -> float64 NaN. Rows with more fields than the header are
bad lines (an error naming the line, or skipped and counted); shorter rows are padded with
missing values; rows with every value missing (blank lines) are dropped.

What this reader cannot type exactly as pandas would (a quote, a byte-order mark, a lone
``\\r``, a value pandas may or may not read as a number such as ``" 5"``, ``1e3``, ``inf``
or one with more than 15 digits, a column of True/False, a first row with an extra field,
which pandas takes as an index) makes :func:`read_csv_fast` answer None: the caller then
reads that file with pandas. So does a file over :data:`FAST_MAX_BYTES`: there pandas' C
parser gains more than its import costs (1.4 million BurstGPT rows, 58 MB: ~1.3 s with
pandas, ~4 s here).
"""

from __future__ import annotations

import codecs
import operator
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.errors import KvsimError

# pandas' default ``na_values`` (``pandas._libs.parsers.STR_NA_VALUES``; a test compares)
NA_VALUES = frozenset(
    {
        "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
        "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null",
    }
)  # fmt: skip
BOOLS = frozenset({"True", "TRUE", "true", "False", "FALSE", "false"})
FAST_MAX_BYTES = 4 << 20  # (~100,000 rows: about where pandas' import pays for itself)
MAX_DIGITS = 15  # a decimal of at most 15 digits converts to the same double in every parser
_INT = r"[+-]?[0-9]{1,18}"  # (fits int64)
_INT_COLUMN = re.compile(rf"{_INT}(?:\n{_INT})*")
_DEC = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)"
_DECIMAL = re.compile(_DEC)
_DECIMAL_COLUMN = re.compile(rf"{_DEC}(?:\n{_DEC})*")
_NOT_A_NUMBER = re.compile(r"[a-df-zA-DF-Z:/]")  # a letter other than e, or ':' or '/'
_NUMBER_WORD = re.compile(r"inf|nan", re.IGNORECASE)
_ASCII = re.compile(r"[\x00-\x7f]*")
_DIGIT = re.compile(r"[0-9]")


class Unhandled(Exception):
    """This file is left to pandas (see the module docstring)."""


@dataclass(frozen=True)
class CsvColumns:
    """The typed columns of a CSV's rows, each row's 1-based line, and bad lines skipped."""

    columns: dict[str, np.ndarray]
    line: np.ndarray
    skipped: int


def certainly_not_a_number(text: str) -> bool:
    """Whether no number parser (pandas' C parser, ``to_numeric``, Python's ``float``)
    reads ``text`` as a number: ASCII text without ``inf``/``nan`` that has no digit, or a
    letter other than ``e``/``E``, a ``:`` or a ``/``."""
    return (
        (_NOT_A_NUMBER.search(text) is not None or _DIGIT.search(text) is None)
        and _NUMBER_WORD.search(text) is None
        and _ASCII.fullmatch(text) is not None
    )


def decimal_value(text: str) -> float | None:
    """``text`` as a float if it is a plain decimal of at most 15 digits (which every parser
    rounds alike), else None."""
    if _DECIMAL.fullmatch(text) is None or _digits(text) > MAX_DIGITS:
        return None
    return float(text)


def _digits(text: str) -> int:
    return len(text) - text.count(".") - (text[:1] in "+-")


def read_csv_fast(path: Path, data: bytes, skip_bad: bool) -> CsvColumns | None:
    """``data`` (the bytes of ``path``) as pandas reads it, or None to leave it to pandas
    (a file over :data:`FAST_MAX_BYTES`, or one it cannot type as pandas would).

    Raises :class:`KvsimError` for an empty file and, unless ``skip_bad``, a row with more
    fields than the header (pandas' own errors, worded as the pandas reader words them).
    """
    if not data:
        raise KvsimError(f"{path}: empty file, expected a CSV header line")
    if len(data) > FAST_MAX_BYTES:
        return None
    try:
        return _read(path, data, skip_bad)
    except (Unhandled, UnicodeDecodeError):
        return None


def _read(path: Path, data: bytes, skip_bad: bool) -> CsvColumns:
    if data.startswith(codecs.BOM_UTF8) or b'"' in data or b"\0" in data:
        raise Unhandled
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
        if b"\r" in data:
            raise Unhandled
    lines = data.decode().split("\n")
    if lines[-1] == "":
        lines.pop()  # the last line's end
    names = lines[0].split(",")
    if not lines[0].strip() or "" in names or len(set(names)) < len(names):
        raise Unhandled  # (pandas names the columns itself)
    body, n = lines[1:], len(names)
    commas = np.fromiter(
        map(operator.methodcaller("count", ","), body), dtype=np.int64, count=len(body)
    )
    line = np.arange(len(body), dtype=np.int64) + 2
    fields: list[list[str]]
    if not body:
        fields, skipped = [[] for _ in names], 0
    elif (commas == n - 1).all():  # every line whole: one split of all of them
        flat = ",".join(body).split(",")
        fields, skipped = [flat[j::n] for j in range(n)], 0
    else:
        fields, line, skipped = _ragged(path, body, commas, n, skip_bad)
    typed = [_typed(values) for values in fields]
    blank = np.ones(len(line), dtype=bool)
    for _, missing in typed:
        blank &= missing
    columns = {name: values for name, (values, _) in zip(names, typed, strict=True)}
    if blank.any():
        keep = ~blank
        columns = {name: values[keep] for name, values in columns.items()}
        line = line[keep]
    return CsvColumns(columns, line, skipped)


def _ragged(
    path: Path, body: list[str], commas: np.ndarray, n: int, skip_bad: bool
) -> tuple[list[list[str]], np.ndarray, int]:
    """Fields of rows of unequal length: long rows are bad lines, short ones are padded."""
    line = np.arange(len(body), dtype=np.int64) + 2
    long = np.flatnonzero(commas > n - 1)
    if len(long):
        if long[0] == 0:
            raise Unhandled  # pandas takes a first row's extra fields as an index
        if not skip_bad:
            i = int(long[0])
            raise KvsimError(
                f"{path}:{i + 2}: expected {n} fields, saw {int(commas[i]) + 1} "
                "(set on_bad_rows: skip to skip bad rows)"
            )
        keep = commas <= n - 1
        body = [text for text, kept in zip(body, keep.tolist(), strict=True) if kept]
        line, commas = line[keep], commas[keep]
    rows = [text.split(",") for text in body]
    for row, count in zip(rows, commas.tolist(), strict=True):
        if count < n - 1:
            row.extend([""] * (n - 1 - count))
    fields = [list(values) for values in zip(*rows, strict=True)] if rows else [[]] * n
    return fields, line, len(long)


def _typed(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """A column's values as pandas types them, and which are missing."""
    none = np.zeros(len(values), dtype=bool)
    if not values:
        return np.zeros(0, dtype=object), none
    joined = "\n".join(values)
    if _INT_COLUMN.fullmatch(joined):
        return _parsed(joined, np.int64, len(values)), none
    missing = np.fromiter(map(NA_VALUES.__contains__, values), dtype=bool, count=len(values))
    present = [text for text, gone in zip(values, missing.tolist(), strict=True) if not gone]
    if not present:
        return np.full(len(values), np.nan), missing
    joined = "\n".join(present)
    if _DECIMAL_COLUMN.fullmatch(joined):
        if max(map(_digits, present)) > MAX_DIGITS:
            raise Unhandled
        floats = np.full(len(values), np.nan)
        floats[~missing] = _parsed(joined, np.float64, len(present))
        return floats, missing
    if set(present) <= BOOLS or not any(map(certainly_not_a_number, present)):
        raise Unhandled  # True/False, or numbers pandas may read otherwise (" 5", "1e3")
    strings = np.array(values, dtype=object)
    strings[missing] = np.nan
    return strings, missing


def _parsed(joined: str, dtype: type, count: int) -> np.ndarray:
    """Numbers one a line (checked by a pattern: plain integers or decimals), parsed by
    numpy's C text reader (as Python's ``int`` and ``float`` read them)."""
    values = np.fromstring(joined, dtype=dtype, sep="\n")
    if len(values) != count:
        raise Unhandled
    return values
