# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Calibration: fit the cost model to measured kernels, then check it
#
# kvsim's step time comes from a roofline cost model whose efficiencies and fixed
# latencies live in the hardware profile ([docs/cost-model.md](../docs/cost-model.md)). The
# validation package measures real torch kernels, fits those parameters, and then runs a
# small real serving engine (a torch mini-Llama with a paged KV cache) beside the simulator
# to see how far apart they are. Here everything runs on this machine's CPU, in its
# `--quick` form; on a GPU the same commands take `--device cuda`
# ([docs/validation.md](../docs/validation.md), which also has the H100/A100 fits to
# published operator tables).
#
# Needs the validation extra (`pip install -e '.[validation]'`, torch CPU build). Without
# torch the notebook says so, shows the placeholder profile and skips what measures. It
# writes its profile and reports to `runs/04-calibration/` in the working directory, made
# afresh on each run, and nothing else.

# %%
import json
import shlex
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import yaml

from sim.cli import main
from sim.config import load_hardware
from sim.config.hardware import HardwareSpec
from sim.cost.roofline import CostParams, gemm_seconds

try:
    import torch  # noqa: F401  (what kvsim calibrate and kvsim validate measure with)

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
SKIPPED = "skipped: torch is not installed"
if not HAVE_TORCH:
    print(
        "torch is not installed, so this notebook skips calibrating and validating and shows "
        "the placeholder profile only; pip install -e '.[validation]' installs it"
    )
HERE = Path("runs/04-calibration")  # this notebook's folder, made afresh
shutil.rmtree(HERE, ignore_errors=True)
HERE.mkdir(parents=True)


def kvsim(command: str) -> None:
    """Run ``kvsim COMMAND`` in this process (as the shell would); fail the cell if it fails."""
    status = main(shlex.split(command))
    assert status == 0, f"kvsim {command} exited with {status}"


# %% [markdown]
# ## 1. Measure and fit
#
# `kvsim calibrate --device cpu` times copies, block copies, the GEMMs of a small model at
# many token counts, the elementwise kernels and attention, then fits the profile's
# parameters to them and writes a new profile (the base profile `cpu-host` with a measured
# and fitted `efficiency` section and a header recording how it was made).

# %%
base = load_hardware("cpu-host")
efficiency = {"cpu-host (placeholder)": base.efficiency.model_dump(exclude={"kernels"})}
if HAVE_TORCH:
    kvsim(f"calibrate --device cpu --quick --out {HERE}/cpu-calibrated.yaml")
    text = (HERE / "cpu-calibrated.yaml").read_text()
    calibrated = HardwareSpec.model_validate(yaml.safe_load(text))
    efficiency["calibrated"] = calibrated.efficiency.model_dump(exclude={"kernels"})
pd.DataFrame(efficiency)

# %% [markdown]
# ## 2. The fit against the measurements
#
# The raw timings are in `cpu-calibrated.measurements.csv`. For the GEMMs: the fitted
# model's prediction (`sim.cost.roofline.gemm_seconds`, the very function the simulator uses)
# against each measured time, by projection.

# %%
if HAVE_TORCH:
    raw = pd.read_csv(HERE / "cpu-calibrated.measurements.csv")
    gemms = raw[raw.kind == "gemm"].copy()
    params = CostParams.from_hardware(calibrated)
    dtype_bytes = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}[gemms.dtype.iloc[0]]
    gemms["predicted_s"] = [
        gemm_seconds(params, t, i, o, dtype_bytes)
        for t, i, o in zip(gemms.tokens, gemms.fan_in, gemms.fan_out, strict=True)
    ]
    gemms["error"] = (gemms.predicted_s / gemms.time_s - 1).abs()
    median, p90 = gemms.error.median(), gemms.error.quantile(0.9)
    print(f"GEMM time error: median {median:.1%}, p90 {p90:.1%}")

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for op, rows in gemms.groupby("op"):
        rows = rows.sort_values("tokens")
        (line,) = ax.plot(rows.tokens, rows.predicted_s * 1e3, lw=1)
        ax.scatter(rows.tokens, rows.time_s * 1e3, s=10, color=line.get_color(), label=op)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="tokens",
        ylabel="time (ms)",
        title="GEMMs: measured (dots) and fitted (lines)",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
else:
    print(SKIPPED)

# %% [markdown]
# ## 3. Measured engine against simulated engine
#
# `kvsim validate` serves a small closed-batch workload with the real torch mini-engine
# (continuous batching, chunked prefill, paged KV) and simulates the same requests with the
# same engine settings, then compares step by step. The baseline is the uncalibrated
# `cpu-host` profile. One KV mode and one timed run here, to stay quick; the default runs
# `hbm` and `dram_centric` three times each.

# %%
if HAVE_TORCH:
    kvsim(
        f"validate --device cpu --profile {HERE}/cpu-calibrated.yaml --quick --modes hbm "
        f"--repeats 1 --out {HERE}/val"
    )
    report = json.loads((HERE / "val" / "report.json").read_text())
    errors = pd.DataFrame(
        {
            "calibrated": {k: report[k] for k in ("step_mape", "e2e_error")},
            "cpu-host baseline": {k: report["baseline"][k] for k in ("step_mape", "e2e_error")},
        }
    )
errors.style.format("{:.1%}") if HAVE_TORCH else SKIPPED

# %%
if HAVE_TORCH:
    steps = pd.read_csv(HERE / "val" / "steps.csv")
    fig, ax = plt.subplots(figsize=(7, 3))
    x = np.arange(len(steps))
    ax.plot(x, steps.step_s * 1e3, "k.-", lw=1, label="measured (mini-engine)")
    ax.plot(x, steps.simulated_s * 1e3, ".-", lw=1, label="simulated, calibrated")
    ax.plot(x, steps.baseline_s * 1e3, ".:", lw=1, label="simulated, cpu-host")
    ax.set(xlabel="step", ylabel="step time (ms)", yscale="log")
    ax.legend(fontsize=7)
    fig.tight_layout()
pd.DataFrame(report["by_kind"]).T if HAVE_TORCH else SKIPPED

# %% [markdown]
# The calibrated profile tracks the measured steps; the placeholder profile, whose
# figures describe a different CPU, is off by a large factor. On a shared or busy machine
# the timings are noisy: `--repeats` and the minimum-over-runs statistic on the CPU are
# there for that. To calibrate a GPU: `kvsim calibrate --device cuda --out my-gpu.yaml`, then
# `kvsim validate --device cuda --profile my-gpu.yaml --out report/`, and use
# `hardware: my-gpu.yaml`-style profiles in your runs (docs/validation.md).
