"""Shared pieces of the config schema: the strict base model and unit-typed fields."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from sim.units import BANDWIDTH, BYTES, DURATION, FLOP_RATE, RATE


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
