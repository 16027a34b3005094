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
from validation.fit import DECODE_MAX_TOKENS, Residual
from validation.opsfit import (
    OpsFit,
    calibrated_efficiency,
    fit_ops,
    leave_one_model_out,
    peaks_of,
    usable_rows,
)
from validation.profile import render_profile, write_profile

BASE_PROFILES = {"h100": "h100-sxm", "a100": "a100-80g-sxm"}
COMMIT = re.compile(r"commit\s+`?([0-9a-f]{40})`?")


@dataclass(frozen=True)
class TableCalibration:
    """The outcome of one ``--from-table`` calibration."""

    fit: OpsFit
    errors: pd.DataFrame
    layers: pd.DataFrame
    profile: HardwareSpec
    path: Path


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


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _ape(res: Residual) -> str:
    return f"median {_pct(res.median_ape)}, p90 {_pct(res.p90_ape)}"


def lomo_summary(errors: pd.DataFrame) -> str:
    """One line: the worst held-out model's median (and p90) APE per regime."""
    parts = []
    for regime, rows in errors.groupby("regime", sort=False):
        worst = rows.loc[rows.median_ape.idxmax()]
        label = "decode-sized" if regime == "decode" else "prefill-sized"
        parts.append(
            f"{label}: median {_pct(rows.median_ape.median())} over models, worst "
            f"{worst.model} {_pct(worst.median_ape)} (p90 {_pct(worst.p90_ape)})"
        )
    return "; ".join(parts)


def provenance(
    fit: OpsFit, errors: pd.DataFrame, table_dir: Path, gpu: str, base: HardwareSpec
) -> list[str]:
    """Header comment lines: command, date, sources, peaks, residuals."""
    commit = source_commit(table_dir)
    source = (
        f"Vidur profiling tables (github.com/microsoft/vidur, data/profiling/compute/{gpu}/"
        f"MODEL/mlp.csv, commit {commit}; MIT licence; Agrawal et al., MLSys 2024)"
        if commit
        else "measured tables (no README.md naming a source commit next to them)"
    )
    return [
        f"Fitted {datetime.date.today().isoformat()} by `kvsim calibrate --from-table {table_dir} "
        f"--gpu {gpu}` (kvsim {version('kvsim')}).",
        f"Source: {source};",
        f"  {fit.rows} rows with tensor-parallel degree 1, models: {', '.join(fit.models)}.",
        "Efficiencies are fractions of this profile's peaks: compute.bf16_flops "
        f"{base.compute.bf16_flops / 1e12:.4g} TFLOP/s, "
        f"hbm.bandwidth {base.hbm.bandwidth / 1e12:.4g} TB/s.",
        f"Per-layer fixed cost (latencies of 4 GEMMs, 2 norms, rope, activation, add): "
        f"{fit.layer_fixed_s * 1e6:.1f} us.",
        f"Leave-one-model-out error of per-layer time (APE; decode-sized = at most "
        f"{DECODE_MAX_TOKENS} tokens):",
        f"  {lomo_summary(errors)}.",
        "Attention stays a roofline (efficiency.attention, efficiency.hbm): the tables hold no",
        "attention kernels. Tensor parallelism is not simulated: tp > 1 rows are not used.",
    ]


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
    table_dir: str | Path, gpu: str, out: str | Path, base: str | None = None
) -> TableCalibration:
    """Fit, cross-check (leave-one-model-out) and write a calibrated profile."""
    table_dir, out = Path(table_dir), Path(out)
    if gpu not in BASE_PROFILES:
        raise KvsimError(f"--gpu {gpu!r}: expected one of {', '.join(BASE_PROFILES)}")
    if out.suffix not in (".yaml", ".yml"):
        raise KvsimError(f"--out {out}: expected a .yaml file for the calibrated profile")
    base_spec, base_text = load_base(base or BASE_PROFILES[gpu])
    table = usable_rows(read_tables(table_dir, gpu))
    fit = fit_ops(table, peaks_of(base_spec))
    errors, layers = leave_one_model_out(table, base_spec)
    eff = calibrated_efficiency(fit, base_spec.efficiency)
    header = provenance(fit, errors, table_dir, gpu, base_spec)
    text = render_profile(base_text, out.stem, eff, header, notes(fit))
    yaml.safe_load(text)  # a rendering bug shows up here, not in the user's next run
    spec = write_profile(out, text)
    return TableCalibration(fit=fit, errors=errors, layers=layers, profile=spec, path=out)


def lomo_markdown(errors: pd.DataFrame, gpu: str) -> str:
    """The leave-one-model-out table as markdown (one row per held-out model)."""
    head = "decode median | decode p90 | prefill median | prefill p90 | token counts"
    lines = [f"| {gpu}: held-out model | {head} |", "|---|---|---|---|---|---|"]
    for model, rows in errors.groupby("model"):
        by = rows.set_index("regime")
        cells = [
            _pct(by.loc[regime, stat])
            for regime in ("decode", "prefill")
            for stat in ("median_ape", "p90_ape")
        ]
        lines.append(f"| {model} | {' | '.join(cells)} | {int(by.points.sum())} |")
    return "\n".join(lines)
