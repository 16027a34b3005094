"""Fit the non-attention cost model (GEMMs and elementwise kernels) to a long table.

The fit is one model of shapes for all the table's models together: a GEMM's time depends
on (tokens, fan_in, fan_out) only, a kernel's on (tokens, row bytes) only, so it predicts
models it never saw. :func:`leave_one_model_out` checks exactly that, through the
simulator's own cost model (``sim.cost.roofline``) built from the calibrated profile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.config.hardware import Efficiency, HardwareSpec
from sim.cost.optables import KERNEL_KINDS
from sim.cost.roofline import CostParams, KernelParams, gemm_seconds, kernel_seconds
from sim.errors import KvsimError
from validation.fit import (
    DECODE_MAX_TOKENS,
    MIN_POINTS,
    GemmFit,
    KernelFit,
    Residual,
    fit_gemm,
    fit_kernel,
)

REGIMES = ("decode", "prefill")
ROW_BANDWIDTH_NONE = 1e13  # a fitted per-row bandwidth above this (10 TB/s) has no visible effect


@dataclass(frozen=True)
class OpsFit:
    """Fitted GEMM and kernel parameters, and what they were fitted on."""

    gemm: GemmFit
    kernels: dict[str, KernelFit]
    models: tuple[str, ...]
    rows: int
    peaks: tuple[float, float, float]

    @property
    def layer_fixed_s(self) -> float:
        """Per-layer fixed cost: the latencies of one layer's 4 GEMMs and its kernels."""
        counts = {"norm": 2, "rope": 1, "activation": 1, "residual_add": 1}
        kernels = sum(n * self.kernels[k].latency_s for k, n in counts.items() if k in self.kernels)
        return 4 * self.gemm.latency_s + kernels


def usable_rows(table: pd.DataFrame, tp: int | None = 1) -> pd.DataFrame:
    """Rows of one tensor-parallel degree, or of every degree (``None``: the tp > 1 rows hold
    per-GPU shapes, so a fit over shapes takes them as they are)."""
    rows = table if tp is None else table[table.tp == tp]
    if rows.empty:
        raise KvsimError(f"the measured tables have no rows with tensor-parallel degree {tp}")
    return rows


def fit_ops(
    table: pd.DataFrame, peaks: tuple[float, float, float], row_blocks: bool = False
) -> OpsFit:
    """Fit the GEMM model and one kernel model per kind present in ``table``.

    Args:
        table: long-format rows (``sim.cost.optables``), one tensor-parallel degree.
        peaks: (peak FLOP/s, peak memory bytes/s, bytes per element) of the device.
        row_blocks: also fit the GEMMs' rows per weight pass (``validation.fit.fit_gemm``).
    """
    gemms = table[table.kind == "gemm"]
    if len(gemms) < MIN_POINTS:
        raise KvsimError("the measured tables hold no GEMM rows to fit")
    gemm = fit_gemm(
        gemms.tokens.to_numpy(),
        (gemms.fan_in.to_numpy(), gemms.fan_out.to_numpy()),
        gemms.time_s.to_numpy(),
        peaks,
        row_blocks,
    )
    kernels = {}
    for kind in KERNEL_KINDS:
        rows = table[table.kind == kind]
        if len(rows) >= MIN_POINTS:
            kernels[kind] = fit_kernel(
                rows.tokens.to_numpy(), rows.row_bytes.to_numpy(), rows.time_s.to_numpy(), peaks[1]
            )
    models = tuple(sorted(table.model.unique()))
    return OpsFit(gemm=gemm, kernels=kernels, models=models, rows=len(table), peaks=peaks)


def calibrated_efficiency(fit: OpsFit, base: Efficiency) -> Efficiency:
    """``base`` with its GEMM keys and kernels replaced by the fit.

    ``layer_overhead`` becomes 0: the kernels it used to stand for are now modelled one by
    one, and the tables hold no other per-layer work.
    """
    kernels = {
        kind: {
            "latency": k.latency_s,
            "memory": k.memory,
            "row_bandwidth": k.row_bandwidth if k.row_bandwidth < ROW_BANDWIDTH_NONE else None,
            "blend": k.blend,
        }
        for kind, k in fit.kernels.items()
    }
    return Efficiency.model_validate(
        base.model_dump(exclude={"kernels"})
        | {
            "gemm": fit.gemm.efficiency,
            "gemm_memory": fit.gemm.memory,
            "gemm_latency": fit.gemm.latency_s,
            "gemm_blend": fit.gemm.blend,
            "gemm_row_block": fit.gemm.row_block,
            "gemm_max_passes": fit.gemm.max_passes,
            "layer_overhead": 0.0,
            "kernels": kernels,
        }
    )


