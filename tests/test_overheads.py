"""The runtime's host overheads and the calibrated attention terms, against closed forms.

``cost_params`` (1000 TFLOP/s, 2 TB/s; attention at 250 TFLOP/s, memory at 1 TB/s) and
``tiny_model`` (2 layers, hidden 1024, 8 heads / 2 KV heads of 128, gated FFN 4096, vocab
32000, bf16) come from ``tests/conftest.py``.
"""

import dataclasses

import numpy as np
import pytest

from sim.cost.roofline import CostModel, CostParams
from sim.errors import ConfigError
from sim.run import simulate
from tests.conftest import make_config

STEP, SEQ = 300e-6, 20e-6
KV_BYTES = 2 * 2 * 128 * 2  # K and V, 2 KV heads of 128, bf16: per token and layer
# the tiny model's weights read by one decode token: per layer QKV 1024x1536, O 1024x1024,
# up+gate 1024x8192, down 4096x1024; the LM head 1024x32000
LAYER_WEIGHTS = 1024 * 1536 + 1024 * 1024 + 1024 * 8192 + 4096 * 1024
ACTIVATIONS = (1024 + 1536) + (1024 + 1024) + (1024 + 8192) + (4096 + 1024)  # one token's rows
LM_HEAD = 1024 * 32000 + (1024 + 32000)


@pytest.fixture
def runtime(cost_params):
    """``cost_params`` with host costs, no per-layer overhead, and decode attention at half
    the peak bandwidth with 5 us per call."""
    return dataclasses.replace(
        cost_params,
        step_overhead_s=STEP,
        sequence_overhead_s=SEQ,
        layer_overhead_s=0.0,
        decode_attention_efficiency=0.25,
        decode_attention_latency_s=5e-6,
    )


def test_batch1_decode_step_by_hand(runtime, tiny_model):
    cost = CostModel(tiny_model, runtime)
    context = 1000
    weights = (2 * (LAYER_WEIGHTS + ACTIVATIONS) + LM_HEAD) * 2 / 1e12  # bytes at 1 TB/s
    attention = 2 * ((context + 1) * KV_BYTES / 0.5e12 + 5e-6)  # 2 layers at 2 TB/s x 0.25
    expected = weights + attention + STEP + SEQ
    assert cost.decode_time(np.array([context])) == pytest.approx(expected, rel=1e-12)


def test_batch_b_decode_grows_by_b_sequence_costs(runtime, tiny_model):
    contexts = np.full(16, 500)
    with_seq = CostModel(tiny_model, runtime).step(np.ones(16), contexts, 16)
    without = CostModel(tiny_model, dataclasses.replace(runtime, sequence_overhead_s=0.0))
    base = without.step(np.ones(16), contexts, 16)
    assert with_seq.overhead_s == pytest.approx(STEP + 16 * SEQ, rel=1e-12)
    assert with_seq.total_s - base.total_s == pytest.approx(16 * SEQ, rel=1e-9)
    assert (with_seq.linear_s, with_seq.attention_s) == (base.linear_s, base.attention_s)


def test_prefill_extra_keys_by_hand(runtime, tiny_model):
    cost = CostModel(tiny_model, dataclasses.replace(runtime, attention_extra_keys=300))
    n = 4096
    pairs = n * ((n + 1) / 2 + 300)
    flops = pairs * 2 * 8 * (128 + 128) * 2  # 2 FLOP x heads x (qk + v dims) x layers
    assert cost.attention_time(np.array([n]), np.array([0])) == pytest.approx(flops / 250e12)


def test_neutral_values_give_the_plain_roofline(cost_params, tiny_model):
    """No decode efficiency or latency of its own: decode reads at ``hbm``, pays
    ``attention_latency``; no host costs: the old fixed overhead."""
    explicit = dataclasses.replace(
        cost_params,
        attention_latency_s=7e-6,
        decode_attention_efficiency=cost_params.hbm_efficiency,
        decode_attention_latency_s=7e-6,
    )
    neutral = dataclasses.replace(cost_params, attention_latency_s=7e-6)
    new, ctx = np.array([1, 1, 300]), np.array([900, 40, 0])
    a = CostModel(tiny_model, explicit).step(new, ctx, 3)
    b = CostModel(tiny_model, neutral).step(new, ctx, 3)
    assert a == b
    assert b.overhead_s == cost_params.step_overhead_s + 2 * cost_params.layer_overhead_s


def test_decode_steps_equal_step_with_the_new_terms(runtime, tiny_model):
    cost = CostModel(tiny_model, dataclasses.replace(runtime, attention_extra_keys=301))
    context = np.array([100, 2000, 37])
    linear, attention, overhead = cost.decode_steps(context, 5)
    for j in range(5):
        step = cost.step(np.ones(3, dtype=np.int64), context + j, 3)
        assert (step.linear_s, step.attention_s, step.overhead_s) == (
            linear,
            attention[j],
            overhead[j],
        )


