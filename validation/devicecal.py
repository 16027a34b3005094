"""``kvsim calibrate --device cpu|cuda``: microbenchmarks -> fits -> a calibrated profile.

Peaks are measured too: ``compute.bf16_flops`` becomes the best GEMM rate seen (in the
model's dtype) and ``hbm.bandwidth`` the best copy traffic (bytes read + written per
second), so the fitted efficiencies are fractions of what this device reached. The fixed
per-step overhead (Python scheduling, tensor set-up, sampling) is the one part no kernel
benchmark shows: it is the median unexplained time of a short calibration run of the
mini-engine (its own seed and request mix, not the validation workload).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sim.config.hardware import Efficiency, HardwareSpec
from sim.cost.roofline import CostModel, CostParams
from sim.workload import build_requests
from validation.calibrate import load_base
from validation.calibrate import notes as table_notes
from validation.engine import MiniEngine
from validation.fit import AffineFit, AttentionFit, Residual, fit_affine, fit_attention
from validation.microbench import device_name, run_microbench, save_measurements
from validation.opsfit import OpsFit, calibrated_efficiency, fit_ops
from validation.profile import fmt_bandwidth, fmt_seconds, render_profile, set_value, write_profile
from validation.report import measured_steps
from validation.scenario import pin_threads, scenario_config
from validation.timing import statistic

RUNS = 3  # timed calibration runs (median or minimum per step: validation.timing)
DEFAULT_BASE = {"cpu": "cpu-host", "cuda": "h200-sxm"}  # the GPU the device tool lends
MIN_COPY_FOR_PEAK = 2**20  # copies below 1 MiB run from cache: not a memory bandwidth


@dataclass(frozen=True)
class DeviceFit:
    """Everything fitted from one device's microbenchmarks."""

    peak_flops: float
    peak_bandwidth: float
    link: AffineFit
    half_efficiency_bytes: float
    ops: OpsFit
    attention: AttentionFit
    step_overhead_s: float = 0.0
    step_residual: Residual | None = None
    link_d2h: AffineFit | None = None  # on the CPU the one memcpy fit serves both directions


def measured_peaks(table: pd.DataFrame) -> tuple[float, float]:
    """(best GEMM FLOP/s, best copy traffic in bytes/s) among the measurements."""
    gemm = table[table.kind == "gemm"]
    copies = table[(table.kind == "copy") & (table.bytes >= MIN_COPY_FOR_PEAK)]
    copies = copies[copies.direction.isin(("host", "d2d"))]  # not over the host link
    return float((gemm.flops / gemm.time_s).max()), float((2 * copies.bytes / copies.time_s).max())


def fit_link(
    table: pd.DataFrame, block_bytes: float, direction: str = "h2d"
) -> tuple[AffineFit, float]:
    """Link latency and bandwidth from contiguous copies; per-block cost from gathered copies.

    On a GPU, pinned copies of ``direction``; on the CPU, host-to-host copies. A gathered copy
    of n blocks of S bytes is modelled, as ``sim.memory.links`` does, as ``latency + n (S + h) /
    bandwidth``: ``h`` is the half-efficiency size.
    """
    copies = table[table.kind == "copy"]
    if (copies.direction != "host").any():  # on a GPU
        copies = copies[(copies.direction == direction) & copies.pinned.astype(bool)]
    link = fit_affine(copies.bytes.to_numpy(), copies.time_s.to_numpy(), f"{direction} copy fit")
    gathered = table[(table.kind == "copy_blocks") & (table.op == "gathered")]
    bandwidth = 1.0 / link.slope
    extra = (gathered.time_s - link.intercept) * bandwidth / gathered.tokens - block_bytes
    return link, float(max(np.median(extra), 0.0)) if len(extra) else 0.0


def fit_device(table: pd.DataFrame, block_bytes: float, dtype_bytes: float) -> DeviceFit:
    """Fit peaks, link, GEMMs, kernels and attention to a microbenchmark table.

    ``time_s`` is the statistic fitted: callers put the median or the minimum there.
    """
    flops, bandwidth = measured_peaks(table)
    link, half = fit_link(table, block_bytes)
    d2h = None if (table.direction == "host").any() else fit_link(table, block_bytes, "d2h")[0]
    ops = fit_ops(table[table.kind != "copy"], (flops, bandwidth, dtype_bytes), row_blocks=True)
    att = table[table.kind.str.startswith("attention")]
    attention = fit_attention(
        att.flops.to_numpy(), att.bytes.to_numpy(), att.time_s.to_numpy(),
        (att.kind == "attention_decode").to_numpy(),
    )  # fmt: skip
    return DeviceFit(flops, bandwidth, link, half, ops, attention, link_d2h=d2h)


