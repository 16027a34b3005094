"""``kvsim validate``: the mini-engine and the simulator on one workload, step by step.

For each KV mode the mini-engine serves the validation workload ``repeats`` times (after a
warm-up run); the workload is a closed batch, so every run takes the same steps and each
step's measured time is its median over the runs. The simulator runs the same config and
requests. When both take the same steps (same batch sizes and tokens, in order; the
report says whether they did) step *i* is compared with step *i*; otherwise each measured
step is priced by the simulator's cost model and link model instead.

Errors: ``step_mape`` = mean over steps of |simulated / measured - 1|; ``e2e_error`` =
|simulated total / measured total - 1|. The top level pools the steps of every mode and
takes the worst mode's ``e2e_error``.

Three cost models are compared: the profile's (the fitted roofline), the uncalibrated
``baseline`` and, under ``table``, the measured-table model (``hardware.cost_model: table``
on the calibration's raw microbenchmark measurements, ``sim.cost.tables``; the rest of the
profile, its ``step_overhead`` included, as it is). Where no table can price the model the
report says why instead.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sim.config.hardware import HardwareSpec
from sim.config.loader import validate
from sim.config.run import RunConfig
from sim.cost import cost_model_for
from sim.errors import KvsimError
from sim.run import simulate
from sim.workload import build_requests
from validation.engine import EngineRun, MiniEngine
from validation.microbench import device_name
from validation.profile import fmt_pct
from validation.scenario import pin_threads, scenario_config
from validation.timing import statistic

KINDS = ("prefill", "decode", "mixed", "with_transfers")


def measured_steps(runs: list[EngineRun], how: str = "median") -> pd.DataFrame:
    """One row per step: the first run's batch columns, the median (or min) time over runs."""
    first = runs[0].steps
    for run in runs[1:]:
        if list(run.steps.step_tokens) != list(first.step_tokens):
            raise KvsimError("the mini-engine took different steps in two runs of one workload")
    steps = first.drop(columns=["time_s"]).copy()
    times = np.stack([r.steps.step_s.to_numpy() for r in runs])
    steps["step_s"] = np.median(times, axis=0) if how == "median" else times.min(axis=0)
    return steps


def replay(config: RunConfig, hw: HardwareSpec, steps: pd.DataFrame) -> np.ndarray:
    """The simulator's cost and link models pricing each measured step (no scheduling)."""
    cost = cost_model_for(config.model_copy(update={"hardware": hw}))  # roofline or table
    link = hw.link
    out = []
    for row in steps.itertuples():
        t = cost.step(np.array(row.new_tokens), np.array(row.context), row.sampled).total_s
        for moved, bandwidth in ((row.h2d_bytes, link.h2d), (row.d2h_bytes, link.d2h)):
            if moved:
                t += link.latency + moved / bandwidth
        out.append(t)
    return np.asarray(out)


def step_kinds(steps: pd.DataFrame) -> dict[str, np.ndarray]:
    """Masks of the kinds of step."""
    prefill, decode = steps.prefill_tokens > 0, steps.decode_tokens > 0
    return {
        "prefill": (prefill & ~decode).to_numpy(),
        "decode": (decode & ~prefill).to_numpy(),
        "mixed": (prefill & decode).to_numpy(),
        "with_transfers": ((steps.h2d_bytes + steps.d2h_bytes) > 0).to_numpy(),
    }


def errors(
    steps: pd.DataFrame, simulated: np.ndarray, measured_total: float, sim_total: float
) -> dict:
    """step_mape, e2e_error and the per-kind breakdown."""
    measured = steps.step_s.to_numpy()
    ape = np.abs(simulated / measured - 1.0)
    kinds = {}
    for kind, mask in step_kinds(steps).items():
        if mask.any():
            kinds[kind] = {
                "steps": int(mask.sum()),
                "step_mape": float(ape[mask].mean()),
                "measured_mean_s": float(measured[mask].mean()),
                "simulated_mean_s": float(simulated[mask].mean()),
            }
    return {
        "steps": len(steps),
        "step_mape": float(ape.mean()),
        "e2e_error": float(abs(sim_total / measured_total - 1.0)),
        "measured_total_s": measured_total,
        "simulated_total_s": sim_total,
        "by_kind": kinds,
    }