def _alone_ttft(*settings: str) -> tuple[float, float]:
    """One 1000-token request alone, 250 us + 40 us of host time a step: (its TTFT, the
    kernels and per-layer overhead of its prefill step)."""
    prompt = 1000
    config = make_config(
        "hardware.efficiency.step_overhead=250us",
        "hardware.efficiency.sequence_overhead=40us",
        *settings,
        workload={
            "kind": "synthetic",
            "num_requests": 1,
            "arrival": {"kind": "all_at_once"},
            "prompt_tokens": prompt,
            "output_tokens": 3,
        },
    )
    params = CostParams.from_hardware(config.hardware)
    cost = CostModel(config.model, params, config.kv_dtype_bytes)
    kernels = cost.linear_time(prompt, 1) + cost.attention_time(np.array([prompt]), np.array([0]))
    layers = config.model.layers * params.layer_overhead_s
    return simulate(config).requests.ttft_s.iloc[0], kernels + layers


def test_one_request_alone_ttft_is_prefill_price_plus_host_costs():
    ttft, prefill = _alone_ttft()
    assert ttft == pytest.approx(prefill + 250e-6 + 40e-6, rel=1e-12)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("hardware.efficiency.decode_attention=1.5", "less than or equal to 1 (got 1.5)"),
        ("hardware.efficiency.sequence_overhead=1s", "at most 10 ms"),
        ("hardware.efficiency.async_step_gap=1s", "at most 100 ms"),
        ("hardware.efficiency.attention_extra_keys=-3", "greater than or equal to 0"),
    ],
)
def test_bad_values_name_the_key(setting, message):
    with pytest.raises(ConfigError) as error:
        make_config(setting)
    assert setting.split("=")[0] in str(error.value) and message in str(error.value)


GAP = 150e-6  # efficiency.async_step_gap in the asynchronous tests


@pytest.fixture
def asynchronous(runtime):
    """``runtime`` scheduling asynchronously, with a step gap and a per-layer overhead."""
    return dataclasses.replace(
        runtime, async_scheduling=True, async_step_gap_s=GAP, layer_overhead_s=2e-6
    )


def test_async_step_hides_host_time_under_longer_kernels(asynchronous, runtime, tiny_model):
    """Host time shorter than the step's kernels: the GPU idles only the step gap."""
    contexts = np.full(4, 50_000)  # ~0.8 ms of decode attention, against 380 us of host time
    step = CostModel(tiny_model, asynchronous).step(np.ones(4), contexts, 4)
    kernels = step.linear_s + step.attention_s + 2 * 2e-6
    assert kernels > STEP + 4 * SEQ
    assert step.idle_host_s == GAP
    assert step.total_s == pytest.approx(kernels + GAP, rel=1e-12)
    sync = CostModel(tiny_model, dataclasses.replace(asynchronous, async_scheduling=False))
    assert sync.step(np.ones(4), contexts, 4).total_s == pytest.approx(
        kernels + STEP + 4 * SEQ, rel=1e-12
    )


def test_async_step_waits_for_host_time_longer_than_its_kernels(asynchronous, tiny_model):
    """Host time longer than the step's kernels: the step lasts the host time and the gap."""
    contexts = np.full(64, 10)  # tiny kernels, 300 us + 64 x 20 us of host time
    step = CostModel(tiny_model, asynchronous).step(np.ones(64), contexts, 64)
    kernels = step.linear_s + step.attention_s + 2 * 2e-6
    host = STEP + 64 * SEQ
    assert kernels < host
    assert step.idle_host_s == pytest.approx(GAP + host - kernels, rel=1e-12)
    assert step.total_s == pytest.approx(host + GAP, rel=1e-12)


def test_async_decode_steps_equal_step(asynchronous, tiny_model):
    """The vectorised decode steps price the gap step by step, where host time and kernels
    cross over as the contexts grow."""
    context = np.array([100, 20_000, 37])
    ones = np.ones(3, dtype=np.int64)
    middle = CostModel(tiny_model, asynchronous).step(ones, context + 200, 3)
    kernels = middle.linear_s + middle.attention_s + 2 * 2e-6
    # host time as long as the kernels of step 200: longer before, shorter after
    cost = CostModel(
        tiny_model, dataclasses.replace(asynchronous, step_overhead_s=kernels - 3 * SEQ)
    )
    linear, attention, overhead = cost.decode_steps(context, 400)
    first, last = (cost.step(ones, context + j, 3).idle_host_s for j in (0, 399))
    assert first > GAP and last == GAP  # crosses over
    for j in range(0, 400, 7):
        step = cost.step(ones, context + j, 3)
        assert (step.linear_s, step.attention_s, step.overhead_s) == (
            linear,
            attention[j],
            overhead[j],
        )


def test_one_request_alone_ttft_under_async_scheduling_is_prefill_price_plus_gap():
    ttft, prefill = _alone_ttft(
        "engine.async_scheduling=true", "hardware.efficiency.async_step_gap=120us"
    )
    assert prefill > 290e-6  # the host time hides under the prefill
    assert ttft == pytest.approx(prefill + 120e-6, rel=1e-12)
