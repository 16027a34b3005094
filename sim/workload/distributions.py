"""Draws for generators: arrival processes, token counts and durations (seeded Generators)."""

from __future__ import annotations

import numpy as np

from sim.config.workload import (
    AllAtOnce,
    ExponentialTime,
    Fixed,
    FixedTime,
    Gamma,
    LogNormal,
    LogNormalTime,
    Normal,
    OnOff,
    Poisson,
    Uniform,
    UniformTime,
)

Arrival = Poisson | Gamma | AllAtOnce | OnOff
Length = Fixed | Uniform | Normal | LogNormal
Duration = FixedTime | ExponentialTime | UniformTime | LogNormalTime


def draw_arrivals(spec: Arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of ``n`` requests, the first at t = 0."""
    if isinstance(spec, AllAtOnce):
        return np.zeros(n)
    if isinstance(spec, OnOff):
        return _on_off_arrivals(spec, n, rng)
    if isinstance(spec, Poisson):
        gaps = rng.exponential(1.0 / spec.rate, size=n)
    else:
        shape = 1.0 / spec.cv**2  # gamma with mean 1/rate and coefficient of variation cv
        gaps = rng.gamma(shape, 1.0 / (spec.rate * shape), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def _on_off_arrivals(spec: OnOff, n: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals under a piecewise-constant rate, by inverting the cumulative rate.

    Unit-rate Poisson epochs in "intensity time" map to real time through the cumulative
    intensity, which is linear within each on or off period (time-rescaling theorem).
    """
    epochs = np.cumsum(rng.exponential(1.0, size=n))
    rates = np.array([spec.rate_on, spec.rate_off])
    means = np.array([spec.on_s, spec.off_s])
    durations: list[np.ndarray] = []
    total = 0.0
    while total <= epochs[-1]:
        pairs = max(16, int(2 * (epochs[-1] - total) / (spec.rate_on * spec.on_s)) + 1)
        if spec.periods == "fixed":
            chunk = np.tile(means, pairs)
        else:
            chunk = rng.exponential(np.tile(means, pairs))
        durations.append(chunk)
        total += float((chunk * np.tile(rates, pairs)).sum())
    length = np.concatenate(durations)
    rate = np.tile(rates, len(length) // 2)
    start = np.concatenate([[0.0], np.cumsum(length)])
    intensity = np.concatenate([[0.0], np.cumsum(length * rate)])
    period = np.searchsorted(intensity, epochs, side="right") - 1
    times = start[period] + (epochs - intensity[period]) / rate[period]
    return times - times[0]


def draw_lengths(spec: Length, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` token counts from a length distribution (integers >= 1)."""
    if isinstance(spec, Fixed):
        return np.full(n, spec.value, dtype=np.int64)
    if isinstance(spec, Uniform):
        return rng.integers(spec.min, spec.max, size=n, endpoint=True, dtype=np.int64)
    if isinstance(spec, Normal):
        raw = rng.normal(spec.mean, spec.std, size=n)
    else:
        mu = np.log(spec.mean) - spec.sigma**2 / 2.0  # so that E[X] = mean
        raw = rng.lognormal(mu, spec.sigma, size=n)
    upper = spec.max if spec.max is not None else np.iinfo(np.int64).max
    return np.clip(np.rint(raw), spec.min, upper).astype(np.int64)


def draw_durations(spec: Duration, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` durations in seconds (>= 0)."""
    if isinstance(spec, FixedTime):
        return np.full(n, spec.value)
    if isinstance(spec, ExponentialTime):
        return rng.exponential(spec.mean, size=n)
    if isinstance(spec, UniformTime):
        return rng.uniform(spec.min, spec.max, size=n)
    if spec.mean == 0:
        return np.zeros(n)
    mu = np.log(spec.mean) - spec.sigma**2 / 2.0
    return rng.lognormal(mu, spec.sigma, size=n)
