"""Unit parsing: readable strings and bare SI numbers, wrong dimensions refused."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.units import BANDWIDTH, BYTES, DURATION, FLOP_RATE, format_bytes


@pytest.mark.parametrize(
    ("dim", "text", "expected"),
    [
        (BYTES, "80GiB", 80 * 2**30),
        (BYTES, "141GB", 141e9),
        (BYTES, "0B", 0.0),
        (BYTES, "512 MiB", 512 * 2**20),
        (BANDWIDTH, "3.35TB/s", 3.35e12),
        (BANDWIDTH, "64GB/s", 64e9),
        (BANDWIDTH, "25GiB/s", 25 * 2**30),
        (DURATION, "5us", 5e-6),
        (DURATION, "1.5ms", 1.5e-3),
        (DURATION, "2s", 2.0),
        (FLOP_RATE, "989TFLOP/s", 989e12),
        (FLOP_RATE, "312TFLOPS", 312e12),
        (BYTES, 1024, 1024.0),
        (DURATION, 0.25, 0.25),
        (BYTES, "6.74e+9B", 6.74e9),
        (BYTES, "8e10", 8e10),  # --set hardware.hbm.capacity=8e10: YAML gives a string
        (BANDWIDTH, "55e9", 55e9),
        (FLOP_RATE, "1e15", 1e15),
    ],
)
def test_parses_readable_units(dim, text, expected):
    assert dim.parse(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("dim", "text", "fragment"),
    [
        (BYTES, "3TB/s", "'TB/s' is a bandwidth"),
        (BANDWIDTH, "80GiB", "'GiB' is a size"),
        (DURATION, "10 parsecs", "expected a duration"),
        (BYTES, "lots", "expected a size in bytes"),
        (BYTES, True, "expected a size"),
        (BYTES, "nan", "expected a size"),
    ],
)
def test_refuses_wrong_dimension_or_garbage(dim, text, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        dim.parse(text)


@given(st.integers(min_value=0, max_value=2**50))
def test_bare_integers_are_si(n):
    assert BYTES.parse(n) == float(n)
    assert BYTES.parse(f"{n}B") == float(n)


def test_format_bytes():
    assert format_bytes(1.5 * 2**30) == "1.50 GiB"
    assert format_bytes(100) == "100 B"


@pytest.mark.parametrize(
    ("dim", "value", "shown"),
    [
        (BANDWIDTH, 64.0, "64 B/s"),
        (BANDWIDTH, 55e9, "55 GB/s"),
        (BANDWIDTH, 1e15, "1 PB/s"),
        (BANDWIDTH, 3.35e12, "3.35 TB/s"),
        (BYTES, 512.0, "512 B"),
        (BYTES, 80 * 2**30, "80 GiB"),
        (BYTES, 1.5 * 2**20, "1.5 MiB"),
        (DURATION, 5.0, "5 s"),
        (DURATION, 5e-6, "5 us"),
        (DURATION, 854e-9, "854 ns"),
        (DURATION, 3600.0, "3600 s"),
        (FLOP_RATE, 989e12, "989 TFLOP/s"),
    ],
)
def test_format_shows_the_largest_unit_not_above_the_value(dim, value, shown):
    assert dim.format(value) == shown


@pytest.mark.parametrize(
    ("dim", "value", "written"),
    [
        (BANDWIDTH, 64, (64.0, "")),
        (BANDWIDTH, "64GB/s", (64.0, "GB/s")),
        (BYTES, " 1.5 TiB ", (1.5, "TiB")),
        (DURATION, "1e-3", (1e-3, "")),
        (BYTES, "lots", None),
        (BYTES, True, None),
    ],
)
def test_written_splits_number_and_unit_as_the_user_wrote_them(dim, value, written):
    assert dim.written(value) == written
