"""The attention fit: its data, its error on them, the profiles that carry it, and the
cost model pricing the benchmarked kernels as the fit does."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import hardware_profiles
from sim.config import load_hardware
from sim.config.hardware import HardwareSpec
from sim.config.loader import validate
from sim.config.model import ModelSpec
from sim.cost.roofline import CostModel, CostParams
from validation import attentionfit
from validation.profile import render_profile


@pytest.fixture(scope="module")
def h100_fit():
    return attentionfit.fit("h100-sxm")


@pytest.fixture(scope="module")
def a100_fit():
    return attentionfit.fit("a100-80g-sxm")


@pytest.fixture(scope="module")
def a40_fit():
    return attentionfit.fit("a40")


def test_fit_error_on_the_published_points(h100_fit):
    assert len(h100_fit.prefill_errors) == 6 and len(h100_fit.decode_errors) == 5
    assert np.abs(h100_fit.prefill_errors).max() < 0.05
    assert np.abs(h100_fit.decode_errors).max() < 0.05


def test_flash_attention_2_decode_on_hopper_is_a_check_slower_than_the_fit(h100_fit):
    """The onnxruntime FlashAttention-2 rows are not fitted; FlashAttention-3's fit prices
    every one of them faster than FlashAttention-2 ran (by more than 10%)."""
    assert len(h100_fit.decode_checks) == 5
    assert (h100_fit.decode_checks < -0.10).all()


def test_pooled_rows_are_fractions_of_their_own_cards_peak(h100_fit):
    """The H100 PCIe's rows are fitted against its own 2.0 TB/s: priced at the SXM's
    3.35 TB/s instead, the same times would give an efficiency 2.0 / 3.35 as large."""
    rows = attentionfit.load_points()
    rows = rows[(rows.gpu == "h100-pcie") & (rows.kind == "decode")]
    on_sxm, _, _ = attentionfit.fit_decode(rows, load_hardware("h100-sxm").hbm.bandwidth)
    assert on_sxm == pytest.approx(h100_fit.decode_efficiency * 2.0 / 3.35, rel=1e-9)


def test_an_unknown_role_is_refused_with_its_row(tmp_path):
    """The first check row, after the six H100 prefill rows, is the seventh data row."""
    data = attentionfit.DATA.read_text().replace(",check,", ",chek,", 1)
    (tmp_path / "kernels.csv").write_text(data)
    with pytest.raises(ValueError, match=r"kernels.csv, data row 7: role 'chek'; expected one"):
        attentionfit.load_points(tmp_path / "kernels.csv")


def test_a100_fit_error_on_the_published_points(a100_fit):
    """FlashAttention-2 prefill on an A100 within 5%; Vidur's decode profile within 10% (its
    times step with the kernel's waves over the SMs, which the model does not have)."""
    assert len(a100_fit.prefill_errors) == 6 and len(a100_fit.decode_errors) == 6
    assert np.abs(a100_fit.prefill_errors).max() < 0.05
    assert np.abs(a100_fit.decode_errors).max() < 0.10


def test_a40_fit_error_on_the_published_points(a40_fit):
    """GA102: FlashAttention-2 prefill on an RTX A5000 (as a fraction of its own peak) and
    Vidur's A40 decode profile at batch 64, each within 5%."""
    assert len(a40_fit.prefill_errors) == 6 and len(a40_fit.decode_errors) == 6
    assert np.abs(a40_fit.prefill_errors).max() < 0.05
    assert np.abs(a40_fit.decode_errors).max() < 0.05


def test_a40_prefill_is_a_fraction_of_the_a5000_peak(a40_fit):
    """The A5000's rows are fitted against the A5000's peak, not the A40's: the same rows
    priced at the A40's peak would give a fraction 111.1 / 150 as large."""
    rows = attentionfit.load_points()
    rows = rows[(rows.gpu == "rtx-a5000") & (rows.kind == "prefill")]
    on_a40, _, _ = attentionfit.fit_prefill(rows, load_hardware("a40").compute.bf16_flops)
    peak = attentionfit.OTHER_CARDS["rtx-a5000"].bf16_flops
    assert on_a40 == pytest.approx(a40_fit.prefill_efficiency * peak / 150e12, rel=1e-9)


def _carries(gpu, fit, decode=True):
    eff = load_hardware(gpu).efficiency
    assert eff.attention == pytest.approx(fit.prefill_efficiency, abs=5e-5)
    assert eff.attention_extra_keys == fit.extra_keys
    if decode:
        assert eff.decode_attention == pytest.approx(fit.decode_efficiency, abs=5e-5)
    assert eff.decode_attention_latency == pytest.approx(fit.decode_latency_s, abs=5e-9)


@pytest.mark.parametrize("gpu", ["h100-sxm", "h100-pcie"])
def test_profiles_carry_the_fit(h100_fit, gpu):
    _carries(gpu, h100_fit)


