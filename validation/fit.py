"""Least-squares fits of the cost model's parameters to measured times.

Every fit minimises relative error (residuals in log time), because the measured times span
five decades. The model equations are the cost model's own (``docs/cost-model.md``), in
numpy form; ``tests/validation/test_fit.py`` checks they agree with ``sim.cost.roofline``.

- :func:`fit_affine`: ``t = intercept + slope * x`` (a link: latency + bytes / bandwidth;
  decode attention: overhead + bytes / bandwidth; prefill attention: overhead + FLOPs / rate).
- :func:`fit_gemm`: ``t = latency + blend(FLOPs / (F e), bytes / (B m), p)``; with
  ``row_blocks`` it also picks how many rows share one pass over the weights
  (:func:`fit_row_block`).
- :func:`fit_kernel`: ``t = blend(latency + row / row_bw, T row / (B m), p)``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from sim.errors import KvsimError

DECODE_MAX_TOKENS = 64  # "decode-sized": at most this many tokens (hardware-figures.md s.2)
MAX_BLEND = 64.0
MIN_POINTS = 4
ROW_BLOCKS = (1, 2, 3, 4, 6, 8, 12, 16)  # candidate rows per weight pass (MKL: a few)
MAX_PASSES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, None)  # candidate limits (None: none)
ROW_BLOCK_GAIN = 0.7  # a row block is kept only if it cuts the fit's cost below this share


def read_data(path: Path, **options) -> pd.DataFrame:
    """A data file the fits read: a CSV whose lines starting with ``#`` are its notes (a
    ``#`` inside a row, as in "PR #244", is text, which ``read_csv``'s ``comment`` cuts)."""
    lines = [line for line in path.read_text().splitlines(True) if not line.startswith("#")]
    return pd.read_csv(io.StringIO("".join(lines)), **options)


@dataclass(frozen=True)
class Residual:
    """How far a fit's predictions are from the points it was fitted to."""

    n: int
    median_ape: float
    p90_ape: float

    @classmethod
    def of(cls, predicted: np.ndarray, measured: np.ndarray) -> Residual:
        """Absolute percentage errors of ``predicted`` against ``measured``."""
        ape = np.abs(np.asarray(predicted) / np.asarray(measured) - 1.0)
        return cls(
            n=len(ape), median_ape=float(np.median(ape)), p90_ape=float(np.quantile(ape, 0.9))
        )


@dataclass(frozen=True)
class AffineFit:
    """``t = intercept + slope * x``, fitted on relative error."""

    intercept: float
    slope: float
    residual: Residual

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted times at ``x``."""
        return self.intercept + self.slope * np.asarray(x, dtype=float)


@dataclass(frozen=True)
class GemmFit:
    """A GEMM's compute efficiency, weight-streaming efficiency, latency and roofline blend."""

    efficiency: float
    memory: float
    latency_s: float
    blend: float
    residual: Residual
    row_block: int | None = None
    max_passes: int | None = None


@dataclass(frozen=True)
class KernelFit:
    """A memory-bound kernel's latency, per-row bandwidth, streaming efficiency and blend."""

    latency_s: float
    memory: float
    row_bandwidth: float
    blend: float
    residual: Residual


def soft_max(a: np.ndarray, b: np.ndarray, p: float) -> np.ndarray:
    """``(a^p + b^p)^(1/p)`` elementwise, computed without overflow."""
    top = np.maximum(a, b)
    safe = np.where(top > 0, top, 1.0)
    return np.where(top > 0, top * ((a / safe) ** p + (b / safe) ** p) ** (1.0 / p), 0.0)


def weight_passes(
    tokens: np.ndarray, row_block: int | None, max_passes: int | None = None
) -> np.ndarray:
    """Passes over the weights of GEMMs of ``tokens`` rows: ``ceil(tokens / row_block)``,
    at least 1, at most ``max_passes``; 1 everywhere without a row block."""
    tokens = np.asarray(tokens, dtype=float)
    if row_block is None:
        return np.ones_like(tokens)
    passes = np.maximum(np.ceil(tokens / row_block), 1.0)
    return passes if max_passes is None else np.minimum(passes, max_passes)


def gemm_model(
    x: np.ndarray,
    tokens: np.ndarray,
    shape: tuple[np.ndarray, np.ndarray],
    peaks: tuple[float, float, float],
    passes: np.ndarray | float = 1.0,
) -> np.ndarray:
    """GEMM time for ``x = (latency_us, efficiency, memory, blend)``; peaks = (F, B, bytes/elt);
    ``passes``: how often each GEMM reads its weights (:func:`weight_passes`)."""
    latency_us, efficiency, memory, p = x
    fan_in, fan_out = shape
    flops_peak, bandwidth, width = peaks
    flops = 2.0 * tokens * fan_in * fan_out
    traffic = (fan_in * fan_out * passes + tokens * (fan_in + fan_out)) * width
    return latency_us * 1e-6 + soft_max(
        flops / (flops_peak * efficiency), traffic / (bandwidth * memory), p
    )


