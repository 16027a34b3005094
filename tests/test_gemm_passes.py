"""Passes over a GEMM's weights (``efficiency.gemm_row_block``, ``gemm_max_passes``): the
price by hand, the neutral setting, and the config's refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim.config.loader import build_config
from sim.cost.roofline import gemm_seconds, weight_passes
from sim.errors import ConfigError
from tests.conftest import BASE, make_config
from validation.fit import gemm_model
from validation.fit import weight_passes as fit_passes


@pytest.mark.parametrize(
    ("tokens", "passes"), [(1, 1), (2, 1), (3, 2), (5, 3), (8, 4), (9, 4), (4096, 4)]
)
def test_passes_are_ceil_rows_over_block_up_to_the_limit(cost_params, tokens, passes):
    p = dataclasses.replace(cost_params, gemm_row_block=2, gemm_max_passes=4)
    assert weight_passes(p, tokens) == passes
    assert fit_passes(np.array([tokens]), 2, 4)[0] == passes  # the fit's numpy form agrees


def test_gemm_price_by_hand(cost_params):
    """A 4096 x 4096 GEMM of 5 rows, 2 bytes, 2 rows per pass: the weights read 3 times."""
    p = dataclasses.replace(cost_params, gemm_row_block=2)
    weights, rows = 4096 * 4096 * 2, 5 * (4096 + 4096) * 2
    memory = (3 * weights + rows) / 1e12  # hbm 2 TB/s x 0.5
    compute = 2 * 5 * 4096 * 4096 / 500e12
    assert memory > compute
    assert gemm_seconds(p, 5, 4096, 4096, 2.0) == pytest.approx(memory, rel=1e-12)
    # without a row block the same GEMM reads its weights once
    assert gemm_seconds(cost_params, 5, 4096, 4096, 2.0) == pytest.approx(
        (weights + rows) / 1e12, rel=1e-12
    )


@pytest.mark.parametrize("tokens", [1, 2, 7, 64, 4096])
def test_no_row_block_is_the_plain_roofline(cost_params, tokens):
    flops = 2.0 * tokens * 8192 * 1024
    traffic = (8192 * 1024 + tokens * (8192 + 1024)) * 2.0
    plain = max(flops / 500e12, traffic / 1e12)
    assert gemm_seconds(cost_params, tokens, 8192, 1024, 2.0) == plain
    # a block as tall as the GEMM changes nothing either
    tall = dataclasses.replace(cost_params, gemm_row_block=tokens)
    assert gemm_seconds(tall, tokens, 8192, 1024, 2.0) == plain


def test_the_fits_numpy_model_is_the_simulators(cost_params):
    p = dataclasses.replace(
        cost_params, gemm_row_block=3, gemm_max_passes=6, gemm_latency_s=4e-6, gemm_blend=2.5,
        gemm_memory_efficiency=0.6,
    )  # fmt: skip
    peaks = (p.peak_flops, p.hbm_bandwidth, 2.0)
    x = np.array([4.0, p.gemm_efficiency, 0.6, 2.5])
    for tokens in (1.0, 4.0, 10.0, 100.0, 4096.0):
        passes = fit_passes(np.array([tokens]), 3, 6)
        shape = (np.array([8192.0]), np.array([4096.0]))
        numpy = gemm_model(x, np.array([tokens]), shape, peaks, passes)[0]
        assert numpy == pytest.approx(gemm_seconds(p, tokens, 8192, 4096, 2.0), rel=1e-12)


def test_the_key_is_read_into_the_config():
    plain = make_config()
    blocked = make_config("hardware.efficiency.gemm_row_block=2")
    assert blocked.hardware.efficiency.gemm_row_block == 2
    assert plain.hardware.efficiency.gemm_row_block is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"gemm_max_passes": 4},
            "hardware.efficiency.gemm_max_passes.*expected gemm_row_block too",
        ),
        ({"gemm_row_block": 0}, "hardware.efficiency.gemm_row_block"),
        ({"gemm_row_block": 2, "gemm_max_passes": 1}, "hardware.efficiency.gemm_max_passes"),
        ({"gemm_row_block": 2.5}, "hardware.efficiency.gemm_row_block"),
    ],
)
def test_bad_values_are_refused_naming_the_key(overrides, message):
    data = BASE | {"hardware": {"profile": "h100-sxm", "efficiency": overrides}}
    with pytest.raises(ConfigError, match=message):
        build_config(data, "run.yaml")