def efficiency_of(fit: DeviceFit, base: Efficiency, step_overhead: float) -> Efficiency:
    """The calibrated efficiency section."""
    eff = calibrated_efficiency(fit.ops, base)
    return eff.model_copy(
        update={
            "attention": min(fit.attention.flops_rate / fit.peak_flops, 1.0),
            "hbm": min(fit.attention.bandwidth / fit.peak_bandwidth, 1.0),
            "attention_latency": fit.attention.latency_s,
            "step_overhead": step_overhead,
        }
    )


def calibrated_hardware(fit: DeviceFit, base: HardwareSpec, step_overhead: float) -> HardwareSpec:
    """``base`` with measured peaks, link and efficiency."""
    d2h = fit.link_d2h or fit.link
    link = base.link.model_copy(
        update={"h2d": 1.0 / fit.link.slope, "d2h": 1.0 / d2h.slope, "latency": fit.link.intercept,
                "half_efficiency_bytes": fit.half_efficiency_bytes}
    )  # fmt: skip
    return base.model_copy(
        update={
            "compute": base.compute.model_copy(update={"bf16_flops": fit.peak_flops}),
            "hbm": base.hbm.model_copy(update={"bandwidth": fit.peak_bandwidth}),
            "link": link,
            "efficiency": efficiency_of(fit, base.efficiency, step_overhead),
        }
    )


def fit_step_overhead(hw: HardwareSpec, device: str, quick: bool) -> tuple[float, Residual]:
    """Median unexplained time per step of a calibration run of the mini-engine (hbm mode)."""
    config = scenario_config(hw, "calibrate", device, "hbm", quick)
    requests = build_requests(config.workload, config.seed, block_tokens=config.engine.block_tokens)
    MiniEngine(config, requests, device).run()  # warm-up: allocator, kernels, caches
    runs = [MiniEngine(config, requests, device).run() for _ in range(RUNS)]
    steps = measured_steps(runs, statistic(device))
    params = CostParams.from_hardware(hw)
    cost = CostModel(config.model, params, config.kv_dtype_bytes)
    predicted = np.array([
        cost.step(np.array(n), np.array(c), s).total_s
        for n, c, s in zip(steps.new_tokens, steps.context, steps.sampled, strict=True)
    ])  # fmt: skip
    overhead = float(max(np.median(steps.step_s - predicted), 0.0))
    return overhead, Residual.of(predicted + overhead, steps.step_s.to_numpy())


def _ape(res: Residual) -> str:
    return f"median {100 * res.median_ape:.1f}%, p90 {100 * res.p90_ape:.1f}%"


def header(fit: DeviceFit, device: str, quick: bool, raw: Path, rows: int) -> list[str]:
    """Provenance comment lines of the calibrated profile."""
    g = fit.ops.gemm
    return [
        "The comments above describe the base profile; keys marked 'measured' or 'fit' replace "
        "its figures.",
        f"Calibrated {datetime.date.today().isoformat()} by `kvsim calibrate --device {device}"
        f"{' --quick' if quick else ''}` on {device_name(device)}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} CPU thread(s).",
        f"Raw measurements: {raw} ({rows} points).",
        "Peaks are measured: compute.bf16_flops = best GEMM rate seen in the model dtype; "
        "hbm.bandwidth = best copy traffic (read + write) of >= 1 MiB.",
        "On the CPU, 'HBM' and 'DRAM' are one memory and the link is a memcpy between two host "
        "buffers; times are the thread's CPU time, minimum over repeats (validation.timing)."
        if device == "cpu"
        else "Link: pinned copies; hbm.bandwidth from device-to-device copies; medians.",
        f"Fit residuals (APE of op time): GEMM {_ape(g.residual)}; attention "
        f"{_ape(fit.attention.residual)}; link {_ape(fit.link.residual)}; step "
        f"{_ape(fit.step_residual) if fit.step_residual else 'n/a'}.",
        "step_overhead: median unexplained time per step of a separate calibration run of the "
        "mini-engine (validation.scenario, seed 101), not the validation workload.",
    ]


