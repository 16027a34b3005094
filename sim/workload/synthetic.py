"""Synthetic workloads: drawn arrivals and lengths, every draw from a seeded Generator."""

from __future__ import annotations

import numpy as np

from sim.config.workload import (
    AllAtOnce,
    Fixed,
    Gamma,
    LogNormal,
    Normal,
    Poisson,
    SyntheticWorkload,
    Uniform,
)
from sim.workload.requests import Requests

Arrival = Poisson | Gamma | AllAtOnce
Length = Fixed | Uniform | Normal | LogNormal


def draw_arrivals(spec: Arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of ``n`` requests, the first at t = 0."""
    if isinstance(spec, AllAtOnce):
        return np.zeros(n)
    if isinstance(spec, Poisson):
        gaps = rng.exponential(1.0 / spec.rate, size=n)
    else:
        shape = 1.0 / spec.cv**2  # gamma with mean 1/rate and coefficient of variation cv
        gaps = rng.gamma(shape, 1.0 / (spec.rate * shape), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


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


def generate_synthetic(spec: SyntheticWorkload, seed: int) -> Requests:
    """Independent requests; separate random streams for arrivals, prompts and outputs."""
    arrivals, prompts, outputs = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
    )
    n = spec.num_requests
    return Requests(
        arrival_s=draw_arrivals(spec.arrival, n, arrivals),
        prompt_tokens=draw_lengths(spec.prompt_tokens, n, prompts),
        output_tokens=draw_lengths(spec.output_tokens, n, outputs),
    )