def kernel_model(
    x: np.ndarray, tokens: np.ndarray, row_bytes: np.ndarray, bandwidth: float
) -> np.ndarray:
    """Kernel time for ``x = (latency_us, memory, row_bandwidth_GBps, blend)``."""
    latency_us, memory, row_gbps, p = x
    floor = latency_us * 1e-6 + row_bytes / (row_gbps * 1e9)
    return soft_max(floor, tokens * row_bytes / (bandwidth * memory), p)


def regime_weights(tokens: np.ndarray) -> np.ndarray:
    """Weights giving decode-sized and prefill-sized points equal total say in a fit."""
    tokens = np.asarray(tokens)
    decode = tokens <= DECODE_MAX_TOKENS
    weights = np.ones(len(tokens))
    for mask in (decode, ~decode):
        if mask.any():
            weights[mask] = np.sqrt(len(tokens) / (2.0 * mask.sum()))
    return weights


def _check(time_s: np.ndarray, what: str) -> np.ndarray:
    time_s = np.asarray(time_s, dtype=float)
    if len(time_s) < MIN_POINTS:
        raise KvsimError(f"{what}: {len(time_s)} measurements; a fit needs at least {MIN_POINTS}")
    if not np.all(np.isfinite(time_s) & (time_s > 0)):
        raise KvsimError(f"{what}: every measured time must be a positive number of seconds")
    return time_s


def fit_affine(x: np.ndarray, time_s: np.ndarray, what: str = "affine fit") -> AffineFit:
    """``t = intercept + slope * x`` minimising relative error (intercept, slope >= 0)."""
    time_s = _check(time_s, what)
    x = np.asarray(x, dtype=float)
    # relative residual (a + b x) / t - 1 is linear in (a, b): solve, then clip to >= 0
    design = np.column_stack([1.0 / time_s, x / time_s])
    (a, b), *_ = np.linalg.lstsq(design, np.ones_like(time_s), rcond=None)
    if a < 0 or b < 0:
        fit = least_squares(
            lambda v: (v[0] + v[1] * x) / time_s - 1.0,
            [max(a, 0.0), max(b, 1e-30)],
            bounds=([0.0, 0.0], [np.inf, np.inf]),
            x_scale=[
                max(np.min(time_s), 1e-12),
                max(np.median(time_s / np.maximum(x, 1e-30)), 1e-30),
            ],
        )
        a, b = fit.x
    return AffineFit(float(a), float(b), Residual.of(a + b * x, time_s))


def _gemm_least_squares(
    tokens: np.ndarray, shape: tuple[np.ndarray, np.ndarray], time_s: np.ndarray,
    peaks: tuple[float, float, float], passes: np.ndarray | float, start: list[float],
) -> tuple[np.ndarray, float]:  # fmt: skip
    """The fitted ``(latency_us, efficiency, memory, blend)`` at fixed passes, and its cost."""
    weights = regime_weights(tokens)
    fit = least_squares(
        lambda v: weights * np.log(gemm_model(v, tokens, shape, peaks, passes) / time_s),
        start,
        bounds=([0.0, 1e-3, 1e-3, 1.0], [1e4, 1.0, 1.0, MAX_BLEND]),
        x_scale=[1.0, 0.1, 0.1, 1.0],
    )
    return fit.x, float(fit.cost)


def fit_gemm(
    tokens: np.ndarray,
    shape: tuple[np.ndarray, np.ndarray],
    time_s: np.ndarray,
    peaks: tuple[float, float, float],
    row_blocks: bool = False,
) -> GemmFit:
    """Fit a GEMM's (efficiency, memory, latency, blend) to times over shapes and tokens.

    Args:
        tokens: rows of the activation matrix.
        shape: (fan_in, fan_out) arrays of the weights.
        time_s: measured times.
        peaks: (peak FLOP/s, peak memory bytes/s, bytes per element).
        row_blocks: also fit rows per weight pass and the most passes (:func:`fit_row_block`).
    """
    time_s = _check(time_s, "GEMM fit")
    tokens = np.asarray(tokens, dtype=float)
    shape = (np.asarray(shape[0], dtype=float), np.asarray(shape[1], dtype=float))
    x, cost = _gemm_least_squares(tokens, shape, time_s, peaks, 1.0, [5.0, 0.7, 0.8, 2.0])
    block: tuple[int | None, int | None] = (None, None)
    if row_blocks:
        x, block = fit_row_block(tokens, shape, time_s, peaks, (x, cost))
    passes = weight_passes(tokens, *block)
    residual = Residual.of(gemm_model(x, tokens, shape, peaks, passes), time_s)
    latency_us, efficiency, memory, p = (float(v) for v in x)
    return GemmFit(efficiency, memory, latency_us * 1e-6, p, residual, *block)


