"""Shared pieces of the config schema: the strict base model, unit-typed fields, and the
plausible range of each kind of physical quantity (:data:`PLAUSIBLE`)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WrapValidator

from sim.units import BANDWIDTH, BYTES, DURATION, FLOP_RATE, RATE, Dimension


class Strict(BaseModel):
    """A frozen config section that refuses unknown keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Bytes = Annotated[float, BeforeValidator(BYTES.parse), Field(ge=0)]
PositiveBytes = Annotated[float, BeforeValidator(BYTES.parse), Field(gt=0)]
Bandwidth = Annotated[float, BeforeValidator(BANDWIDTH.parse), Field(gt=0)]
Seconds = Annotated[float, BeforeValidator(DURATION.parse), Field(ge=0)]
FlopRate = Annotated[float, BeforeValidator(FLOP_RATE.parse), Field(gt=0)]
PerSecond = Annotated[float, BeforeValidator(RATE.parse), Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}

KiB, MiB, GiB, TiB, PiB = (2.0**e for e in (10, 20, 30, 40, 50))


@dataclass(frozen=True)
class Plausible:
    """The physical range of one kind of quantity, ``low`` to ``high`` (SI units).

    A value outside it (0 aside, where the key allows 0 to mean "none") is an error naming
    the value as read and the unit that brings it nearest ``typical``: a number written
    without its unit (``h2d: 64`` is 64 B/s) or with the wrong prefix.
    """

    kind: str
    dimension: Dimension
    low: float
    high: float
    typical: float

    def check(self, value: Any, handler: Callable[[Any], float]) -> float:
        """Parse ``value`` (``handler``: the unit and sign checks), then check the range."""
        number = handler(value)
        if number == 0 or self.low <= number <= self.high:
            return number
        raise ValueError(self.message(value, number))

    def range_text(self) -> str:
        """``100 MB/s to 10 TB/s`` (``at most 10 ms`` where any small value is plausible)."""
        fmt = self.dimension.format
        return (
            f"at most {fmt(self.high)}" if self.low == 0 else f"{fmt(self.low)} to {fmt(self.high)}"
        )

    def suggestion(self, value: Any) -> str | None:
        """The number as written with the unit that puts it in range nearest ``typical``."""
        written = self.dimension.written(value)
        if written is None or written[0] <= 0:
            return None
        number, units = written[0], self.dimension.units
        fits = [u for u in self.dimension.scale if self.low <= number * units[u] <= self.high]
        if not fits:
            return None
        best = min(fits, key=lambda u: abs(math.log(number * units[u] / self.typical)))
        return f"{number:g}{best}"

    def message(self, value: Any, number: float) -> str:
        """What was read, the range of its kind, and the likely intended value."""
        written = self.dimension.written(value)
        bare = " (a number without a unit is in SI units)" if written and not written[1] else ""
        text = (
            f"got {value!r}, read as {self.dimension.format(number)}{bare}: outside the range of "
            f"a {self.kind}, {self.range_text()}"
        )
        guess = self.suggestion(value)
        return f"{text}; did you mean {guess}?" if guess else f"{text}; expected a value in range"


_RANGES = (  # kind, dimension, low, high, typical (SI); docs/config.md lists the keys of each
    # NOTE: lower bounds sit far below real parts so that scaled-down test configs (a tiny
    # model in 24 MiB of "HBM", a DRAM tier of a few blocks) load; any of them is far above
    # a size, bandwidth or compute rate written without its unit (80 for 80 GiB is 80 B).
    Plausible("device memory capacity", BYTES, 1 * MiB, 16 * TiB, 80 * GiB),
    Plausible("runtime reserve", BYTES, 1 * MiB, 1 * TiB, 2 * GiB),
    Plausible("driver reserve", BYTES, 1 * MiB, 64 * GiB, 512 * MiB),
    Plausible("host memory capacity", BYTES, 1 * MiB, 64 * TiB, 256 * GiB),
    Plausible("storage capacity", BYTES, 1 * MiB, 1 * PiB, 4 * TiB),
    Plausible("HBM cache for KV", BYTES, 64 * KiB, 16 * TiB, 16 * GiB),
    Plausible("DRAM budget for KV", BYTES, 64 * KiB, 64 * TiB, 256 * GiB),
    Plausible("SSD budget for KV", BYTES, 64 * KiB, 1 * PiB, 4 * TiB),
    Plausible("half-efficiency copy size", BYTES, 0.0, 16 * GiB, 64 * KiB),
    Plausible("all-reduce message size", BYTES, 0.0, 16 * GiB, 8 * MiB),
    Plausible("device memory bandwidth", BANDWIDTH, 1e9, 100e12, 3e12),
    Plausible("host memory bandwidth", BANDWIDTH, 1e9, 100e12, 300e9),
    Plausible("host link bandwidth", BANDWIDTH, 100e6, 10e12, 50e9),
    Plausible("GPU interconnect bandwidth", BANDWIDTH, 1e9, 10e12, 450e9),
    Plausible("NIC bandwidth", BANDWIDTH, 100e6, 1e12, 50e9),
    Plausible("collective latency", DURATION, 0.0, 10e-3, 20e-6),
    Plausible("storage bandwidth", BANDWIDTH, 10e6, 1e12, 10e9),
    Plausible("kernel row bandwidth", BANDWIDTH, 1e6, 100e12, 20e9),
    Plausible("compute rate", FLOP_RATE, 1e9, 100e15, 1e15),
    Plausible("transfer latency", DURATION, 0.0, 10e-3, 5e-6),
    Plausible("storage latency", DURATION, 0.0, 1.0, 80e-6),
    Plausible("load overhead", DURATION, 0.0, 1.0, 100e-6),
    Plausible("step overhead", DURATION, 0.0, 1.0, 3e-3),
    Plausible("sequence overhead", DURATION, 0.0, 10e-3, 20e-6),
    Plausible("asynchronous step gap", DURATION, 0.0, 100e-3, 160e-6),
    Plausible("front-end latency", DURATION, 0.0, 10.0, 10e-3),
    Plausible("front-end time a token", DURATION, 0.0, 1e-3, 2e-6),
    Plausible("kernel latency", DURATION, 0.0, 100e-3, 10e-6),
)
PLAUSIBLE: dict[str, Plausible] = {p.kind: p for p in _RANGES}


def plausible(kind: str) -> WrapValidator:
    """The validator that holds a unit-typed field to the range of ``kind`` (:data:`PLAUSIBLE`)."""
    return WrapValidator(PLAUSIBLE[kind].check)


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top, recursively for nested mappings."""
    merged = dict(copy.deepcopy(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
