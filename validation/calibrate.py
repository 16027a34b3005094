"""``kvsim calibrate --from-table``: measured operator tables -> a calibrated hardware profile."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pandas as pd
import yaml

from sim.config.hardware import HardwareSpec
from sim.config.loader import profile_dir, read_yaml, validate
from sim.cost.optables import read_tables
from sim.errors import KvsimError
from validation.commfit import CommFit, fit_comm
from validation.fit import DECODE_MAX_TOKENS, Residual
from validation.opsfit import (
    OpsFit,
    calibrated_efficiency,
    fit_ops,
    leave_one_model_out,
    peaks_of,
    usable_rows,
)
from validation.profile import fmt_number, fmt_pct, render_profile, set_value, write_profile

BASE_PROFILES = {"h100": "h100-sxm", "a100": "a100-80g-sxm", "a40": "a40"}
COMMIT = re.compile(r"commit\s+`?([0-9a-f]{40})`?")


@dataclass(frozen=True)
class TableCalibration:
    """The outcome of one ``--from-table`` calibration."""

    fit: OpsFit
    errors: pd.DataFrame
    layers: pd.DataFrame
    profile: HardwareSpec
    path: Path
    tp_errors: pd.DataFrame | None = None  # held-out models' tp > 1 rows (per-GPU shapes)
    comm: CommFit | None = None


def load_base(name_or_path: str) -> tuple[HardwareSpec, str]:
    """A hardware profile (bundled name or YAML path) and its text."""
    path = Path(name_or_path)
    if not path.is_file():
        path = profile_dir("hardware") / f"{name_or_path}.yaml"
    if not path.is_file():
        raise KvsimError(
            f"--base {name_or_path!r}: neither a YAML file nor a bundled hardware profile"
        )
    return validate(HardwareSpec, read_yaml(path), str(path)), path.read_text()


def source_commit(table_dir: Path) -> str | None:
    """The source commit named in a README.md next to (or above) the tables, if any."""
    for folder in (table_dir, *list(table_dir.resolve().parents)[:2]):
        readme = folder / "README.md"
        if readme.is_file():
            match = COMMIT.search(readme.read_text())
            if match:
                return match.group(1)
    return None


def _ape(res: Residual) -> str:
    return f"median {fmt_pct(res.median_ape)}, p90 {fmt_pct(res.p90_ape)}"


def lomo_summary(errors: pd.DataFrame) -> str:
    """One line: the worst held-out model's median (and p90) APE per regime."""
    parts = []
    for regime, rows in errors.groupby("regime", sort=False):
        worst = rows.loc[rows.median_ape.idxmax()]
        label = "decode-sized" if regime == "decode" else "prefill-sized"
        parts.append(
            f"{label}: median {fmt_pct(rows.median_ape.median())} over models, worst "
            f"{worst.model} {fmt_pct(worst.median_ape)} (p90 {fmt_pct(worst.p90_ape)})"
        )
    return "; ".join(parts)


def provenance(
    fit: OpsFit, errors: pd.DataFrame, table_dir: Path, gpu: str, base: HardwareSpec,
    tp: TpReport | None = None,
) -> list[str]:  # fmt: skip
    """Header comment lines: command, date, sources, peaks, residuals."""
    commit = source_commit(table_dir)
    source = (
        f"Vidur profiling tables (github.com/microsoft/vidur, data/profiling/compute/{gpu}/"
        f"MODEL/mlp.csv, commit {commit}; MIT licence; Agrawal et al., MLSys 2024)"
        if commit
        else "measured tables (no README.md naming a source commit next to them)"
    )
    tp = tp or TpReport()
    return [
        f"Fitted {datetime.date.today().isoformat()} by `kvsim calibrate --from-table {table_dir} "
        f"--gpu {gpu} --tp-degrees {tp.degrees}` (kvsim {version('kvsim')}).",
        f"Source: {source};",
        f"  {fit.rows} rows with tensor-parallel degree {tp.label} (per-GPU shapes), models: "
        f"{', '.join(fit.models)}.",
        "Efficiencies are fractions of this profile's peaks: compute.bf16_flops "
        f"{base.compute.bf16_flops / 1e12:.4g} TFLOP/s, "
        f"hbm.bandwidth {base.hbm.bandwidth / 1e12:.4g} TB/s.",
        f"Per-layer fixed cost (latencies of 4 GEMMs, 2 norms, rope, activation, add): "
        f"{fit.layer_fixed_s * 1e6:.1f} us.",
        f"Leave-one-model-out error of per-layer time (APE; decode-sized = at most "
        f"{DECODE_MAX_TOKENS} tokens):",
        f"  {lomo_summary(errors)}.",
        *tp.lines(),
        "Attention stays a roofline (efficiency.attention, efficiency.hbm): the tables hold no",
        "attention kernels.",
    ]


@dataclass(frozen=True)
class TpReport:
    """Which tensor-parallel rows a fit took, and the checks on the others."""

    degrees: str = "1"  # --tp-degrees: "1" or "all"
    tp_errors: pd.DataFrame | None = None
    comm: CommFit | None = None

    @property
    def label(self) -> str:
        return "1" if self.degrees == "1" else "1, 2, 4 and 8"

    def lines(self) -> list[str]:
        """Header lines: the held-out error on tp > 1 rows, the collective fit."""
        out = []
        if self.tp_errors is not None and len(self.tp_errors):
            out += [
                "Leave-one-model-out on the tp > 1 rows (per-GPU shapes of tp 2, 4, 8):",
                f"  {lomo_summary(self.tp_errors)}.",
            ]
        if self.comm is not None:
            errs = ", ".join(
                f"{r.workers} GPUs {fmt_pct(r.median_ape)}" for r in self.comm.errors.itertuples()
            )
            out.append(
                f"interconnect: all-reduce fitted on {self.comm.source.parent.name}/"
                f"{self.comm.source.name} (single node, messages >= 1 MiB); median APE {errs}."
            )
        return out


