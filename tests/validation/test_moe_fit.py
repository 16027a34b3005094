"""The fused-MoE routed experts: one roofline over the touched experts, its FLOPs on the rows
padded to the kernel's tile height, compute at ``efficiency.moe_gemm`` times the dense GEMM's
plus ``efficiency.moe_row_time`` per padded row, weight streaming at
``efficiency.moe_gemm_memory`` times the dense GEMM's, plus ``efficiency.moe_latency`` per call;
their fit to published kernel times, and the profiles that carry them."""

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from sim.config import load_hardware
from sim.config.hardware import Efficiency
from sim.config.loader import load_model
from sim.config.parallel import shard_model
from sim.cost.roofline import CostModel, CostParams, moe_block_rows, moe_padded_rows
from validation import moefit
from validation.profile import efficiency_text


@pytest.fixture(scope="module")
def h100_fit():
    return moefit.fit("h100-sxm")


@pytest.fixture(scope="module")
def a100_fit():
    return moefit.fit("a100-80g-sxm")


def _mixtral(
    params: CostParams, e: float = 1.0, latency: float = 0.0, em: float = 1.0, row: float = 0.0
):
    shard = shard_model(load_model("mixtral-8x7b"), 2)
    return CostModel(
        shard,
        dataclasses.replace(
            params,
            moe_gemm_efficiency=e,
            moe_memory_efficiency=em,
            moe_latency_s=latency,
            moe_row_s=row,
        ),
    )


def _padded_by_hand(tokens: int, top_k: int, experts: int, block: int) -> Fraction:
    """E * block * E[ceil(n / block)], n ~ Binomial(tokens, top_k / experts), exactly."""
    p = Fraction(top_k, experts)
    tiles = sum(
        math.comb(tokens, n) * p**n * (1 - p) ** (tokens - n) * math.ceil(n / block)
        for n in range(tokens + 1)
    )
    return experts * block * tiles


def test_padding_by_hand():
    """Two experts, one picked per token, two tokens, tiles of 16 rows: an expert holds 0, 1 or
    2 rows with probability 1/4, 1/2, 1/4 and takes a tile unless empty, so 2 x 16 x 3/4 = 24
    rows. Four experts, two picked, four tokens, tiles of 2: n = 0..4 with 1, 4, 6, 4, 1 in 16
    take 0, 1, 1, 2, 2 tiles: 4 x 2 x 20/16 = 10 rows."""
    assert moe_padded_rows(2, 1, 2, 16) == pytest.approx(24.0, rel=1e-12)
    assert moe_padded_rows(4, 2, 4, 2) == pytest.approx(10.0, rel=1e-12)
    assert moe_padded_rows(0, 2, 8, 16) == 0.0
    assert moe_padded_rows(5, 8, 8, 4) == 8 * 4 * 2  # every expert gets all 5 rows


@pytest.mark.parametrize(
    ("tokens", "top_k", "experts", "block"),
    [(1, 2, 8, 16), (7, 2, 8, 16), (64, 8, 128, 16), (300, 8, 128, 32), (1024, 2, 8, 128)],
)
def test_padding_is_the_exact_binomial_expectation(tokens, top_k, experts, block):
    exact = float(_padded_by_hand(tokens, top_k, experts, block))
    assert moe_padded_rows(tokens, top_k, experts, block) == pytest.approx(exact, rel=1e-9)


def test_padding_at_prefill_sizes_of_many_small_experts():
    """Qwen3-30B-A3B at 4096 tokens: 256 rows an expert on average (sd 15.5), tiles of 128, so
    about half the experts take a third, nearly empty tile: ~1.24 x the routed rows. Mixtral at
    one token: two experts of one row each, one 16-row tile each."""
    routed = 4096 * 8
    assert moe_padded_rows(4096, 8, 128, 128) / routed == pytest.approx(1.24, abs=0.01)
    assert moe_padded_rows(1, 2, 8, 16) == pytest.approx(32.0, rel=1e-12)


def test_the_tile_height_is_the_power_of_two_holding_the_mean_group():
    assert [moe_block_rows(g) for g in (0.5, 1, 16, 17, 32, 33, 64, 65, 128, 129, 4096)] == [
        16, 16, 16, 32, 32, 64, 64, 128, 128, 128, 128,
    ]  # fmt: skip


