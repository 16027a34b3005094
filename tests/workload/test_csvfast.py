"""The CSV reader without pandas gives what pandas gives, or leaves the file to pandas.

The reference is pandas itself: ``read_csv_with_pandas`` (the reader the fast one replaces)
and pandas' conversions on its DataFrame; generated files mix the forms a trace holds
(numbers, missing values, date-times with and without fraction and zone, words, blank,
short and long rows) with odd ones the fast reader must leave alone (quotes, ``1e3``,
``" 5"``, True/False, a lone ``\\r``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.errors import KvsimError
from sim.workload.csvfast import NA_VALUES, read_csv_fast
from sim.workload.rawcolumns import RawColumns, datetimes_ns, factorize, isin, numbers
from sim.workload.tracefile import read_csv_with_pandas

pytestmark = pytest.mark.filterwarnings("ignore:Parsing integer or float values with a format")

PLAIN = [
    "0", "5", "-3", "+7", "007", "4096",
    "0.5", "1.", ".25", "-0.0", "3.14159", "1700000000.123", "-12.5",
    "x", "GPT-4", "yes", "ChatGPT", "Conversation log", "a b", "-", ".", "+",
    "2023-11-16 18:15:46.6805900", "2023-11-16 18:15:47", "2023-11-16T18:15:48.5",
    "2023-11-16 18:15:49.123456789", "2024-02-29 00:00:00.1", "yesterday",
    "True", "false", "",
]  # fmt: skip
ZONED = ["2023-11-16 18:15:46.68+01:00", "2023-11-16 17:15:47+01:00", "2023-11-16 18:00:00Z"]
ODD = ['"a,b"', '"x"', " 5", "5 ", "1e3", "inf", "-Infinity", "1_000", "\u0663",
       "2023-02-30 00:00:00", "12345678901234567", "1.2345678901234567", "0x10", "\t"]  # fmt: skip
NAMES = ["ts", "in", "out", "sid", "model", "TIMESTAMP", "a b"]


def fields(odd: bool) -> st.SearchStrategy[str]:
    pool = PLAIN + ZONED + sorted(NA_VALUES) + (ODD if odd else [])
    return st.sampled_from(pool)


@st.composite
def csv_text(draw, odd: bool = True) -> str:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
    n = len(names)
    columns = [draw(st.lists(fields(odd), min_size=1, max_size=3)) for _ in names]
    rows = []
    for _ in range(draw(st.integers(0, 8))):
        shape = draw(st.sampled_from(["whole"] * 6 + ["blank", "short", "long"]))
        width = {"whole": n, "blank": 0, "short": max(n - 1, 0), "long": n + 1}[shape]
        row = [draw(st.sampled_from(columns[min(j, n - 1)])) for j in range(width)]
        rows.append(",".join(row))
    end = draw(st.sampled_from(["\n", "\r\n"] + (["\r"] if odd else [])))
    last = draw(st.sampled_from([end, ""]))
    return end.join([",".join(names), *rows]) + last


def both(path: Path, skip: bool):
    """(fast, pandas) results: RawRows-like, or the KvsimError message; fast may be None."""
    data = path.read_bytes()
    try:
        fast = read_csv_fast(path, data, skip)
    except KvsimError as exc:
        fast = str(exc)
    try:
        slow = read_csv_with_pandas(path, skip)
    except KvsimError as exc:
        slow = str(exc)
    return fast, slow


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or len(a) != len(b):
        return False
    if a.dtype == object:
        pairs = zip(a.tolist(), b.tolist(), strict=True)
        return all((x == y and type(x) is type(y)) or (_nan(x) and _nan(y)) for x, y in pairs)
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


def _nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def outcome(call):
    """A conversion's result, or its exception's type and message."""
    try:
        return call()
    except Exception as exc:  # (pandas' own errors must be the same too)
        return (type(exc), str(exc))


def same_outcome(a, b) -> bool:
    if isinstance(a, tuple) and isinstance(a[0], np.ndarray):
        return isinstance(b, tuple) and all(map(same_values, a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and same_values(a, b)
    return a == b


def check_conversions(fast: RawColumns, slow: RawColumns) -> None:
    """numbers, date-times, session codes and filter matches agree on every column."""
    for name in slow.names:
        for convert in (numbers, datetimes_ns, factorize):
            got = outcome(lambda: convert(fast, name))  # noqa: B023
            want = outcome(lambda: convert(slow, name))  # noqa: B023
            assert same_outcome(got, want), (convert.__name__, name, got, want)
        for wanted in (["x"], [5], [0.5, 5], ["5"], [True], ["", "yes"]):
            got = outcome(lambda: isin(fast, name, wanted))  # noqa: B023
            want = outcome(lambda: isin(slow, name, wanted))  # noqa: B023
            assert same_outcome(got, want), ("isin", name, wanted, got, want)


def may_be_left(text: str) -> bool:
    """Whether the fast reader may leave ``text`` to pandas: an odd token, a lone ``\\r``, a
    True/False value (a column of them), or a first row longer than the header (an index)."""
    lines = text.replace("\r\n", "\n").split("\n")
    index_row = len(lines) > 1 and lines[1].count(",") > lines[0].count(",")
    bools = "True" in text or "false" in text
    lone_cr = "\r" in text.replace("\r\n", "")
    return index_row or bools or lone_cr or any(token in text for token in ODD)


def compare(path: Path, text: str) -> None:
    for skip in (False, True):
        fast, slow = both(path, skip)
        if fast is None:
            assert may_be_left(text), f"plain file left to pandas: {text!r}"
            continue
        if isinstance(slow, str) or isinstance(fast, str):
            assert fast == slow
            continue
        assert fast.line.tolist() == slow.line.tolist()
        assert fast.skipped == slow.skipped
        assert list(fast.columns) == slow.columns.names
        for name in slow.columns.names:
            assert same_values(fast.columns[name], slow.columns[name]), name
            fast_series = RawColumns(fast.columns).series(name)
            assert fast_series.dtype == slow.columns.series(name).dtype, name
        check_conversions(RawColumns(fast.columns), slow.columns)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=csv_text())
def test_fast_reader_matches_pandas(tmp_path_factory, text: str) -> None:
    path = tmp_path_factory.mktemp("csv") / "t.csv"
    path.write_bytes(text.encode())
    compare(path, text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=csv_text(odd=False))
def test_plain_files_are_read_without_pandas(tmp_path_factory, text: str) -> None:
    """Files of plain values only (no odd token) are taken by the fast reader (unless
    :func:`may_be_left`), and match pandas."""
    path = tmp_path_factory.mktemp("csv") / "t.csv"
    path.write_bytes(text.encode())
    compare(path, text)
    if not may_be_left(text):
        assert read_csv_fast(path, path.read_bytes(), True) is not None


def test_na_values_are_pandas_defaults() -> None:
    from pandas._libs.parsers import STR_NA_VALUES

    assert NA_VALUES == STR_NA_VALUES


@pytest.mark.parametrize(
    ("text", "columns"),
    [
        ("a,b\n1,2\n3,4\n", {"a": [1, 3], "b": [2, 4]}),
        ("a,b\n1,\n3,4.5\n", {"a": [1, 3], "b": [math.nan, 4.5]}),
        ("a,b\n1,x\n\n3,NA\n", {"a": [1.0, 3.0], "b": ["x", math.nan]}),
        ("a,b\r\n1,2\r\n3\r\n", {"a": [1, 3], "b": [2.0, math.nan]}),
        ("t\n2023-11-16 18:15:46.68\n", {"t": ["2023-11-16 18:15:46.68"]}),
        ("a\n123456789012345678\n-5\n", {"a": [123456789012345678, -5]}),
    ],
)
def test_plain_tables(tmp_path, text: str, columns: dict) -> None:
    """Hand-written cases: types and values as pandas gives them."""
    path = tmp_path / "t.csv"
    path.write_text(text, newline="")
    got = read_csv_fast(path, path.read_bytes(), skip_bad=False)
    assert got is not None
    assert list(got.columns) == list(columns)
    for name, want in columns.items():
        expected = np.array(want, dtype=object if isinstance(want[0], str) else None)
        assert same_values(got.columns[name], expected), name


def test_datetimes_with_zone_and_fraction(tmp_path) -> None:
    """One zone for the column: UTC nanoseconds, exactly (hand-computed)."""
    text = "t\n2023-11-16 18:15:46.6805900+01:00\n2023-11-16 17:15:47+01:00\n\n"
    path = tmp_path / "t.csv"
    path.write_text(text)
    got = read_csv_fast(path, path.read_bytes(), skip_bad=False)
    assert got is not None and got.line.tolist() == [2, 3]
    ns, invalid = datetimes_ns(RawColumns(got.columns), "t")
    base = 1700154946 * 10**9  # 2023-11-16 17:15:46 UTC (1700158546: 18:15:46 UTC)
    assert ns.tolist() == [base + 680_590_000, base - 3599 * 10**9]
    assert not invalid.any()


def test_long_rows_name_their_line_or_are_skipped(tmp_path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n\n3,4,5\n6,7\n")
    with pytest.raises(KvsimError, match=r"t.csv:4: expected 2 fields, saw 3 \(set on_bad"):
        read_csv_fast(path, path.read_bytes(), skip_bad=False)
    got = read_csv_fast(path, path.read_bytes(), skip_bad=True)
    assert got is not None and got.line.tolist() == [2, 5] and got.skipped == 1


def test_a_big_file_is_left_to_pandas(tmp_path, monkeypatch) -> None:
    """Over FAST_MAX_BYTES pandas reads the file (its C parser wins there); the same rows."""
    from sim.workload import csvfast
    from sim.workload.tracefile import read_csv

    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,x\n2,y\n")
    small = read_csv(path, skip_bad=False)
    monkeypatch.setattr(csvfast, "FAST_MAX_BYTES", 8)
    big = read_csv(path, skip_bad=False)
    assert small.columns.frame is None and big.columns.frame is not None
    assert all(same_values(small.columns[n], big.columns[n]) for n in ("a", "b"))
