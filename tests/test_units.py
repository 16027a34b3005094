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