def row_block_candidates(tokens: np.ndarray) -> list[tuple[int, int | None]]:
    """(row block, most passes) candidates, one per distinct pattern of passes at ``tokens``
    (the first of each), every one with more than one pass somewhere."""
    seen: dict[tuple, tuple[int, int | None]] = {}
    unique = np.unique(tokens)
    for block in ROW_BLOCKS:
        for limit in MAX_PASSES:
            pattern = tuple(weight_passes(unique, block, limit))
            if max(pattern) > 1 and pattern not in seen:
                seen[pattern] = (block, limit)
    return list(seen.values())


def fit_row_block(
    tokens: np.ndarray, shape: tuple[np.ndarray, np.ndarray], time_s: np.ndarray,
    peaks: tuple[float, float, float], one_pass: tuple[np.ndarray, float],
) -> tuple[np.ndarray, tuple[int | None, int | None]]:  # fmt: skip
    """The best (row block, most passes) by the fit's cost, the other parameters refitted for
    each candidate; one pass (None, None) unless a candidate cuts the one-pass fit's cost
    below ``ROW_BLOCK_GAIN`` of it (a noisy table must not buy a block it does not need)."""
    best_x, best_cost = one_pass
    best: tuple[int | None, int | None] = (None, None)
    for block, limit in row_block_candidates(tokens):
        passes = weight_passes(tokens, block, limit)
        x, cost = _gemm_least_squares(tokens, shape, time_s, peaks, passes, list(one_pass[0]))
        if cost < best_cost and cost < ROW_BLOCK_GAIN * one_pass[1]:
            best_x, best_cost, best = x, cost, (block, limit)
    return best_x, best


def fit_kernel(
    tokens: np.ndarray, row_bytes: np.ndarray, time_s: np.ndarray, bandwidth: float
) -> KernelFit:
    """Fit a memory-bound kernel's (latency, memory, row bandwidth, blend) to its times."""
    time_s = _check(time_s, "kernel fit")
    tokens = np.asarray(tokens, dtype=float)
    row_bytes = np.asarray(row_bytes, dtype=float)
    weights = regime_weights(tokens)
    fit = least_squares(
        lambda v: weights * np.log(kernel_model(v, tokens, row_bytes, bandwidth) / time_s),
        [3.0, 0.5, 20.0, 2.0],
        bounds=([0.0, 1e-3, 0.1, 1.0], [1e4, 1.0, 1e5, MAX_BLEND]),
        x_scale=[1.0, 0.1, 10.0, 1.0],
    )
    latency_us, memory, row_gbps, p = fit.x
    residual = Residual.of(kernel_model(fit.x, tokens, row_bytes, bandwidth), time_s)
    return KernelFit(
        float(latency_us) * 1e-6, float(memory), float(row_gbps) * 1e9, float(p), residual
    )


@dataclass(frozen=True)
class AttentionFit:
    """Attention kernels: fixed latency, prefill FLOP rate, decode bandwidth (absolute)."""

    latency_s: float
    flops_rate: float
    bandwidth: float
    residual: Residual


def attention_model(x: np.ndarray, flops: np.ndarray, traffic: np.ndarray) -> np.ndarray:
    """``latency + max(FLOPs / rate, bytes / bandwidth)`` for ``x = (us, GFLOP/s, GB/s)``."""
    latency_us, gflops, gbps = x
    return latency_us * 1e-6 + np.maximum(flops / (gflops * 1e9), traffic / (gbps * 1e9))


def fit_attention(
    flops: np.ndarray, traffic: np.ndarray, time_s: np.ndarray, decode: np.ndarray
) -> AttentionFit:
    """Fit the cost model's attention kernel (one layer, one call) to prefill and decode times.

    Args:
        flops: FLOPs of each measured call.
        traffic: KV bytes each call reads.
        time_s: measured times.
        decode: which calls are decodes (the two kinds get equal weight).
    """
    time_s = _check(time_s, "attention fit")
    flops, traffic = np.asarray(flops, dtype=float), np.asarray(traffic, dtype=float)
    decode = np.asarray(decode, dtype=bool)
    weights = regime_weights(np.where(decode, 1, DECODE_MAX_TOKENS + 1))
    slow = time_s.max()
    start = [np.min(time_s) * 0.5e6, flops.max() / slow / 1e9, traffic.max() / slow / 1e9]
    fit = least_squares(
        lambda v: weights * np.log(attention_model(v, flops, traffic) / time_s),
        start,
        bounds=([0.0, 1e-6, 1e-6], [1e5, 1e7, 1e7]),
        x_scale="jac",
    )
    residual = Residual.of(attention_model(fit.x, flops, traffic), time_s)
    latency_us, gflops, gbps = fit.x
    return AttentionFit(float(latency_us) * 1e-6, float(gflops) * 1e9, float(gbps) * 1e9, residual)