def predict_rows(table: pd.DataFrame, params: CostParams, dtype_bytes: float) -> np.ndarray:
    """The simulator's time for every row of a long table (GEMMs and kernels)."""
    kernels = params.kernels
    out = np.empty(len(table))
    for i, row in enumerate(table.itertuples(index=False)):
        if row.kind == "gemm":
            out[i] = gemm_seconds(params, row.tokens, row.fan_in, row.fan_out, dtype_bytes)
        else:
            kernel: KernelParams | None = getattr(kernels, row.kind) if kernels else None
            out[i] = kernel_seconds(params, kernel, row.tokens, row.row_bytes)
    return out


def layer_times(table: pd.DataFrame, params: CostParams, dtype_bytes: float) -> pd.DataFrame:
    """Measured and predicted per-layer time by (model, tokens): the sum of per-layer ops."""
    layer = table[table.per_layer.astype(bool)].copy()
    layer["predicted_s"] = predict_rows(layer, params, dtype_bytes)
    # repeated measurements of one op at one token count are averaged, then ops summed (one
    # layer per model, tensor-parallel degree and token count)
    keys = ["model", "tp", "tokens"] if "tp" in layer.columns else ["model", "tokens"]
    ops = layer.groupby([*keys, "op"], as_index=False)[["time_s", "predicted_s"]]
    sums = ops.mean().groupby(keys, as_index=False)[["time_s", "predicted_s"]].sum()
    return sums.rename(columns={"time_s": "measured_s"})


def error_rows(layers: pd.DataFrame, model: str) -> list[dict]:
    """Median and p90 APE of per-layer time, decode-sized and prefill-sized separately."""
    rows = []
    for regime in REGIMES:
        decode = layers.tokens <= DECODE_MAX_TOKENS
        part = layers[decode if regime == "decode" else ~decode]
        if part.empty:
            continue
        res = Residual.of(part.predicted_s.to_numpy(), part.measured_s.to_numpy())
        rows.append(
            {
                "model": model,
                "regime": regime,
                "points": res.n,
                "median_ape": res.median_ape,
                "p90_ape": res.p90_ape,
            }
        )
    return rows


def calibrated_spec(base: HardwareSpec, fit: OpsFit) -> HardwareSpec:
    """``base`` with the fitted efficiency section."""
    return base.model_copy(update={"efficiency": calibrated_efficiency(fit, base.efficiency)})


def peaks_of(hw: HardwareSpec, dtype_bytes: float = 2.0) -> tuple[float, float, float]:
    """(peak bf16 FLOP/s, peak HBM bytes/s, bytes per element) of a profile."""
    return (hw.compute.bf16_flops, hw.hbm.bandwidth, dtype_bytes)


def leave_one_model_out(
    table: pd.DataFrame, base: HardwareSpec, dtype_bytes: float = 2.0, held_tp: str = "all"
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fit on all models but one, predict the held-out one's per-layer time; for each model.

    ``held_tp``: which of the held-out model's rows are predicted: ``all``, ``1`` (tensor-
    parallel degree 1) or ``>1`` (per-GPU shapes of degrees 2, 4, 8).

    Returns:
        (errors: model, regime, points, median_ape, p90_ape;
         layers: model, tokens, measured_s, predicted_s of every held-out model).
    """
    models = sorted(table.model.unique())
    if len(models) < 2:
        raise KvsimError("leave-one-model-out needs tables of at least two models")
    errors, layers = [], []
    for model in models:
        rows = table[table.model == model]
        if held_tp != "all":
            rows = rows[rows.tp == 1] if held_tp == "1" else rows[rows.tp > 1]
        if rows.empty:
            continue
        fit = fit_ops(table[table.model != model], peaks_of(base, dtype_bytes))
        params = CostParams.from_hardware(calibrated_spec(base, fit))
        held = layer_times(rows, params, dtype_bytes)
        errors += error_rows(held, model)
        layers.append(held)
    return pd.DataFrame(errors), pd.concat(layers, ignore_index=True)
