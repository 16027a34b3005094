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
# # 02 · PagedAttention against DRAM-centric KV
#
# The seed study, small. **PagedAttention** (`kv.mode: hbm`, as vLLM) keeps all KV in an
# HBM pool carved at start-up next to the weights and the activation reserve; when the pool
# is full, requests wait or are preempted. **DRAM-centric** KV (`kv.mode: dram_centric`, as
# Omni Cache) makes host DRAM the home of every block and uses HBM as a cache of hot
# blocks; each step fetches the blocks its attention reads over the host link, layer by
# layer, overlapped with compute.
#
# Three questions: where does PagedAttention run out of HBM, what does DRAM-centric cost in
# host-link traffic, and where is the crossover as host-link bandwidth grows (PCIe gen4,
# gen5, NVLink-C2C)? Llama-2-7B (no grouped-query attention: 512 KiB of KV per token) on
# one H100 SXM, closed batches of 8K-token prompts. The full study is
# `kvsim sweep experiments/configs/seed-study.yaml` (540 points, docs/experiments.md).
#
# Its sweep files and results go to `runs/02-paged-vs-dram-centric/` in the working
# directory, made afresh on each run; it writes nothing else.

# %%
import shutil
from importlib.resources import files
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import yaml

from experiments.runner import run_sweep
from experiments.sweep import load_sweep
from experiments.tasks import Limits

QUICKSTART = Path(str(files("experiments") / "configs" / "quickstart.yaml"))
GiB = 2**30
HERE = Path("runs/02-paged-vs-dram-centric")  # this notebook's folder, made afresh
shutil.rmtree(HERE, ignore_errors=True)
HERE.mkdir(parents=True)

# %% [markdown]
# ## Where PagedAttention runs out of HBM
#
# A sweep file varies any config keys. Batch sizes 1..32, all requests at t = 0, each with
# an 8,192-token prompt and 32 output tokens, in the three variants: `hbm`, `dram_centric`
# with full attention (every block read every step), and `dram_centric` with sparse
# attention (1 sink block + 16 recent + top-64 by heat).

# %%
VARIANTS = {
    "zip": {
        "kv.mode": ["hbm", "dram_centric", "dram_centric"],
        "kv.access": ["full", "full", {"kind": "sparse", "topk_blocks": 64}],
    }
}
base = {
    "base": str(QUICKSTART),
    "set": {
        "model": "llama-2-7b",
        "workload": {
            "kind": "synthetic",
            "num_requests": 1,
            "arrival": {"kind": "all_at_once"},
            "prompt_tokens": 8192,
            "output_tokens": 32,
        },
    },
}
(HERE / "batch.yaml").write_text(
    yaml.safe_dump({**base, "grid": {"workload.num_requests": [1, 4, 8, 16, 32]}, **VARIANTS})
)
batch = run_sweep(
    load_sweep(HERE / "batch.yaml"), HERE / "batch", Limits(workers=2), progress=False
)


def variant(frame):
    """A short label per row: 'hbm', 'dram_centric full', 'dram_centric sparse'."""
    access = np.where(frame["kv.access"].str.contains("sparse"), " sparse", " full")
    return np.where(frame["kv.mode"] == "hbm", "hbm", frame["kv.mode"] + access)


batch["variant"] = variant(batch)
batch.pivot(index="workload.num_requests", columns="variant", values="mean_batch_size").round(1)

# %% [markdown]
# How many of these sequences fit in PagedAttention's pool? Beyond that number it runs
# the batch in waves, however many are waiting, while the DRAM-centric engine, whose KV
# home is DRAM, runs it all at once (the mean batch is lower than the batch because
# sequences finish prefill at different steps). The HBM pressure curves at batch 32:

# %%
paged = batch[(batch.variant == "hbm") & (batch["workload.num_requests"] == 32)].iloc[0]
sequence_bytes = (8192 + 32) * 32 * 2 * 4096 * 2  # tokens x layers x (K, V) x width x bf16
print(
    f"KV pool {paged.kv_pool_bytes / GiB:.1f} GiB = "
    f"{paged.kv_pool_bytes / sequence_bytes:.1f} sequences of 8,224 tokens"
)

# %%
from experiments.plots import HBM_PARTS, hbm_pressure_data

b32 = batch[batch["workload.num_requests"] == 32]
fig, axes = plt.subplots(1, 3, figsize=(10, 2.8), sharey=True)
for ax, (_, row) in zip(axes, b32.iterrows(), strict=True):
    data = hbm_pressure_data(HERE / "batch" / "points" / row.point_id)
    parts = [column for column, _, _ in HBM_PARTS]  # the timeline's HBM parts, bottom up
    ax.stackplot(
        data.time_s, *(data[p] for p in parts), step="post", labels=[p[4:-6] for p in parts]
    )
    ax.axhline(data.capacity_gib.iloc[0], color="k", lw=1)
    ax.set(title=row.variant, xlabel="simulated time (s)")
