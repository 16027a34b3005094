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
# # 01 · Quickstart: one config, one run, the HBM pressure curve
#
# kvsim simulates an LLM inference engine step by step: a continuous-batching scheduler, a
# roofline cost model for each step, and the KV cache in HBM (and, in other modes, DRAM and
# SSD). This notebook runs the bundled quickstart config — vLLM-style serving of Llama-3-8B
# on one H100 SXM, 400 chat-like requests — reads the output files with pandas, and draws
# the HBM pressure curve. It is the README's first command, step by step.
#
# Open it with `jupytext --to notebook notebooks/01-quickstart.py` (or the jupytext
# Jupyter extension); run it from any folder: it writes its run directory
# `runs/01-quickstart/` in the working directory (replaced on each run), and nothing else.

# %%
from importlib.resources import files
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from sim.config import load_config
from sim.run import simulate
from sim.rundir import write_run

CONFIGS = Path(str(files("experiments") / "configs"))
print((CONFIGS / "quickstart.yaml").read_text())

# %% [markdown]
# ## Run it
#
# `load_config` reads the YAML, fills in the model and hardware profiles and validates every
# key (a typo is one clear error); `--set`-style overrides go in the second argument.
# `simulate` runs the engine and returns the tables; `write_run` writes the run directory,
# exactly what `kvsim run experiments/configs/quickstart.yaml --out runs/01-quickstart` does
# (with `--force` the second time: `kvsim run` refuses to overwrite a folder unasked).

# %%
config = load_config(CONFIGS / "quickstart.yaml")
block_mib = config.block_bytes / 2**20
print(f"{config.model.name} on {config.hardware.name}: KV block = {block_mib:.0f} MiB")
result = simulate(config)
run = write_run(result, Path("runs/01-quickstart"))
sorted(p.name for p in run.iterdir())

# %% [markdown]
# ## Read the files
#
# `summary.json` holds the run's figures, `requests.parquet` one row per request and
# `timeline.parquet` one row per engine step ([docs/outputs.md](../docs/outputs.md) lists
# every column).

# %%
import json

summary = json.loads((run / "summary.json").read_text())
{
    k: summary[k]
    for k in (
        "requests_finished",
        "output_tokens_per_s",
        "ttft_p50_s",
        "tpot_p50_s",
        "preemptions",
        "kv_pool_bytes",
        "hbm_peak_bytes",
    )
}

# %%
requests = pd.read_parquet(run / "requests.parquet")
requests[["prompt_tokens", "output_tokens", "ttft_s", "tpot_s", "e2e_s"]].describe().round(3)

# %%
timeline = pd.read_parquet(run / "timeline.parquet")
timeline[["time_s", "step_s", "batch_size", "step_tokens", "waiting", "hbm_kv_bytes"]].head()

# %% [markdown]
# ## The HBM pressure curve
#
# HBM holds weights, the runtime reserve, the step's activations and the KV cache. vLLM
# carves the KV pool at start-up so that the activation peak of the largest step always
# fits; the pool's limit is the dashed line. When running requests fill the pool, new ones
# wait (or the newest is preempted).

# %%
GiB = 2**30
parts = [
    "hbm_weights_bytes",
    "hbm_reserve_bytes",
    "hbm_activation_bytes",
    "hbm_kv_running_bytes",
    "hbm_kv_cached_bytes",
]
fig, ax = plt.subplots(figsize=(7, 3.2))
ax.stackplot(
    timeline.time_s,
    *(timeline[p] / GiB for p in parts),
    labels=[p.removeprefix("hbm_").removesuffix("_bytes") for p in parts],
    step="post",
)
limit = timeline.hbm_weights_bytes + timeline.hbm_reserve_bytes + timeline.hbm_kv_pool_bytes
ax.plot(timeline.time_s, limit / GiB, "k--", lw=1, label="KV pool limit")
ax.axhline(config.hardware.hbm.capacity / GiB, color="k", lw=1, label="HBM capacity")
ax.set(xlabel="simulated time (s)", ylabel="HBM (GiB)", ylim=(0, None))
ax.legend(fontsize=7, loc="lower right", ncol=2)
fig.tight_layout()

# %% [markdown]
# The same figure, drawn by the plotting package (`kvsim plot runs/01-quickstart --kind
# hbm-pressure`):

# %%
from experiments.plots import PlotOptions, hbm_pressure_data, plot_hbm_pressure

out = plot_hbm_pressure([run], run / "hbm-pressure.png", PlotOptions())
print(out)
hbm_pressure_data(run).tail(3)

# %% [markdown]
# ## Change one thing
#
# Halve the HBM (a 40 GiB card): the KV pool shrinks, fewer requests fit at once, queues
# grow and TTFT goes up.

# %%
small = simulate(load_config(CONFIGS / "quickstart.yaml", ["hardware.hbm.capacity=40GiB"]))
pd.DataFrame({"80 GiB": result.summary, "40 GiB": small.summary}).loc[
    ["kv_pool_bytes", "mean_batch_size", "ttft_p50_s", "ttft_p99_s", "output_tokens_per_s"]
]
