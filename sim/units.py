"""Readable units in YAML: ``80GiB``, ``3.35TB/s``, ``5us``, ``989TFLOP/s``; bare numbers are SI.

Each dimension has its own parser so that a bandwidth where a size is expected is an error
(``hbm.capacity: 3TB/s``), not a silent conversion.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_QUANTITY = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-z/]*)\s*$")

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}


def _prefixed(base_units: tuple[str, ...], binary: bool) -> dict[str, float]:
    table = {}
    prefixes = {**_DECIMAL, **(_BINARY if binary else {})}
    for base in base_units:
        for prefix, factor in prefixes.items():
            table[prefix + base] = factor
    return table


@dataclass(frozen=True)
class Dimension:
    """A physical dimension: its name, an example, the unit spellings it accepts, and the
    units it is shown in (``scale``: smallest first, each a spelling of ``units``)."""

    name: str
    example: str
    units: dict[str, float]
    scale: tuple[str, ...] = ("",)

    def parse(self, value: object) -> float:
        """Convert ``value`` (number or string with unit) to SI; raise ValueError if it can't."""
        if isinstance(value, bool):
            raise ValueError(f"expected a {self.name} such as '{self.example}', got {value!r}")
        if isinstance(value, int | float):
            number = float(value)
        elif isinstance(value, str):
            number = self._parse_text(value)
        else:
            raise ValueError(f"expected a {self.name} such as '{self.example}', got {value!r}")
        if not math.isfinite(number):
            raise ValueError(f"expected a finite {self.name}, got {value!r}")
        return number

    def _parse_text(self, text: str) -> float:
        match = _QUANTITY.match(text)
        if not match:
            raise ValueError(f"expected a {self.name} such as '{self.example}', got {text!r}")
        number, unit = float(match.group(1)), match.group(2)
        if not unit:  # a number in a string ('8e10': YAML 1.1 reads no float without a dot)
            return number
        if unit not in self.units:
            other = _dimension_of(unit)
            hint = f" ('{unit}' is a {other.name})" if other else ""
            raise ValueError(f"expected a {self.name} such as '{self.example}', got {text!r}{hint}")
        return number * self.units[unit]

    def written(self, value: object) -> tuple[float, str] | None:
        """The number and unit as written (``'64GB/s'`` -> (64.0, 'GB/s'); a bare number has
        unit ''), or None if ``value`` is not a quantity."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value), ""
        match = _QUANTITY.match(value) if isinstance(value, str) else None
        return (float(match.group(1)), match.group(2)) if match else None

    def format(self, value: float) -> str:
        """``value`` (SI) in the largest unit of ``scale`` not above it: ``64 GB/s``, ``5 us``."""
        shown = self.scale[0]
        for unit in self.scale:
            if abs(value) >= self.units[unit]:
                shown = unit
        number = f"{value / self.units[shown]:.4g}"
        return f"{number} {shown}".rstrip()


_BYTE_UNITS = _prefixed(("B",), binary=True)
BYTES = Dimension("size in bytes", "80GiB", _BYTE_UNITS, ("B", "KiB", "MiB", "GiB", "TiB", "PiB"))
BANDWIDTH = Dimension(
    "bandwidth in bytes/s",
    "3.35TB/s",
    {**_prefixed(("B/s", "Bps"), binary=True)},
    ("B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s"),
)
DURATION = Dimension(
    "duration",
    "5us",
    {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0},
    ("ns", "us", "ms", "s"),
)
FLOP_RATE = Dimension(
    "compute rate in FLOP/s",
    "989TFLOP/s",
    {**_prefixed(("FLOP/s", "FLOPS", "flop/s"), binary=False)},
    ("FLOP/s", "kFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s"),
)
RATE = Dimension("rate per second", "4/s", {"": 1.0, "/s": 1.0, "/min": 1 / 60, "/h": 1 / 3600})

_ALL = (BYTES, BANDWIDTH, DURATION, FLOP_RATE)


def _dimension_of(unit: str) -> Dimension | None:
    if not unit:
        return None
    return next((dim for dim in _ALL if unit in dim.units), None)


def format_bytes(value: float) -> str:
    """Human-readable binary size, e.g. ``1.50 GiB``."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {unit}"
    return f"{value:.0f} B"
