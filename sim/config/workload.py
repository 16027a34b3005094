"""Workload schema: where requests come from (synthetic generators; trace loaders plug in here)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from sim.config.base import PerSecond, Strict


class Fixed(Strict):
    """Every draw is ``value``."""

    kind: Literal["fixed"] = "fixed"
    value: int = Field(gt=0)


class Uniform(Strict):
    """Integers uniform on [min, max]."""

    kind: Literal["uniform"]
    min: int = Field(gt=0)
    max: int = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class Clipped(Strict):
    """A continuous distribution rounded to integers and clipped to [min, max]."""

    min: int = Field(1, gt=0)
    max: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> Clipped:
        if self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class Normal(Clipped):
    """Normal with ``mean`` and ``std``, rounded and clipped."""

    kind: Literal["normal"]
    mean: float = Field(gt=0)
    std: float = Field(ge=0)


class LogNormal(Clipped):
    """Log-normal whose *arithmetic* mean is ``mean`` and log-space std is ``sigma``."""

    kind: Literal["lognormal"]
    mean: float = Field(gt=0)
    sigma: float = Field(ge=0)


def _bare_int_is_fixed(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return {"kind": "fixed", "value": value}
    return value


LengthDist = Annotated[
    Fixed | Uniform | Normal | LogNormal,
    BeforeValidator(_bare_int_is_fixed),
    Field(discriminator="kind"),
]


class Poisson(Strict):
    """Exponential inter-arrival times at ``rate`` requests/s."""

    kind: Literal["poisson"]
    rate: PerSecond


class Gamma(Strict):
    """Gamma inter-arrival times at ``rate`` requests/s with coefficient of variation ``cv``."""

    kind: Literal["gamma"]
    rate: PerSecond
    cv: float = Field(gt=0)


class AllAtOnce(Strict):
    """Every request arrives at t = 0 (a closed batch)."""

    kind: Literal["all_at_once"]


Arrival = Annotated[Poisson | Gamma | AllAtOnce, Field(discriminator="kind")]


class SyntheticWorkload(Strict):
    """Independent requests with drawn arrivals and lengths."""

    kind: Literal["synthetic"]
    num_requests: int = Field(gt=0)
    arrival: Arrival
    prompt_tokens: LengthDist
    output_tokens: LengthDist


WorkloadConfig = Annotated[SyntheticWorkload, Field(discriminator="kind")]
