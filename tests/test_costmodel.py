"""Cost model against hand-computed rooflines and datasheet bounds.

``cost_params`` and ``tiny_model`` come from ``tests/conftest.py``.
"""

import numpy as np
import pytest

from sim.config import load_hardware, load_model
from sim.cost.roofline import CostModel, CostParams


def test_gemm_roofline_by_hand(cost_params, tiny_model):
    cost = CostModel(tiny_model, cost_params)
    # compute bound: 2*4096*1024*4096 FLOP at 500 TFLOP/s
    assert cost.gemm_time(4096, 1024, 4096) == pytest.approx(2 * 4096 * 1024 * 4096 / 500e12)
    # memory bound: (1024*4096 weights + 1*(1024+4096) activations) * 2 B at 1 TB/s
    assert cost.gemm_time(1, 1024, 4096) == pytest.approx((1024 * 4096 + 5120) * 2 / 1e12)


def test_decode_attention_reads_kv_at_hbm_bandwidth(cost_params, tiny_model):
    cost = CostModel(tiny_model, cost_params)
    ctx = np.array([1000, 3000])
    # per token per layer: K and V of 2 heads x 128 x 2 B = 1024 B; attend ctx + the new token
    expected = (1001 + 3001) * 1024 * 2 / 1e12
    assert cost.attention_time(np.ones(2), ctx) == pytest.approx(expected)


def test_prefill_attention_is_causal_flops(cost_params, tiny_model):
    cost = CostModel(tiny_model, cost_params)
    n = 4096
    pairs = n * (n + 1) / 2
    flops = pairs * 2 * 8 * (128 + 128) * 2  # 2 FLOP x heads x (qk + v dims) x layers
    assert cost.attention_time(np.array([n]), np.array([0])) == pytest.approx(flops / 250e12)


def test_step_is_sum_of_parts_with_overheads(cost_params, tiny_model):
    cost = CostModel(tiny_model, cost_params)
    step = cost.step(np.array([100, 1]), np.array([0, 50]), sampled=2)
    assert step.overhead_s == pytest.approx(1e-3 + 2 * 1e-5)
    assert step.total_s == pytest.approx(step.linear_s + step.attention_s + step.overhead_s)


def test_decode_batch1_h100_near_weight_streaming_bound():
    model, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    cost = CostModel(model, CostParams.from_hardware(hw))
    bound = model.weight_bytes / hw.hbm.bandwidth
    assert bound <= cost.decode_time(np.array([1024])) <= 2 * bound


def test_moe_decode_touches_top_k_experts_only(cost_params):
    model = load_model("mixtral-8x7b")
    cost = CostModel(model, cost_params)
    one_token = cost.linear_time(1, 1)
    dense_equivalent = CostModel(model.model_copy(update={"moe": None}), cost_params)
    # one token reads 2 of 8 experts: far less than all 8, more than a single MLP
    all_experts = 8 * dense_equivalent.linear_time(1, 1)
    assert dense_equivalent.linear_time(1, 1) < one_token < all_experts / 2


def test_activation_bytes_grow_linearly_with_tokens(cost_params, tiny_model):
    cost = CostModel(tiny_model, cost_params)
    a1, a2 = cost.activation_bytes(1000, 0), cost.activation_bytes(2000, 0)
    assert a2 == pytest.approx(2 * a1)
    # the sampler alone: 10 sequences x 32000 logits x 39.2 B (fp32 logits, probabilities,
    # log-probabilities, sort values and int64 indices, bf16 logits: docs/cost-model.md)
    assert cost.activation_bytes(0, 10) == pytest.approx(10 * 32000 * 39.2)
    # beside 100 tokens of forward output (100 x 1024 x 2 B), or the forward's own peak
    forward = 1000 * 2 * (2 * 1024 + 3 * 4096)
    assert cost.activation_bytes(100, 10) == pytest.approx(100 * 1024 * 2 + 10 * 32000 * 39.2)
    assert cost.activation_bytes(1000, 1) == pytest.approx(forward)


def test_prefill_with_a_cached_prefix_computes_only_the_rest(cost_params, tiny_model):
    """``prefill_time(p, cached)`` prices the ``p - cached`` tokens left, attending to the
    cached ones: one step of 600 new tokens on a context of 400, cheaper than all 1,000."""
    cost = CostModel(tiny_model, cost_params)
    rest = cost.step(np.array([600]), np.array([400]), sampled=1).total_s
    assert cost.prefill_time(1000, cached=400) == rest
    assert cost.prefill_time(1000, cached=400) < cost.prefill_time(1000)
    assert cost.prefill_time(1000, cached=0) == cost.prefill_time(1000)