# BLOCK_SIZE_M of tuned fused_moe config files by token count (the files' keys 1 .. 4096), at
# github.com/vllm-project/vllm/blob/<commit>/vllm/model_executor/layers/fused_moe/configs/<file>:
#   E=128,N=768,device_name=NVIDIA_H200.json at 4652ef5d87ed8cf43f8c6f09d31cbf3b87d9b84e,
#   E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json at 4466f1b5f2019d231de0f8ad1a709c87fdfcb2e9,
#   E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json at 02ba322d6c22e21885041c524f4a095e25e9bf71;
# github.com/sgl-project/sglang/blob/9cb1a2142e0c4900bf4ccd8b218a4966c53d4acd/python/sglang/srt/
#   layers/moe/fused_moe_triton/configs/triton_3_2_0/
#   E=128,N=768,device_name=NVIDIA_A800-SXM4-80GB.json
# The three E=128 files use 16 rows up to 128 tokens.
KEYS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
SMALL = (16,) * 11
TUNED_TILES = {
    "H200 E=128,N=768": (128, 8, (*SMALL, 32, 64, 128, 128, 128, 128, 128)),
    "H100 E=128,N=768": (128, 8, (*SMALL, 32, 64, 64, 128, 128, 128, 128)),
    "A800 E=128,N=768": (128, 8, (*SMALL, 32, 64, 64, 128, 64, 64, 128)),
    "H100 E=8,N=7168": (8, 2, (*(16,) * 7, 32, 32, 32, 64, 64, 64, 128, 128, 128, 128, 128)),
}


def test_the_tile_rule_is_the_tuned_configs_choice():
    """The power of two at or above the mean group, within [16, 128], is the tuned files' tile
    at 66 of their 72 token counts: H100 Qwen3 18 of 18, H200 17 (128 at 1024 tokens, the rule
    64), A800 16 (64 at 2048 and 3072, the rule 128), Mixtral H100 15."""
    hits = {}
    for name, (experts, top_k, tiles) in TUNED_TILES.items():
        rule = []
        for tokens in KEYS:
            touched = experts * (1 - (1 - top_k / experts) ** tokens)
            rule.append(moe_block_rows(tokens * top_k / touched))
        hits[name] = sum(a == b for a, b in zip(rule, tiles, strict=True))
    assert hits == {
        "H200 E=128,N=768": 17, "H100 E=128,N=768": 18, "A800 E=128,N=768": 16,
        "H100 E=8,N=7168": 15,
    }  # fmt: skip


@pytest.mark.parametrize("tokens", [1, 7, 64, 4096])
def test_the_fused_call_is_one_padded_roofline_over_the_touched_experts(cost_params, tokens):
    """Mixtral at TP 2 (8 experts of 7168 per GPU, top-2), written out by hand: each expert
    GEMM's FLOPs over the routed rows padded to the tile height, the touched experts' weights
    read once and the routed rows' activations, as one roofline, compute at e times the dense
    GEMM's plus 3 ns per padded row, memory at e_m times the dense GEMM's; no per-GEMM
    latency, however many experts the call touches."""
    params = dataclasses.replace(cost_params, gemm_latency_s=1e-3)  # paid by dense GEMMs only
    touched = 8 * (1 - (1 - 2 / 8) ** tokens)
    routed = 2 * tokens
    block = min(128, max(16, 2 ** math.ceil(math.log2(routed / touched))))
    padded = float(_padded_by_hand(tokens, 2, 8, block)) if tokens < 100 else None
    padded = padded or moe_padded_rows(tokens, 2, 8, block)
    expected = 0.0
    for fan_in, fan_out in ((4096, 2 * 7168), (7168, 4096)):
        flops = 2 * padded * fan_in * fan_out
        traffic = touched * fan_in * fan_out * 2 + routed * (fan_in + fan_out) * 2
        compute = flops / (params.gemm_flops * 1.5) + padded * 3e-9
        expected += max(compute, traffic / (params.gemm_bandwidth * 0.8))
    got = _mixtral(params, e=1.5, em=0.8, row=3e-9).routed_experts_time(tokens)
    assert got == pytest.approx(expected, rel=1e-9)