axes[0].set_ylabel("HBM (GiB)")
axes[-1].legend(fontsize=6, loc="lower right")
fig.tight_layout()

# %% [markdown]
# ## What DRAM-centric costs on the host link
#
# With full attention every decode step reads every block of every sequence; what is not in
# HBM crosses the host link. Sparse attention reads a fixed set per step (81 blocks here),
# so the traffic drops by the ratio of context to hot set.

# %%
b32 = b32.assign(
    h2d_gib=b32.h2d_bytes / GiB,
    stall_share=b32.stall_s / b32.sim_time_s,
)
b32.set_index("variant")[
    ["output_tokens_per_s", "h2d_gib", "hbm_access_hit_rate", "stall_share"]
].round(3)

# %% [markdown]
# ## The crossover as the host link gets faster
#
# The same batch of 32, with the host link's bandwidth (each direction) set from PCIe gen4
# (~25 GB/s achieved) through gen5 (~55 GB/s) to NVLink-C2C (~340 GB/s measured on GH200)
# and beyond.

# %%
LINKS = [25e9, 55e9, 110e9, 220e9, 340e9, 680e9, 1360e9]
(HERE / "link.yaml").write_text(
    yaml.safe_dump(
        {
            **base,
            "set": {**base["set"], "workload.num_requests": 32},
            "grid": {"hardware.link.h2d": LINKS},
            **VARIANTS,
        }
    )
)
link = run_sweep(load_sweep(HERE / "link.yaml"), HERE / "link", Limits(workers=2), progress=False)
link["variant"] = variant(link)
table = link.pivot(index="hardware.link.h2d", columns="variant", values="output_tokens_per_s")
table.index = [f"{bw / 1e9:g} GB/s" for bw in table.index]
table.round(1)

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.2))
for variant, rows in link.groupby("variant"):
    ax.plot(rows["hardware.link.h2d"] / 1e9, rows.output_tokens_per_s, marker="o", label=variant)
for bw, name in ((25, "PCIe gen4"), (55, "PCIe gen5"), (340, "NVLink-C2C")):
    ax.axvline(bw, color="grey", lw=0.6, ls=":")
    ax.text(bw, ax.get_ylim()[1] * 0.02, name, rotation=90, fontsize=7, va="bottom")
ax.set(xscale="log", xlabel="host link, GB/s per direction", ylabel="output tokens/s")
ax.legend(fontsize=7)
fig.tight_layout()

# %% [markdown]
# Where full-attention DRAM-centric catches up with PagedAttention (log-linear
# interpolation between the swept bandwidths):

# %%
hbm = table["hbm"].to_numpy()
dram = table["dram_centric full"].to_numpy()
above = np.flatnonzero(dram >= hbm)
if len(above) == 0:
    print(f"no crossover below {LINKS[-1] / 1e9:g} GB/s: the link bounds every decode step")
elif above[0] == 0:
    print("DRAM-centric wins even at PCIe gen4")
else:
    i = above[0]
    gap = np.log(LINKS[i - 1]), np.log(LINKS[i])
    d0, d1 = dram[i - 1] - hbm[i - 1], dram[i] - hbm[i]
    cross = np.exp(gap[0] + (gap[1] - gap[0]) * (-d0) / (d1 - d0))
    print(f"full-attention DRAM-centric overtakes PagedAttention at about {cross / 1e9:.0f} GB/s")
sparse_win = table["dram_centric sparse"] / table["hbm"]
print("sparse DRAM-centric / PagedAttention:", sparse_win.round(2).to_dict())

# %% [markdown]
# Reading the result: with full attention, DRAM-centric KV re-reads most of each context
# over the link every decode step (what the HBM cache cannot hold), so its throughput
# grows with the link's bandwidth until the link outpaces the compute; PagedAttention is
# capped by its pool (the 14 sequences printed above) instead. With sparse attention a
# step reads 81 blocks per sequence, nearly all already in HBM, so only ~10 MiB per
# sequence and step cross the link, and DRAM-centric wins even on PCIe gen4 because it
# runs the whole batch.
# Caveats are in [docs/model.md](../docs/model.md): one GPU, the sparse set is a model of
# heavy-hitter attention (its accuracy is not simulated), and the host link is shared
# fairly between transfers.