def fit_summary(fit: DeviceFit, device: str, quick: bool, raw: Path, rows: int) -> dict:
    """The calibration's provenance and residuals, machine-readable (``OUT.fit.json``)."""

    def residual(res: Residual | None) -> dict | None:
        return dataclasses.asdict(res) if res is not None else None

    return {
        "device": device,
        "device_name": device_name(device),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "quick": quick,
        "measurements": str(raw),
        "points": rows,
        "peak_flops": fit.peak_flops,
        "peak_bandwidth": fit.peak_bandwidth,
        "step_overhead_s": fit.step_overhead_s,
        "gemm_row_block": fit.ops.gemm.row_block,
        "gemm_max_passes": fit.ops.gemm.max_passes,
        "residuals": {
            "gemm": residual(fit.ops.gemm.residual),
            "attention": residual(fit.attention.residual),
            "link": residual(fit.link.residual),
            "step": residual(fit.step_residual),
        },
    }


def notes(fit: DeviceFit) -> dict[str, str]:
    """Comments of the fitted efficiency keys."""
    att, g = fit.attention, fit.ops.gemm
    passes = "once" if g.row_block is None else f"once per {g.row_block} rows"
    limit = "no limit" if g.max_passes is None else f"at most {g.max_passes}"
    return table_notes(fit.ops) | {
        "gemm_row_block": f"fit: GEMMs read their weights {passes} (null: once)",
        "gemm_max_passes": f"fit: passes over the weights: {limit}",
        "attention": f"fit: prefill rate {att.flops_rate / 1e9:.3g} GFLOP/s / peak",
        "attention_latency": "fit: fixed time of one layer's attention call (KV write, SDPA)",
        "hbm": f"fit: decode attention reads KV at {att.bandwidth / 1e9:.3g} GB/s / peak",
        "step_overhead": "fit: median unexplained time per step of a calibration run",
    }


def calibrate_device(
    device: str, out: str | Path, quick: bool, raw: str | Path | None = None,
    base: str | None = None,
) -> tuple[HardwareSpec, DeviceFit]:  # fmt: skip
    """Measure, fit and write a calibrated profile for ``device`` (and beside it the raw
    measurements, ``raw`` or ``OUT.measurements.csv``, and the fit's summary, ``OUT.fit.json``)."""
    out = Path(out)
    raw = Path(raw) if raw else out.with_suffix(".measurements.csv")
    pin_threads(device)
    base_spec, base_text = load_base(base or DEFAULT_BASE[device])
    config = scenario_config(base_spec, "calibrate", device, "hbm", quick)
    table = run_microbench(config.model, device, quick, config.engine.block_tokens)
    save_measurements(table, raw)
    fitted = table.assign(time_s=table.time_min_s) if statistic(device) == "min" else table
    fit = fit_device(fitted, config.block_bytes, config.model.dtype_bytes)
    provisional = calibrated_hardware(fit, base_spec, 0.0)
    overhead, residual = fit_step_overhead(provisional, device, quick)
    fit = dataclasses.replace(fit, step_overhead_s=overhead, step_residual=residual)
    spec = calibrated_hardware(fit, base_spec, overhead)
    text = render_profile(
        base_text,
        out.stem,
        spec.efficiency,
        header(fit, device, quick, raw, len(table)),
        notes(fit),
        f"{device_name(device)} calibrated by kvsim calibrate --device {device}: measured peaks, "
        "link and efficiencies",
    )
    measured = "measured by kvsim calibrate"
    text = set_value(
        text,
        "compute",
        "bf16_flops",
        f"{spec.compute.bf16_flops / 1e9:.4g}GFLOP/s",
        f"{measured}: best GEMM rate ({config.model.dtype})",
    )
    text = set_value(
        text,
        "hbm",
        "bandwidth",
        fmt_bandwidth(spec.hbm.bandwidth),
        f"{measured}: best copy traffic, read + write",
    )
    link = {
        "h2d": fmt_bandwidth(spec.link.h2d),
        "d2h": fmt_bandwidth(spec.link.d2h),
        "latency": fmt_seconds(spec.link.latency),
        "half_efficiency_bytes": f"{spec.link.half_efficiency_bytes:.0f}",
    }
    for key, value in link.items():
        text = set_value(text, "link", key, value, f"{measured}: copies between pools")
    summary = fit_summary(fit, device, quick, raw, len(table))
    out.with_suffix(".fit.json").write_text(json.dumps(summary, indent=2) + "\n")
    return write_profile(out, text), fit