@pytest.mark.parametrize("gpu", ["h200-sxm", "gh200"])
def test_other_memories_carry_the_fit_but_its_decode_bandwidth(h100_fit, gpu):
    """The H200's HBM3e and the GH200's HBM3 carry the prefill fit and the decode call's
    fixed time; their decode bandwidth is carried by validation/streamfit.py
    (tests/validation/test_stream_fit.py)."""
    _carries(gpu, h100_fit, decode=False)


def test_a100_profile_carries_its_own_fit(a100_fit):
    _carries("a100-80g-sxm", a100_fit)


@pytest.mark.parametrize("gpu", ["a40", "rtx3090"])
def test_ga102_profiles_carry_the_a40_fit(a40_fit, gpu):
    _carries(gpu, a40_fit)


def test_fit_recovers_known_parameters_from_synthetic_points():
    """Points made by the model's own equations give back the parameters that made them."""
    peak, bandwidth, e_a, extra, e_d, l_d = 989e12, 3.35e12, 0.6, 250, 0.8, 9e-6
    seqlen = np.array([512, 1024, 2048, 4096, 8192, 16384])
    batch = 16384 // seqlen
    pairs = batch * seqlen * ((seqlen + 1) / 2 + extra) * 4 * 16 * 128
    seconds = pairs / (peak * e_a)
    flops = 4.0 * batch * 16 * seqlen**2 * 128 / 2.0
    prefill = pd.DataFrame(
        {"batch": batch, "seqlen": seqlen, "heads": 16, "head_dim": 128,
         "tflops": flops / seconds / 1e12}
    )  # fmt: skip
    got_e, got_x, errors = attentionfit.fit_prefill(prefill, peak)
    assert (got_e, got_x) == (pytest.approx(e_a), extra)
    assert np.abs(errors).max() < 1e-9
    decode = pd.DataFrame(
        {"batch": 64, "seqlen": [32, 128, 512, 2048], "kv_heads": 8, "head_dim": 128}
    )
    kv = attentionfit.decode_bytes(decode)
    decode["time_us"] = (l_d + kv / (bandwidth * e_d)) * 1e6
    got_e, got_l, _ = attentionfit.fit_decode(decode, bandwidth)
    assert (got_e, got_l) == (pytest.approx(e_d), pytest.approx(l_d))


def test_prefill_fit_counts_cached_keys_and_measured_times():
    """Rows timed (``time_us``) after a cached prefix: the fit prices each query's cached keys
    as the cost model does and gives back the parameters that made the times."""
    peak, e_a, extra, heads = 312e12, 0.55, 120, 32
    rows = pd.DataFrame(
        {"batch": [16, 4, 1, 2], "seqlen": [1024, 1024, 4096, 512], "cached": [0, 3072, 0, 7680],
         "heads": heads, "head_dim": 128, "tflops": np.nan}
    )  # fmt: skip
    pairs = rows.batch * rows.seqlen * (rows.cached + (rows.seqlen + 1) / 2 + extra)
    rows["time_us"] = pairs * 4 * heads * 128 / (peak * e_a) * 1e6
    got_e, got_x, errors = attentionfit.fit_prefill(rows, peak)
    assert (got_e, got_x) == (pytest.approx(e_a), extra)
    assert np.abs(errors).max() < 1e-9


def test_cost_model_prices_the_benchmarked_decode_kernel_as_fitted(h100_fit):
    """Each fitted decode row, a one-layer model of its heads on its own card's profile and
    its batch at its KV length: the cost model's decode attention is the fit's prediction."""
    rows = attentionfit.load_points()
    rows = rows[(rows.gpu.map(attentionfit._profile_of) == "h100-sxm") & (rows.role == "fit")]
    rows = rows[rows.kind == "decode"]
    for row, error in zip(rows.itertuples(), h100_fit.decode_errors, strict=True):
        model = ModelSpec(
            name="bench", layers=1, hidden=row.heads * 128, heads=row.heads,
            kv_heads=row.kv_heads, head_dim=128, intermediate=4 * row.heads * 128,
            vocab=32000, dtype="bf16",
        )  # fmt: skip
        cost = CostModel(model, CostParams.from_hardware(load_hardware(row.gpu)))
        # the cost model's decode reads the new token too: context = seqlen - 1
        priced = cost.attention_time(np.ones(row.batch), np.full(row.batch, row.seqlen - 1))
        assert priced / (row.time_us * 1e-6) - 1 == pytest.approx(error, abs=0.002)


def test_a_recalibration_keeps_the_attention_and_host_keys():
    """``kvsim calibrate`` rewrites the efficiency section: the keys it does not fit stay."""
    path = Path(hardware_profiles.__file__).parent / "h100-sxm.yaml"
    text = path.read_text()
    spec = load_hardware("h100-sxm")
    rendered = render_profile(text, "h100-again", spec.efficiency, ["refit"], {})
    again = validate(HardwareSpec, yaml.safe_load(rendered), "<rendered>")
    assert again.efficiency == spec.efficiency