def compare(
    config: RunConfig, requests, steps: pd.DataFrame, measured_total: float
) -> tuple[dict, np.ndarray]:
    """Simulate ``config`` and compare it with the measured steps."""
    result = simulate(config, requests)
    timeline = result.timeline
    same = list(zip(timeline.batch_size, timeline.step_tokens, strict=False)) == list(
        zip(steps.batch_size, steps.step_tokens, strict=False)
    )
    if same:
        simulated, sim_total = timeline.step_s.to_numpy(), float(result.summary["sim_time_s"])
    else:
        simulated = replay(config, config.hardware, steps)
        sim_total = float(simulated.sum())
    report = errors(steps, simulated, measured_total, sim_total)
    report["schedule_match"] = same
    report["pairing"] = "step by step" if same else "cost model on the measured batches"
    report["h2d_bytes"] = {
        "measured": int(steps.h2d_bytes.sum()),
        "simulated": float(result.summary["h2d_bytes"]),
    }
    report["d2h_bytes"] = {
        "measured": int(steps.d2h_bytes.sum()),
        "simulated": float(result.summary["d2h_bytes"]),
    }
    return report, simulated


def table_profile(
    hw: HardwareSpec, table: Path | None, config: RunConfig
) -> tuple[HardwareSpec | None, dict]:
    """``hw`` with ``cost_model: table`` on the raw measurements ``table``, and the report's
    note on it; (None, why not) where there is no table or it cannot price ``config``'s model."""
    if table is None:
        why = ("no raw measurements: give --table (the OUT.measurements.csv that kvsim "
               "calibrate --device writes beside OUT.yaml)")  # fmt: skip
        return None, {"available": False, "reason": why}
    data = dict(hw.model_dump(mode="json"), cost_model="table", cost_table=str(table))
    try:
        spec = validate(HardwareSpec, data, str(table))
        cost = cost_model_for(config.model_copy(update={"hardware": spec}))
    except KvsimError as exc:
        return None, {"available": False, "reason": str(exc)}
    held = cost.table.from_roofline  # type: ignore[attr-defined]  # a TableCostModel
    return spec, {"available": True, "cost_table": str(table), "from_roofline": held}


def compare_mode(
    config: RunConfig, baseline: HardwareSpec, requests, runs: list[EngineRun], how: str,
    table: HardwareSpec | None = None,
) -> tuple[dict, pd.DataFrame]:  # fmt: skip
    """One mode's report: the profile, the baseline profile and (``table``: its profile with
    ``cost_model: table``) the measured-table model against the measured runs.

    ``how``: ``median`` or ``min`` over the runs, per step and of the run totals.
    """
    steps = measured_steps(runs, how)
    totals = [r.total_s for r in runs]
    total = float(np.median(totals) if how == "median" else np.min(totals))
    report, simulated = compare(config, requests, steps, total)
    base_config = config.model_copy(update={"hardware": baseline})
    report["baseline"], base_sim = compare(base_config, requests, steps, total)
    steps = steps.assign(simulated_s=simulated, baseline_s=base_sim, mode=config.kv.mode)
    if table is not None:
        table_config = config.model_copy(update={"hardware": table})
        report["table"], table_sim = compare(table_config, requests, steps, total)
        steps = steps.assign(table_s=table_sim)
    report["preemptions"] = runs[0].preemptions
    return report, steps


def pooled(
    modes: dict[str, dict], steps: pd.DataFrame, key: str = "simulated_s",
    section: str | None = None,
) -> dict:  # fmt: skip
    """Top-level figures over every mode: pooled step errors (column ``key``), the worst
    mode's e2e error (of each mode's report, or its sub-report ``section``)."""
    ape = np.abs(steps[key] / steps.step_s - 1.0)
    part = (lambda r: r) if section is None else (lambda r: r[section])
    by_kind = {}
    masks = step_kinds(steps)
    for kind in KINDS:
        if masks[kind].any():
            by_kind[kind] = {
                "steps": int(masks[kind].sum()),
                "step_mape": float(ape[masks[kind]].mean()),
            }
    return {
        "steps": len(steps),
        "step_mape": float(ape.mean()),
        "e2e_error": max(part(r)["e2e_error"] for r in modes.values()),
        "by_kind": by_kind,
    }


