"""Figures of the validation package: measured against predicted times."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd


def plot_held_out(layers: pd.DataFrame, models: list[str], title: str, out: str | Path) -> Path:
    """Per-layer time against tokens, measured (dots) and predicted (line), log-log.

    Args:
        layers: ``model, tokens, measured_s, predicted_s`` of held-out models.
        models: the models to draw, one panel each.
        title: the figure's title.
        out: PNG or PDF path.
    """
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 4.2), dpi=130)
    for ax, model in zip(list(axes) if len(models) > 1 else [axes], models, strict=True):
        rows = layers[layers.model == model].sort_values("tokens")
        ax.loglog(rows.tokens, rows.measured_s * 1e3, ".", ms=4, color="#4c72b0", label="measured")
        ax.loglog(
            rows.tokens,
            rows.predicted_s * 1e3,
            "-",
            lw=1.4,
            color="#c44e52",
            label="predicted (held out)",
        )
        ax.set(xlabel="tokens in the forward pass", ylabel="per-layer time (ms)", title=model)
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_steps(steps: pd.DataFrame, out: str | Path, report: dict) -> Path:
    """Measured against simulated step times: a scatter (log-log) and the step sequence."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=130)
    colors = {"hbm": "#4c72b0", "dram_centric": "#dd8452"}
    for mode, rows in steps.groupby("mode", sort=False):
        color = colors.get(str(mode), "#55a868")
        left.loglog(rows.step_s * 1e3, rows.simulated_s * 1e3, "o", ms=3.5, color=color,
                    label=f"{mode} (calibrated)")  # fmt: skip
        left.loglog(rows.step_s * 1e3, rows.baseline_s * 1e3, "x", ms=3.5, color=color, alpha=0.5,
                    label=f"{mode} (baseline {report['baseline_profile']})")  # fmt: skip
        if "table_s" in rows:
            left.loglog(rows.step_s * 1e3, rows.table_s * 1e3, "+", ms=4, color=color,
                        label=f"{mode} (measured tables)")  # fmt: skip
        right.plot(rows.step_s.to_numpy() * 1e3, "-", color=color, lw=1.2, label=f"{mode} measured")
        right.plot(
            rows.simulated_s.to_numpy() * 1e3, "--", color=color, lw=1.0, label=f"{mode} simulated"
        )
    lo = min(steps.step_s.min(), steps.simulated_s.min(), steps.baseline_s.min()) * 1e3 * 0.8
    hi = max(steps.step_s.max(), steps.simulated_s.max()) * 1e3 * 1.25
    left.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    left.set(xlabel="measured step time (ms)", ylabel="simulated step time (ms)", title="per step")
    right.set(xlabel="step", ylabel="step time (ms)", title="steps in order")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{report['device_name']}: step MAPE {100 * report['step_mape']:.1f}%, "
        f"e2e error {100 * report['e2e_error']:.1f}% ({report['profile']})", fontsize=10,
    )  # fmt: skip
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_hit_rate_curve(table: pd.DataFrame, args: object, out: str | Path) -> Path:
    """Throughput and mean TTFT against the CPU-cache hit rate (``validation.hitrate``).

    Args:
        table: ``hit_rate, request_throughput, mean_ttft_s`` per point.
        args: the run's arguments (model, hardware, prompt, output, concurrency), for the title.
        out: PNG or PDF path.
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.8), dpi=130)
    left.plot(table.hit_rate, table.request_throughput, "o-", color="#4c72b0")
    left.set(xlabel="hit rate (share of each prompt served before)", ylabel="requests / s")
    right.plot(table.hit_rate, table.mean_ttft_s * 1e3, "o-", color="#c44e52")
    right.set(xlabel="hit rate (share of each prompt served before)", ylabel="mean TTFT (ms)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    a = vars(args)
    fig.suptitle(
        f"{a['model']} on {a['hardware']} (TP {a['tp']}): {a['requests']} requests of "
        f"{a['prompt']} + {a['output']} tokens, {a['concurrency']} at a time",
        fontsize=10,
    )
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out)
    plt.close(fig)
    return out
