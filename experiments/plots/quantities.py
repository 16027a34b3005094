"""Unit-valued sweep axes (``32GB/s``, ``80GiB``, ``5us``) as numbers in one readable unit.

A sweep over ``hardware.link.h2d: [32GB/s, 64GB/s]`` stores the values as written; a figure
draws them as numbers (32, 64) on an axis labelled ``hardware.link.h2d (GB/s)``, in the unit
most of the values use. Bare numbers among them are SI, as in a config.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sim.units import BANDWIDTH, BYTES, DURATION, FLOP_RATE, RATE

DIMENSIONS = (BYTES, BANDWIDTH, DURATION, FLOP_RATE, RATE)
_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(\S*)\s*$")


def _split(value: Any) -> tuple[float, str] | None:
    """(number, unit) of a value; ``None`` if it is not a number with an optional unit."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value), ""
    if isinstance(value, str) and (match := _QUANTITY.match(value)):
        return float(match.group(1)), match.group(2)
    return None


def as_numbers(values: Sequence[Any]) -> tuple[list[float], str] | None:
    """The values as numbers in one unit, and that unit (the one most values are written
    in; the first of those on a tie); ``None`` unless every value is a quantity of one
    dimension and at least one has a unit."""
    split = [_split(v) for v in values]
    if not split or any(s is None for s in split):
        return None
    pairs = [s for s in split if s is not None]
    units = [u for _, u in pairs if u]
    if not units:
        return None
    for dim in DIMENSIONS:
        if all(u == "" or u in dim.units for _, u in pairs):
            unit = Counter(units).most_common(1)[0][0]
            factor = dim.units[unit]
            return [n * ((dim.units[u] if u else 1.0) / factor) for n, u in pairs], unit
    return None