def test_compute_and_memory_efficiencies_scale_their_own_side(cost_params):
    """At one token (memory-bound) the call's time is the memory side's: moe_gemm_memory
    divides it, moe_gemm does not; at 4096 tokens (compute-bound) the other way round."""
    base = _mixtral(cost_params)
    assert _mixtral(cost_params, e=2.0).routed_experts_time(1) == base.routed_experts_time(1)
    assert _mixtral(cost_params, em=2.0).routed_experts_time(1) == pytest.approx(
        base.routed_experts_time(1) / 2.0, rel=1e-12
    )
    assert _mixtral(cost_params, em=2.0).routed_experts_time(4096) == pytest.approx(
        base.routed_experts_time(4096), rel=1e-12
    )
    assert _mixtral(cost_params, e=1.25).routed_experts_time(4096) == pytest.approx(
        base.routed_experts_time(4096) / 1.25, rel=1e-12
    )


@pytest.mark.parametrize("tokens", [1, 7, 64, 4096])
def test_one_moe_layer_is_the_routed_time_plus_the_call_latency(cost_params, tokens):
    old, new = _mixtral(cost_params, 1.6), _mixtral(cost_params, 1.6, latency=25e-6)
    assert new._moe_time(tokens) == old._moe_time(tokens) + 25e-6
    assert new.routed_experts_time(tokens) == old.routed_experts_time(tokens)


def test_the_call_latency_is_paid_once_per_moe_layer(cost_params):
    old, new = _mixtral(cost_params), _mixtral(cost_params, latency=25e-6)
    layers = old.model.moe_layers
    assert new._linear_time(16, 16) - old._linear_time(16, 16) == pytest.approx(layers * 25e-6)
    assert new._linear_time(0, 0) == old._linear_time(0, 0) == 0.0
    assert old.routed_experts_time(0) == 0.0


def test_the_row_time_adds_to_the_compute_side_only(cost_params):
    """At 4096 tokens (compute-bound, hard max) each of Mixtral's two expert GEMMs adds its
    padded rows x r; at one token (memory-bound: two 16-row tiles, 32 rows) 1 ns a row hides
    under the weights' streaming."""
    base, rowed = _mixtral(cost_params), _mixtral(cost_params, row=2e-9)
    padded = base.routed_rows(4096)[2]
    assert rowed.routed_experts_time(4096) == pytest.approx(
        base.routed_experts_time(4096) + 2 * padded * 2e-9, rel=1e-12
    )
    assert base.routed_rows(1)[2] == pytest.approx(32.0, rel=1e-12)
    assert _mixtral(cost_params, row=1e-9).routed_experts_time(1) == base.routed_experts_time(1)
    assert rowed.routed_experts_time(0) == 0.0


def test_the_defaults_are_the_bare_fused_roofline(cost_params):
    params = CostParams.from_hardware(load_hardware("mi300x"))
    assert params.moe_gemm_efficiency == params.moe_memory_efficiency == 1.0
    assert params.moe_latency_s == params.moe_row_s == 0.0
    assert Efficiency().moe_gemm == Efficiency().moe_gemm_memory == 1.0
    assert Efficiency().moe_latency == Efficiency().moe_row_time == 0.0
    bad_values = (
        {"moe_gemm": 0.0}, {"moe_gemm_memory": 0.0}, {"moe_latency": -1e-6},
        {"moe_row_time": -1e-9},
    )  # fmt: skip
    for bad in bad_values:
        with pytest.raises(ValueError):
            Efficiency(**bad)


def _synthetic(compute, memory, t, rows=None):
    """Parts of one GEMM a row, no activation, the hard max."""
    gemms = [[(c, m)] for c, m in zip(compute, memory, strict=True)]
    zeros = np.zeros(len(t))
    padded = zeros if rows is None else np.asarray(rows, dtype=float)
    return moefit.Parts(gemms, np.full(len(t), math.inf), zeros, zeros, padded)


