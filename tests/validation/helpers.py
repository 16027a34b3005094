"""Helpers shared by the validation tests: a fidelity row built by hand, and the check that a
bundled hardware profile holds the operator fit of its tables."""

from __future__ import annotations

import pandas as pd
import pytest

from sim.config.hardware import HardwareSpec
from validation.opsfit import fit_ops, peaks_of


def hand_row(**fields) -> pd.Series:
    """A measurement row built by hand (no CSV): Llama-3-8B bf16 on an H100, one request of
    one token in and out, unless ``fields`` say otherwise."""
    base = dict(
        id="hand",
        model_profile="llama-3-8b",
        dtype="bf16",
        kv_dtype="bf16",
        hardware_profile="h100-sxm",
        tp=1,
        batch=1,
        input_tokens=1,
        output_tokens=1,
        unit="s",
        settings="",
    )
    return pd.Series({**base, **fields})


def assert_holds_fit(hw: HardwareSpec, table: pd.DataFrame) -> None:
    """The profile's GEMM and kernel efficiencies are the fit of ``table`` (0.1%)."""
    fit = fit_ops(table, peaks_of(hw))
    eff = hw.efficiency
    assert eff.gemm == pytest.approx(fit.gemm.efficiency, rel=1e-3)
    assert eff.gemm_memory == pytest.approx(fit.gemm.memory, rel=1e-3)
    assert eff.gemm_latency == pytest.approx(fit.gemm.latency_s, rel=1e-3)
    assert eff.gemm_blend == pytest.approx(fit.gemm.blend, rel=1e-3)
    for kind, kernel in fit.kernels.items():
        bundled = getattr(eff.kernels, kind)
        assert bundled.memory == pytest.approx(kernel.memory, rel=1e-3), kind
        assert bundled.latency == pytest.approx(kernel.latency_s, rel=1e-3, abs=1e-9), kind