def run_validation(
    hw: HardwareSpec, profile: str, baseline: HardwareSpec, device: str, quick: bool,
    repeats: int, modes: tuple[str, ...], table: Path | None = None,
) -> tuple[dict, pd.DataFrame]:  # fmt: skip
    """The whole report (as a dict) and every measured step with its simulated times
    (``table``: raw measurements for the measured-table model, :func:`table_profile`)."""
    pin_threads(device)
    configs = {mode: scenario_config(hw, "validate", device, mode, quick) for mode in modes}
    table_hw, table_note = table_profile(hw, table, configs[modes[0]])
    bt = next(iter(configs.values())).engine.block_tokens
    requests = build_requests(configs[modes[0]].workload, configs[modes[0]].seed, block_tokens=bt)
    runs: dict[str, list[EngineRun]] = {mode: [] for mode in modes}
    for mode in modes:  # warm-up: allocator, kernels, caches
        MiniEngine(configs[mode], requests, device).run()
    for _ in range(repeats):  # interleaved, so a slow spell of a shared machine hits every mode
        for mode in modes:
            runs[mode].append(MiniEngine(configs[mode], requests, device).run())
    per_mode, frames = {}, []
    for mode in modes:
        per_mode[mode], steps = compare_mode(
            configs[mode], baseline, requests, runs[mode], statistic(device), table_hw
        )
        frames.append(steps)
    steps = pd.concat(frames, ignore_index=True)
    report = {
        "device": device,
        "device_name": device_name(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "profile": profile,
        "baseline_profile": baseline.name,
        "quick": quick,
        "repeats": repeats,
        "statistic": statistic(device),
        **pooled(per_mode, steps),
        "baseline": pooled(per_mode, steps, "baseline_s", "baseline"),
        "table": table_note | (pooled(per_mode, steps, "table_s", "table") if table_hw else {}),
        "modes": per_mode,
    }
    return report, steps


def write_report(report: dict, steps: pd.DataFrame, out: Path) -> list[Path]:
    """``report.json``, ``steps.csv``, ``steps.png`` and ``summary.md`` in ``out``."""
    from validation.plots import plot_steps

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    steps.to_csv(out / "steps.csv", index=False)
    plot_steps(steps, out / "steps.png", report)
    (out / "summary.md").write_text(summary_markdown(report))
    return [out / name for name in ("report.json", "steps.csv", "steps.png", "summary.md")]


def _columns(report: dict) -> list[tuple[str, str]]:
    """(label, sub-report) of each cost model in the report: fitted, table (if any), baseline."""
    table = [("table ", "table")] if report.get("table", {}).get("available") else []
    return [("", ""), *table, ("baseline ", "baseline")]


def _mode_lines(report: dict) -> list[str]:
    cols = _columns(report)
    names = " | ".join(f"{label}step MAPE | {label}e2e error" for label, _ in cols)
    lines = [f"| mode | steps | pairing | {names} |", "|---" * (3 + 2 * len(cols)) + "|"]
    for mode, r in report["modes"].items():
        parts = [r[key] if key else r for _, key in cols]
        cells = " | ".join(f"{fmt_pct(p['step_mape'])} | {fmt_pct(p['e2e_error'])}" for p in parts)
        lines.append(f"| {mode} | {r['steps']} | {r['pairing']} | {cells} |")
    return lines


def _kind_lines(report: dict) -> list[str]:
    cols = _columns(report)
    names = " | ".join(f"{label}step MAPE" for label, _ in cols)
    lines = [f"| kind of step | steps | {names} |", "|---" * (2 + len(cols)) + "|"]
    for kind, r in report["by_kind"].items():
        parts = [report[key]["by_kind"][kind] if key else r for _, key in cols]
        cells = " | ".join(fmt_pct(p["step_mape"]) for p in parts)
        lines.append(f"| {kind} | {r['steps']} | {cells} |")
    return lines


def table_line(report: dict) -> str:
    """One sentence on the measured-table model: its figures, or why it is not reported."""
    table = report.get("table", {"available": False, "reason": "not run"})
    if not table.get("available"):
        return f"Measured-table cost model: not reported: {table['reason']}"
    held = table["from_roofline"]
    rest = f"; from the profile's roofline: {', '.join(held)}" if held else ""
    return (
        f"Measured-table cost model (`cost_model: table` on `{table['cost_table']}`{rest}; "
        f"the profile's step_overhead): step MAPE {fmt_pct(table['step_mape'])}, "
        f"e2e error {fmt_pct(table['e2e_error'])}."
    )


def summary_markdown(report: dict) -> str:
    """A short human summary of the report."""
    lines = [
        f"# Validation on {report['device_name']} ({report['device']})",
        "",
        f"Profile `{report['profile']}` against the mini-engine (torch {report['torch']}, "
        f"{report['threads']} thread(s), {report['repeats']} timed runs per mode, "
        f"{'quick' if report['quick'] else 'full'} workload), {report['date']}.",
        "",
        *_mode_lines(report),
        "",
        *_kind_lines(report),
        "",
        f"Overall: step MAPE {fmt_pct(report['step_mape'])}, "
        f"e2e error {fmt_pct(report['e2e_error'])} "
        f"(baseline `{report['baseline_profile']}`: {fmt_pct(report['baseline']['step_mape'])}, "
        f"{fmt_pct(report['baseline']['e2e_error'])}).",
        "",
        table_line(report),
    ]
    return "\n".join(lines) + "\n"