def test_the_fit_recovers_known_parameters():
    """Rows priced by hand at e = 1.25, e_m = 0.8, l = 20 us under the hard max: the first three
    memory-bound (memory / 0.8 above compute / 1.25), the last three compute-bound. The fit
    returns the three exactly, and no time per row."""
    compute = np.array([10e-6, 20e-6, 40e-6, 400e-6, 800e-6, 1600e-6])
    memory = np.array([100e-6, 110e-6, 130e-6, 150e-6, 200e-6, 300e-6])
    rows = np.array([16, 32, 64, 2560, 640, 1280])  # not in proportion to compute
    t = np.maximum(compute / 1.25, memory / 0.8) + 20e-6
    e, em, r, lat = moefit.solve(_synthetic(compute, memory, t, rows), t)
    assert (e, em, lat) == (
        pytest.approx(1.25, rel=1e-6),
        pytest.approx(0.8, rel=1e-6),
        pytest.approx(20e-6, rel=1e-5),
    )
    assert r == pytest.approx(0.0, abs=1e-13)
    no_lat = moefit.solve(_synthetic(compute, memory, t), t, latency=False)[3]
    assert no_lat == 0.0


def test_the_fit_recovers_a_time_per_row():
    """Two shapes at e = 1.25, r = 4 ns, e_m = 0.8, l = 20 us: the compute of a small-expert
    table (few FLOPs a row) and a large-expert one (many), the rows as they would pad. Both
    compute-bound at their largest sizes, so only together do they fix e and r apart."""
    rows = np.array([64, 128, 1024, 4096, 16384, 64, 128, 1024, 4096, 16384], dtype=float)
    flops_per_row = np.array([1.0] * 5 + [20.0] * 5) * 1e-9  # seconds at the dense rate
    compute = rows * flops_per_row
    memory = np.array([10e-6] * 5 + [50e-6] * 5)
    t = np.maximum(compute / 1.25 + rows * 4e-9, memory / 0.8) + 20e-6
    e, em, r, lat = moefit.solve(_synthetic(compute, memory, t, rows), t)
    assert (e, em, r, lat) == (
        pytest.approx(1.25, rel=1e-5),
        pytest.approx(0.8, rel=1e-5),
        pytest.approx(4e-9, rel=1e-4),
        pytest.approx(20e-6, rel=1e-4),
    )


def test_fit_error_on_the_published_points(h100_fit, a100_fit):
    """vLLM's tuned fused_moe on Hopper, two expert sizes at once (Mixtral's 8 of 7168 on an
    H100, 1 .. 1536 tokens; Gemma-4's 128 of 704 on an H200, 16 .. 4096): Mixtral within 8%,
    Gemma within 10.5%, medians under 4.5%, at ~1.16x the dense GEMM rate plus ~2.4 ns per
    padded row and GEMM, streaming at the H100's peak (the bound); the bare padded roofline
    misses Gemma by 15%. On an A100 two
    expert sizes at once (Qwen3-30B-A3B's 128 of 768, 1 .. 4096 tokens; Kimi-VL-A3B's 64 of
    1408, 16 .. 4096): Qwen within 13%, median under 2%, Kimi-VL within 9%, median under 5%,
    at ~1.16x and no time per row. The call's fixed time is 26-34 us on both."""
    assert len(h100_fit.errors) == 29 and len(a100_fit.errors) == 23
    mixtral = h100_fit.shapes == "mixtral-8x7b tp2 N=7168 bf16 vllm-triton-fused_moe-tuned"
    assert mixtral.sum() == 15
    err = np.abs(h100_fit.errors)
    assert err[mixtral].max() < 0.08 and np.median(err[mixtral]) < 0.045
    assert err[~mixtral].max() < 0.105 and np.median(err[~mixtral]) < 0.045
    assert np.abs(h100_fit.dense_errors[~mixtral]).max() > 0.15
    assert 1.1 < h100_fit.efficiency < 1.25 and 2e-9 < h100_fit.row_time < 3e-9
    # the bound: the H100's peak over its GEMM streaming (0.9219), tighter than the H200's
    # (0.7974); it binds on the Hopper fit, not on the A100's
    bound = moefit.memory_max(moefit.fitted_rows("h100-sxm"))
    assert bound == pytest.approx(1 / 0.9219, rel=1e-4)
    assert h100_fit.memory == pytest.approx(bound)
    assert a100_fit.memory < moefit.memory_max(moefit.fitted_rows("a100-80g-sxm"))
    qwen = a100_fit.shapes == "qwen3-30b-a3b tp1 N=768 bf16 vllm-triton-fused_moe-tuned"
    assert qwen.sum() == 18
    err = np.abs(a100_fit.errors)
    assert err[qwen].max() < 0.13 and np.median(err[qwen]) < 0.02
    assert err[~qwen].max() < 0.09 and np.median(err[~qwen]) < 0.05
    assert np.abs(a100_fit.dense_errors).max() > 0.15
    assert 1.1 < a100_fit.efficiency < 1.25 and a100_fit.row_time < 1e-12
    assert a100_fit.memory == pytest.approx(1.10, abs=0.01)
    for f in (h100_fit, a100_fit):
        assert 25e-6 < f.latency < 35e-6
    one = moefit.fit("h100-sxm", latency=False)
    assert one.latency == 0.0
    assert np.abs(one.errors).max() > np.abs(h100_fit.errors).max()


