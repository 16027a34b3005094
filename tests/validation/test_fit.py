"""Fits recover known parameters from synthetic data, and use the simulator's equations."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from sim.cost.roofline import KernelParams, gemm_seconds, kernel_seconds
from sim.errors import KvsimError
from validation.fit import (
    fit_affine,
    fit_gemm,
    fit_kernel,
    gemm_model,
    kernel_model,
    regime_weights,
    soft_max,
)

RNG_SEED = 0
PEAKS = (989e12, 3.35e12, 2.0)  # H100 SXM bf16 FLOP/s, HBM bytes/s, bytes per element
SHAPES = [(8192, 10240), (8192, 8192), (8192, 57344), (28672, 8192), (4096, 6144), (2560, 2560)]
TOKENS = np.unique(np.geomspace(1, 4096, 40).round())


def noisy(times: np.ndarray, sigma: float) -> np.ndarray:
    """Times with multiplicative log-normal noise of ``sigma`` (fixed seed)."""
    return times * np.exp(np.random.default_rng(RNG_SEED).normal(0.0, sigma, len(times)))


def test_link_fit_recovers_latency_and_bandwidth_within_2_percent():
    sizes = np.repeat(np.geomspace(4 * 2**10, 2**30, 19), 5)  # 4 KiB .. 1 GiB, 5 repeats
    times = noisy(10e-6 + sizes / 50e9, sigma=0.03)
    fit = fit_affine(sizes, times)
    assert fit.intercept == pytest.approx(10e-6, rel=0.02)
    assert 1.0 / fit.slope == pytest.approx(50e9, rel=0.02)
    assert fit.residual.median_ape < 0.03


def test_gemm_fit_recovers_known_parameters_within_2_percent():
    true = np.array([5.0, 0.70, 0.90, 1.6])  # latency us, efficiency, memory, blend
    tokens = np.tile(TOKENS, len(SHAPES))
    fan_in = np.repeat([s[0] for s in SHAPES], len(TOKENS)).astype(float)
    fan_out = np.repeat([s[1] for s in SHAPES], len(TOKENS)).astype(float)
    times = noisy(gemm_model(true, tokens, (fan_in, fan_out), PEAKS), sigma=0.02)
    fit = fit_gemm(tokens, (fan_in, fan_out), times, PEAKS)
    got = [fit.latency_s * 1e6, fit.efficiency, fit.memory, fit.blend]
    assert got == pytest.approx(list(true), rel=0.02)


def test_kernel_fit_recovers_known_parameters_within_2_percent():
    true = np.array([4.0, 0.40, 20.0, 3.0])  # latency us, memory, row GB/s, blend
    widths = [2 * 2560, 2 * 4096, 2 * 5120, 2 * 8192, 3 * 14336, 3 * 28672]  # elements per row
    dense = np.unique(np.geomspace(1, 4096, 80).round())
    row_bytes = np.repeat(np.array(widths, dtype=float) * 2, len(dense))
    tokens = np.tile(dense, len(widths))
    times = noisy(kernel_model(true, tokens, row_bytes, PEAKS[1]), sigma=0.02)
    fit = fit_kernel(tokens, row_bytes, times, PEAKS[1])
    got = [fit.latency_s * 1e6, fit.memory, fit.row_bandwidth / 1e9, fit.blend]
    assert got == pytest.approx(list(true), rel=0.02)


def test_fit_equations_are_the_simulators(cost_params):
    x_gemm, x_kernel = np.array([5.0, 0.7, 0.9, 1.6]), np.array([4.0, 0.4, 20.0, 3.0])
    params = dataclasses.replace(
        cost_params,
        peak_flops=PEAKS[0],
        hbm_bandwidth=PEAKS[1],
        gemm_efficiency=0.7,
        gemm_memory_efficiency=0.9,
        gemm_latency_s=5e-6,
        gemm_blend=1.6,
    )
    kernel = KernelParams(latency_s=4e-6, memory_efficiency=0.4, row_bandwidth=20e9, blend=3.0)
    for tokens in (1.0, 100.0, 4096.0):
        numpy_gemm = gemm_model(
            x_gemm, np.array([tokens]), (np.array([8192.0]), np.array([8192.0])), PEAKS
        )
        numpy_kernel = kernel_model(x_kernel, np.array([tokens]), np.array([32768.0]), PEAKS[1])
        assert numpy_gemm[0] == pytest.approx(
            gemm_seconds(params, tokens, 8192, 8192, 2.0), rel=1e-12
        )
        assert numpy_kernel[0] == pytest.approx(
            kernel_seconds(params, kernel, tokens, 32768.0), rel=1e-12
        )


def test_soft_max_closed_forms():
    a, b = np.array([3.0, 0.0, 1e-9]), np.array([4.0, 0.0, 1e-9])
    assert soft_max(a, b, 2.0) == pytest.approx([5.0, 0.0, math.sqrt(2) * 1e-9])
    assert soft_max(a, b, 1.0) == pytest.approx([7.0, 0.0, 2e-9])
    assert soft_max(a, b, 64.0)[0] == pytest.approx(4.0, rel=1e-3)


def test_regimes_get_equal_weight():
    tokens = np.array([1, 2, 4, 8, 100, 200, 300, 400, 500, 600, 700, 800])
    w = regime_weights(tokens)
    assert (w[tokens <= 64] ** 2).sum() == pytest.approx((w[tokens > 64] ** 2).sum())


def test_fits_refuse_too_few_or_bad_points():
    with pytest.raises(KvsimError, match="at least 4"):
        fit_affine([1, 2], [1.0, 2.0])
    with pytest.raises(KvsimError, match="positive"):
        fit_affine([1, 2, 3, 4], [1.0, 0.0, 2.0, 3.0])


def test_attention_fit_recovers_latency_rate_and_bandwidth_within_2_percent():
    from validation.fit import attention_model, fit_attention

    true = np.array([50.0, 20.0, 4.0])  # latency us, prefill GFLOP/s, decode GB/s
    per_pair, per_token = 1024.0, 1024.0  # FLOPs per (query, key) pair; KV bytes per token
    lengths = np.geomspace(16, 2048, 12).round()
    keys = np.outer([1, 2, 4, 8, 16, 32], [32, 128, 512, 2048]).ravel()
    flops = np.concatenate([lengths * (lengths + 1) / 2 * per_pair, keys * per_pair])
    traffic = np.concatenate([lengths * per_token, keys * per_token])
    decode = np.arange(len(flops)) >= len(lengths)
    times = noisy(attention_model(true, flops, traffic), sigma=0.02)
    fit = fit_attention(flops, traffic, times, decode)
    got = [fit.latency_s * 1e6, fit.flops_rate / 1e9, fit.bandwidth / 1e9]
    assert got == pytest.approx(list(true), rel=0.02)


def test_block_copy_cost_recovers_the_half_efficiency_size():
    import pandas as pd

    from validation.devicecal import fit_link

    latency, bandwidth, half, block = 10e-6, 50e9, 24576.0, 65536.0
    sizes = np.repeat(np.geomspace(4096, 2**28, 17), 3)
    counts = np.array([1, 4, 16, 64, 256])
    rows = [{"kind": "copy", "op": "copy", "direction": "host", "pinned": False, "bytes": s,
             "tokens": 0, "time_s": latency + s / bandwidth} for s in sizes]  # fmt: skip
    rows += [{"kind": "copy_blocks", "op": "gathered", "direction": "host", "pinned": False,
              "bytes": n * block, "tokens": n,
              "time_s": latency + n * (block + half) / bandwidth} for n in counts]  # fmt: skip
    table = pd.DataFrame(rows)
    table["time_s"] = noisy(table.time_s.to_numpy(), sigma=0.01)
    link, fitted_half = fit_link(table, block)
    assert link.intercept == pytest.approx(latency, rel=0.02)
    assert 1 / link.slope == pytest.approx(bandwidth, rel=0.02)
    assert fitted_half == pytest.approx(half, rel=0.1)  # a difference of two fitted figures