def notes(fit: OpsFit) -> dict[str, str]:
    """Comments for the fitted keys of the efficiency section."""
    g = fit.gemm.residual
    kernel_notes = {kind: f"fit: op-time APE {_ape(k.residual)}" for kind, k in fit.kernels.items()}
    return {
        "gemm": "fit: large-GEMM fraction of compute.bf16_flops",
        "gemm_memory": "fit: weight-streaming fraction of hbm.bandwidth",
        "gemm_latency": "fit: fixed time of one GEMM",
        "gemm_blend": f"fit: p of latency + (compute^p + memory^p)^(1/p); op-time APE {_ape(g)}",
        "layer_overhead": "fit: the kernels below are modelled one by one; no other per-layer work",
        "kernels": "fit: blend(latency + row/row_bandwidth, tokens*row/(hbm.bandwidth*memory))",
        **kernel_notes,
    }


def calibrate_from_table(
    table_dir: str | Path, gpu: str, out: str | Path, base: str | None = None,
    degrees: str = "all", comm_dir: str | Path | None = None,
) -> TableCalibration:  # fmt: skip
    """Fit, cross-check (leave-one-model-out) and write a calibrated profile.

    ``degrees``: fit the rows of tensor-parallel degree 1 only (``1``: how the bundled
    profiles were fitted) or of every degree (``all``: the tp > 1 rows are per-GPU shapes).
    The held-out check reports degree 1 and degrees > 1 apart. ``comm_dir`` (default:
    ``measured-comm`` beside ``table_dir``): NCCL tables for the profile's interconnect.
    """
    table_dir, out = Path(table_dir), Path(out)
    if gpu not in BASE_PROFILES:
        raise KvsimError(f"--gpu {gpu!r}: expected one of {', '.join(BASE_PROFILES)}")
    if out.suffix not in (".yaml", ".yml"):
        raise KvsimError(f"--out {out}: expected a .yaml file for the calibrated profile")
    if degrees not in ("1", "all"):
        raise KvsimError(f"--tp-degrees {degrees!r}: expected 1 or all")
    base_spec, base_text = load_base(base or BASE_PROFILES[gpu])
    table = usable_rows(read_tables(table_dir, gpu), 1 if degrees == "1" else None)
    fit = fit_ops(table, peaks_of(base_spec))
    errors, layers = leave_one_model_out(table, base_spec, held_tp="1")
    tp_errors = None
    if degrees == "all":
        tp_errors, _ = leave_one_model_out(table, base_spec, held_tp=">1")
    comm = _fit_comm(table_dir, comm_dir, gpu, base_spec)
    report = TpReport(degrees, tp_errors, comm)
    eff = calibrated_efficiency(fit, base_spec.efficiency)
    header = provenance(fit, errors, table_dir, gpu, base_spec, report)
    text = render_profile(base_text, out.stem, eff, header, notes(fit))
    if comm is not None:
        text = interconnect_text(text, comm)
    yaml.safe_load(text)  # a rendering bug shows up here, not in the user's next run
    spec = write_profile(out, text)
    return TableCalibration(fit, errors, layers, spec, out, tp_errors, comm)


def _fit_comm(
    table_dir: Path, comm_dir: str | Path | None, gpu: str, base: HardwareSpec
) -> CommFit | None:
    """The collective fit for a base profile with an interconnect (None without one, or
    without tables where none were asked for)."""
    if base.interconnect is None:
        return None
    folder = Path(comm_dir) if comm_dir is not None else table_dir.parent / "measured-comm"
    if comm_dir is None and not (folder / gpu / "all_reduce.csv").is_file():
        return None
    return fit_comm(folder, gpu, base.interconnect.bandwidth)


def interconnect_text(text: str, comm: CommFit) -> str:
    """The profile's ``interconnect`` section with the fitted collective parameters."""
    p = comm.params
    errs = ", ".join(f"{r.workers} GPUs {fmt_pct(r.median_ape)}" for r in comm.errors.itertuples())
    fitted = {
        "latency": (f"{p.latency_s * 1e6:.4g}us", f"fit: all-reduce latency (eager NCCL); "
                    f"median APE >= 1 MiB: {errs}"),
        "efficiency": (fmt_number(p.efficiency), "fit: large-message fraction of bandwidth"),
        "half_efficiency_bytes": (
            f"{p.half_efficiency_bytes / 2**20:.4g}MiB", "fit: message size at half that efficiency"
        ),
        "workers_exponent": (fmt_number(p.workers_exponent), "fit: exponent on 2(N-1)/N"),
    }  # fmt: skip
    for key, (value, comment) in fitted.items():
        text = set_value(text, "interconnect", key, value, comment)
    return text


def lomo_markdown(errors: pd.DataFrame, gpu: str) -> str:
    """The leave-one-model-out table as markdown (one row per held-out model)."""
    head = "decode median | decode p90 | prefill median | prefill p90 | token counts"
    lines = [f"| {gpu}: held-out model | {head} |", "|---|---|---|---|---|---|"]
    for model, rows in errors.groupby("model"):
        by = rows.set_index("regime")
        cells = [
            fmt_pct(by.loc[regime, stat])
            for regime in ("decode", "prefill")
            for stat in ("median_ape", "p90_ape")
        ]
        lines.append(f"| {model} | {' | '.join(cells)} | {int(by.points.sum())} |")
    return "\n".join(lines)