def test_small_experts_need_the_time_per_row(h100_fit):
    """Without it one (e, e_m, l) prices the two Hopper tables within 16% only (10% with it),
    and Mixtral's own fit (1.2x, within 4% of Mixtral) prices Gemma 5-25% fast at 2048-4096
    tokens: 128 experts of 704 take longer per FLOP there."""
    bare = moefit.fit("h100-sxm", row_time=False)
    assert np.abs(bare.errors).max() > 0.15 > 0.105 > np.abs(h100_fit.errors).max()
    rows = moefit.fitted_rows("h100-sxm")
    pieces = moefit.parts(rows)
    keep = ~moefit._left_out(rows, pieces)
    rows, pieces = rows[keep], pieces.pick(keep)
    t = rows.time_us.to_numpy() * 1e-6
    mixtral = (rows.model == "mixtral-8x7b").to_numpy()
    e, em, r, lat = moefit.solve(pieces.pick(mixtral), t[mixtral], row_time=False)
    assert e == pytest.approx(1.2, abs=0.01) and r == 0.0
    err = (pieces.activation + pieces.dense(e, em) + lat) / t - 1
    assert np.abs(err[mixtral]).max() < 0.04
    big = ~mixtral & (rows.tokens.to_numpy() >= 2048)
    assert (err[big] < -0.05).all() and (err[big] > -0.25).all()


def test_only_tuned_config_rows_are_fitted(h100_fit, a100_fit):
    rows = moefit.load_points()
    assert set(rows[rows.gpu == "h100-sxm"].model) == {"mixtral-8x7b", "qwen3-30b-a3b"}
    assert set(h100_fit.shapes) == {
        "mixtral-8x7b tp2 N=7168 bf16 vllm-triton-fused_moe-tuned",
        "gemma-4-26b-a4b tp1 N=704 bf16 vllm-triton-fused_moe-tuned",
    }
    assert set(rows[rows.gpu == "a100-80g-sxm"].model) == {"qwen3-30b-a3b", "moonlight-16b-a3b"}
    assert set(a100_fit.shapes) == {
        "qwen3-30b-a3b tp1 N=768 bf16 vllm-triton-fused_moe-tuned",
        "moonlight-16b-a3b tp1 N=1408 bf16 vllm-triton-fused_moe-tuned",
    }
    # vllm#40542's tuned file mirrors the default config at 1, 2, 4 and 8 tokens: its 1- and
    # 4-token rows are default-config checks, not fitted
    kimi = rows[(rows.gpu == "a100-80g-sxm") & (rows.model == "moonlight-16b-a3b")]
    tuned = kimi[kimi.kernel.str.endswith("-tuned")]
    assert list(tuned.tokens) == [16, 64, 256, 1024, 4096]
    with pytest.raises(ValueError, match="no tuned-config rows"):
        moefit.fit("a40")


def test_pooled_rows_are_priced_on_their_own_card():
    """The H200's rows join the H100's fit, each priced on its own profile: the same shape and
    size on the two cards gives the H200's faster HBM a smaller memory side."""
    assert moefit.POOLED == {"h200-sxm": "h100-sxm"}
    rows = moefit.fitted_rows("h100-sxm")
    assert set(rows.gpu) == {"h100-sxm", "h200-sxm"}
    one = rows[rows.gpu == "h200-sxm"].head(1)
    as_h100 = one.assign(gpu="h100-sxm")
    memory = [moefit.parts(r).gemms[0][0][1] for r in (one, as_h100)]
    bandwidth = [load_hardware(g).hbm.bandwidth for g in ("h200-sxm", "h100-sxm")]
    assert memory[0] < memory[1]
    assert (
        moefit.parts(one).blend[0] == CostParams.from_hardware(load_hardware("h200-sxm")).gemm_blend
    )
    assert bandwidth[0] > bandwidth[1]


