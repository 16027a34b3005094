"""The cost model's calibrated terms against hand-computed figures; defaults stay the roofline.

``cost_params`` and ``tiny_model`` come from ``tests/conftest.py``.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import yaml

from sim.config import load_hardware, load_model
from sim.config.hardware import HardwareSpec
from sim.config.loader import load_profile, validate
from sim.cost.roofline import CostModel, CostParams, KernelParams, KernelSet, kernel_seconds
from sim.errors import ConfigError

LATENCY_ONLY = KernelSet(  # no per-row term, streaming at half of 2 TB/s, hard max
    norm=KernelParams(1e-6, 0.5),
    rope=KernelParams(2e-6, 0.5),
    activation=KernelParams(3e-6, 0.5),
    residual_add=KernelParams(4e-6, 0.5),
    embedding=KernelParams(5e-6, 0.5),
)


def test_gemm_with_latency_and_linear_blend_is_a_sum(cost_params, tiny_model):
    params = dataclasses.replace(
        cost_params, gemm_memory_efficiency=0.25, gemm_latency_s=2e-6, gemm_blend=1.0
    )
    compute = 2 * 4096 * 1024 * 4096 / 500e12  # 500 TFLOP/s achieved
    memory = (1024 * 4096 + 4096 * (1024 + 4096)) * 2 / 0.5e12  # 0.25 x 2 TB/s
    assert CostModel(tiny_model, params).gemm_time(4096, 1024, 4096) == pytest.approx(
        2e-6 + compute + memory
    )


def test_gemm_blend_two_is_the_euclidean_norm(cost_params, tiny_model):
    params = dataclasses.replace(cost_params, gemm_blend=2.0)
    compute = 2 * 256 * 1024 * 4096 / 500e12
    memory = (1024 * 4096 + 256 * 5120) * 2 / 1e12  # hbm efficiency 0.5 when gemm_memory unset
    expected = (compute**2 + memory**2) ** 0.5
    assert CostModel(tiny_model, params).gemm_time(256, 1024, 4096) == pytest.approx(expected)


def test_kernel_floor_then_streaming(cost_params):
    kernel = KernelParams(latency_s=4e-6, memory_efficiency=0.5, row_bandwidth=20e9)
    # one row of 32 KiB: floor 4 us + 32768 B / 20 GB/s = 5.6384 us beats streaming 32.8 ns
    assert kernel_seconds(cost_params, kernel, 1, 32768) == pytest.approx(5.6384e-6)
    # 100k rows stream at 1 TB/s: 3.2768 ms
    assert kernel_seconds(cost_params, kernel, 100_000, 32768) == pytest.approx(3.2768e-3)
    assert kernel_seconds(cost_params, None, 100, 32768) == 0.0
    assert kernel_seconds(cost_params, kernel, 0, 32768) == 0.0


def test_elementwise_time_by_hand(cost_params, tiny_model):
    cost = CostModel(tiny_model, dataclasses.replace(cost_params, kernels=LATENCY_ONLY))
    # one token: latencies only: 2 layers x (2 norms x 1 + rope 2 + act 3 + add 4) + embedding 5
    assert cost.elementwise_time(1) == pytest.approx(27e-6)
    # a million tokens stream: bytes per token per layer = norms 2 x 4096 + rope 2x(8+2)x128x2
    # + act 3x4096x2 + add 3x1024x2 = 44032; two layers + embedding 4096 = 92160 B at 1 TB/s
    assert cost.elementwise_time(10**6) == pytest.approx(10**6 * 92160 / 1e12)


def test_elementwise_kernels_are_part_of_the_linear_time(cost_params, tiny_model):
    plain, calibrated = (
        CostModel(tiny_model, cost_params),
        CostModel(tiny_model, dataclasses.replace(cost_params, kernels=LATENCY_ONLY)),
    )
    for tokens in (1, 300, 5000):
        gap = calibrated.linear_time(tokens, 1) - plain.linear_time(tokens, 1)
        assert gap == pytest.approx(calibrated.elementwise_time(tokens))
    assert plain.elementwise_time(100) == 0.0


def test_moe_activation_runs_over_top_k_rows_of_expert_width(cost_params):
    model = load_model("mixtral-8x7b")
    only_act = KernelSet(activation=KernelParams(3e-6, 0.5, row_bandwidth=10e9, blend=2.0))
    cost = CostModel(model, dataclasses.replace(cost_params, kernels=only_act))
    row = 3 * 14336 * 2  # SwiGLU reads gate and up, writes the product (bf16)
    expected = 32 * kernel_seconds(cost.params, only_act.activation, 2 * 100, row)
    assert cost.elementwise_time(100) == pytest.approx(expected)


def test_profile_without_calibrated_keys_keeps_the_plain_roofline(tiny_model):
    params = CostParams.from_hardware(load_hardware("cpu-host"))
    assert params.kernels is None and params.gemm_latency_s == 0.0
    assert params.gemm_bandwidth == params.memory_bandwidth
    cost = CostModel(tiny_model, params)
    flops, traffic = 2 * 64 * 1024 * 4096, (1024 * 4096 + 64 * 5120) * 2
    expected = max(flops / params.gemm_flops, traffic / params.memory_bandwidth)
    assert cost.gemm_time(64, 1024, 4096) == expected  # bit for bit


def test_bundled_gpu_profiles_carry_the_fitted_kernels():
    for name in ("h100-sxm", "a100-80g-sxm"):
        params = CostParams.from_hardware(load_hardware(name))
        assert params.kernels is not None and params.kernels.norm is not None
        assert 0 < params.gemm_latency_s < 20e-6 and 1.0 <= params.gemm_blend < 10


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (
            {"nrom": {"latency": "1us", "memory": 0.5}},
            "efficiency.kernels.nrom': unknown key (did you mean 'norm'?)",
        ),
        ({"norm": {"latency": "1us", "memory": 1.5}}, "efficiency.kernels.norm.memory"),
        ({"norm": {"latency": "1GB/s", "memory": 0.5}}, "efficiency.kernels.norm.latency"),
        (
            {"norm": {"latency": "1us", "memory": 0.5, "blend": 0.5}},
            "efficiency.kernels.norm.blend",
        ),
    ],
)
def test_bad_calibrated_keys_name_the_key(patch, message):
    data = load_profile("hardware", "cpu-host")
    data["efficiency"] = {**data["efficiency"], "kernels": patch}
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        validate(HardwareSpec, data, "my.yaml")
    assert str(info.value).startswith("my.yaml")


def test_calibrated_keys_round_trip_through_yaml():
    text = yaml.safe_dump(load_hardware("h100-sxm").model_dump(mode="json"))
    again = validate(HardwareSpec, yaml.safe_load(text), "<dump>")
    assert CostParams.from_hardware(again) == CostParams.from_hardware(load_hardware("h100-sxm"))
    assert np.isfinite(CostParams.from_hardware(again).gemm_blend)