def test_rows_left_out_below_the_hbm_floor_or_launch_bound():
    """L40S, 2 tokens: ~15.5 touched experts' 73 MB of fp8 weights take 85 us at the peak
    864 GB/s, yet the call took 37.79 us (tuned) and 39.06 us (default): the replayed layer's
    weights sat in the 96 MB L2. Gemma on the H200 takes 185-189 us from 1 to 4 tokens (and
    204 at 8), where 8-52 touched experts' weights take 20-128 us: the harness's launches.
    Neither kind is fitted or counted as a check."""
    left = moefit.left_out("l40s")
    assert list(left.tokens) == [2] and list(left.time_us) == [37.79]
    assert len(moefit.fit("l40s").errors) == 12
    c = moefit.checks("l40s")
    assert list(c.tokens[c.left_out]) == [2]
    hopper = moefit.left_out("h100-sxm")
    assert set(hopper.gpu) == {"h200-sxm"} and list(hopper.tokens) == [1, 2, 4, 8]
    assert moefit.left_out("a100-80g-sxm").empty
    h200 = moefit.checks("h200-sxm")
    gemma = h200[h200["shape"].str.startswith("gemma-4-26b-a4b")]
    assert list(gemma.tokens[gemma.left_out]) == [1, 2, 4, 8]


def test_launch_bound_needs_a_flat_start():
    """A table is launch-bound only where its two-token call takes its one-token time: Mixtral
    (144 us at one token, 229 at two) has none."""
    rows = moefit.load_points()
    mixtral = rows[(rows.model == "mixtral-8x7b") & (rows.gpu == "h100-sxm")]
    assert not moefit.launch_bound(mixtral).any()
    flat = pd.DataFrame(
        {"gpu": "g", "model": "m", "tp": 1, "dtype": "bf16", "kernel": "k-tuned",
         "tokens": [1, 2, 4, 8, 16], "time_us": [100.0, 101.0, 99.0, 114.0, 150.0]}
    )  # fmt: skip
    assert list(moefit.launch_bound(flat)) == [True, True, True, True, False]


def test_the_rows_name_their_shape_and_dtype():
    """Each row's (experts, top-k, hidden, expert width) is its model's shard at its TP."""
    rows = moefit.load_points()
    assert set(rows["dtype"]) <= {"bf16", "fp8"}
    moefit.parts(rows)  # raises on a shape mismatch


def test_checks_price_the_other_rows_with_the_profile():
    """The default-config and other-kernel rows, against the profile's values (none fitted).
    On the A100 vLLM's default config is priced within 11% up to 2048 tokens on Qwen3 (it runs
    17-21% slower than the model, fitted to the tuned config, at 3072 and 4096); on Kimi-VL's
    shape within 11% at 16-1024 tokens, 19% slower at 4096, and 14% and 53% slower at 4 and 1
    token (the PR's un-graphed do_bench harness: 183.5 us for one token). On the H100 the
    small experts' other kernels run slower than the tuned kernel the model is fitted to:
    vLLM's untuned fp8 default config 18-20% from 4 to 128 tokens and 30-59% from 256,
    Liger's kernel 19-32% at every size, torch's grouped_mm and VeOmni's 46% and 52% at 32K
    tokens. Gemma's default column on the H200 is priced within 13%."""
    h100, a100 = moefit.checks("h100-sxm"), moefit.checks("a100-80g-sxm")
    h200, l40s = moefit.checks("h200-sxm"), moefit.checks("l40s")
    assert (len(h100), len(a100), len(h200), len(l40s)) == (29, 27, 25, 13)
    default = h100["shape"].str.endswith("-default")
    small = default & h100.tokens.between(4, 128)
    assert (h100[small].error.between(-0.21, -0.17)).all()
    assert (h100[default & (h100.tokens >= 256)].error.between(-0.6, -0.29)).all()
    liger = h100["shape"].str.contains("liger")
    assert (h100[liger].error.between(-0.33, -0.18)).all()
    others = ~default & ~liger
    assert list(h100[others].tokens) == [32768, 32768]
    assert (h100[others].error.between(-0.53, -0.45)).all()
    qwen = a100["shape"].str.startswith("qwen3-30b-a3b")
    assert qwen.sum() == 18
    assert (a100[qwen & (a100.tokens <= 2048)].error.abs() < 0.11).all()
    assert (a100[qwen & (a100.tokens > 2048)].error < -0.15).all()
    kimi = a100[~qwen]
    assert list(kimi.tokens) == [1, 4, 1, 4, 16, 64, 256, 1024, 4096]
    assert (kimi[kimi.tokens.between(16, 1024)].error.abs() < 0.11).all()
    assert kimi[kimi.tokens == 4096].error.between(-0.2, -0.15).all()
    assert kimi[kimi.tokens == 4].error.between(-0.16, -0.12).all()
    assert kimi[kimi.tokens == 1].error.between(-0.56, -0.5).all()
    gemma = h200["shape"].str.startswith("gemma-4-26b-a4b") & ~h200.left_out
    assert (h200[gemma].error.abs() < 0.13).all()
    assert moefit.checks("a40").empty


def test_h100_and_a100_profiles_carry_their_fits(h100_fit, a100_fit):
    for name, f in (("h100-sxm", h100_fit), ("a100-80g-sxm", a100_fit)):
        eff = load_hardware(name).efficiency
        assert eff.moe_gemm == pytest.approx(f.efficiency, abs=5e-4)
        assert eff.moe_gemm_memory == pytest.approx(f.memory, abs=5e-4)
        assert eff.moe_row_time == pytest.approx(f.row_time, abs=5e-13)
        assert eff.moe_latency == pytest.approx(f.latency, abs=5e-9)


@pytest.mark.parametrize("gpu", ["h100-pcie", "h200-sxm", "gh200"])
def test_the_other_hopper_parts_carry_the_h100_fit(gpu):
    """The same fused-MoE kernel on the same Hopper die: the ratios and the call time are
    carried over."""
    eff, h100 = load_hardware(gpu).efficiency, load_hardware("h100-sxm").efficiency
    keys = ("moe_gemm", "moe_gemm_memory", "moe_row_time", "moe_latency")
    assert [getattr(eff, k) for k in keys] == [getattr(h100, k) for k in keys]


@pytest.mark.parametrize("gpu", ["l40s", "rtx3090", "a40"])
def test_other_nvidia_parts_carry_the_call_time_and_keep_the_fused_roofline(gpu):
    """No tuned bf16 kernel table for these cards (L40S's is fp8 only, printed by moefit but
    not carried): the call's fixed time (small routing kernels, the same Triton code) is
    carried from the H100 fit; the speed ratios are not."""
    eff, h100 = load_hardware(gpu).efficiency, load_hardware("h100-sxm").efficiency
    assert (eff.moe_gemm, eff.moe_gemm_memory, eff.moe_latency) == (1.0, 1.0, h100.moe_latency)
    assert eff.moe_row_time == 0.0


def test_a_profile_with_no_moe_keys_prices_the_bare_fused_roofline():
    eff = load_hardware("mi300x").efficiency  # ROCm's MoE kernels: nothing carried
    assert (eff.moe_gemm, eff.moe_gemm_memory, eff.moe_latency, eff.moe_row_time) == (1, 1, 0, 0)


def test_calibrated_profile_text_keeps_the_moe_keys_only_when_set():
    for key in ("moe_gemm", "moe_gemm_memory", "moe_latency", "moe_row_time"):
        assert key not in efficiency_text(Efficiency(), {}, {})
    assert "moe_gemm: 1.2" in efficiency_text(Efficiency(moe_gemm=1.2), {}, {})
    assert "moe_gemm_memory: 1.1" in efficiency_text(Efficiency(moe_gemm_memory=1.1), {}, {})
    assert "moe_latency: 22us" in efficiency_text(Efficiency(moe_latency=22e-6), {}, {})
    assert "moe_row_time: 8ns" in efficiency_text(Efficiency(moe_row_time=8e-9), {}, {})


def test_the_checks_frame_is_empty_with_its_columns_for_a_gpu_without_rows():
    c = moefit.checks("mi300x")
    assert isinstance(c, pd.DataFrame) and c.empty and "left_out" in c.columns
