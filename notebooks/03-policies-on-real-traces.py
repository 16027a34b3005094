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
# # 03 · Eviction policies on the Mooncake traces, with Belady's bound
#
# The Mooncake FAST'25 traces (Kimi's conversation traffic, and a synthetic mix of
# ShareGPT, L-Eval and LooGLE requests) give every request the ids of its 512-token prompt
# blocks, chained so that equal ids mean equal prefixes. That is enough to ask the cache
# question alone: replay each request's prompt blocks through one pool of `capacity` blocks
# under each eviction policy, and count the hits. Belady's OPT, which knows the future, is
# the bound no online policy can beat.
#
# The traces are not in the repository: set `KVSIM_TRACES` to the folder that holds
# `mooncake_fast25_conversation_trace.jsonl` and `mooncake_fast25_synthetic_trace.jsonl`.
# The notebook replays the first 1,500 requests of each, to stay quick; the README's
# figure replays both whole traces (`python scripts/make_gallery.py`).

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from policies import AccessTrace
from policies.registry import eviction_names
from sim.replay import read_trace, replay_table
from sim.workload.trace import traces_root

TRACES = {
    "conversation": "mooncake_fast25_conversation_trace.jsonl",
    "synthetic": "mooncake_fast25_synthetic_trace.jsonl",
}
FIRST = 1500
print("traces from", traces_root())


def first_requests(trace: AccessTrace, n: int) -> AccessTrace:
    """The first ``n`` requests of a replay trace."""
    if n >= len(trace.starts):
        return trace
    end = trace.starts[n]
    return AccessTrace(keys=trace.keys[:end], starts=trace.starts[:n], times=trace.times[:n])


traces = {name: first_requests(read_trace(path), FIRST) for name, path in TRACES.items()}
for name, trace in traces.items():
    keys = trace.keys
    unique = len(np.unique(keys))
    print(
        f"{name}: {len(trace.starts):,} requests, {len(keys):,} block accesses, "
        f"{unique:,} distinct blocks: at most {1 - unique / len(keys):.1%} can hit"
    )

# %% [markdown]
# ## Hit rate against capacity
#
# The policies with fused replay loops, OPT included, at five pool sizes. A miss always
# inserts the block (demand caching), for every policy. The others (`gds`, `heat`,
# `length_aware`, `scheduler_aware`, or your own) run through the generic pool, about ten
# times slower: add them to `policies` to see them too.

# %%
FAST = ["fifo", "lru", "lfu", "arc", "s3fifo", "sieve", "prefix_lru", "opt"]
print("registered:", ", ".join(eviction_names()))
policies = {name: name for name in FAST}
CAPACITIES = [250, 500, 1000, 2500, 5000]
frames = []
for name, trace in traces.items():
    rows = replay_table(trace, policies, CAPACITIES, jobs=2, progress=False)
    frames.append(
        pd.DataFrame(
            [(name, r.policy, r.capacity_blocks, r.hit_rate) for r in rows],
            columns=["trace", "policy", "capacity_blocks", "hit_rate"],
        )
    )
hits = pd.concat(frames, ignore_index=True)
hits.pivot_table(index=["trace", "policy"], columns="capacity_blocks", values="hit_rate").round(3)

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
for ax, (name, rows) in zip(axes, hits.groupby("trace"), strict=True):
    for i, (policy, line) in enumerate(rows.groupby("policy")):
        style = dict(color="k", lw=2) if policy == "opt" else dict(ls=["-", "--", ":"][i % 3])
        ax.plot(line.capacity_blocks, line.hit_rate, marker=".", label=policy, **style)
    ax.set(
        title=f"Mooncake {name} (first {FIRST:,} requests)",
        xscale="log",
        xlabel="pool (512-token blocks)",
    )
axes[0].set_ylabel("hit rate")
axes[1].legend(fontsize=7, ncol=2)
fig.tight_layout()

# %% [markdown]
# ## How far each policy is from the bound
#
# The share of OPT's hits each policy gets, per capacity: the room left for a smarter
# policy at that pool size.

# %%
bound = hits[hits.policy == "opt"].set_index(["trace", "capacity_blocks"]).hit_rate
share = hits.assign(
    of_opt=hits.hit_rate / hits.set_index(["trace", "capacity_blocks"]).index.map(bound).to_numpy()
)
share.pivot_table(index=["trace", "policy"], columns="capacity_blocks", values="of_opt").round(2)

# %% [markdown]
# Which online policy comes closest to OPT, at which pool size and on which trace:

# %%
online = share[share.policy != "opt"]
best = online.loc[online.groupby(["trace", "capacity_blocks"]).of_opt.idxmax()]
best.set_index(["trace", "capacity_blocks"])[["policy", "hit_rate", "of_opt"]].round(3)

# %% [markdown]
# What this does and does not show: the best online policy depends on the trace and the
# pool size, and even the best is far from the bound at small pools, where most of OPT's
# hits come from keeping blocks that a recency or frequency rule cannot tell apart. The
# first 1,500 requests are a warm-up-heavy slice; docs/policies.md gives the whole
# conversation trace's table, where LRU and ARC lead at large pools. The replay ignores
# time, block size and the engine's pinning of blocks in use:
# `kvsim sweep experiments/configs/mooncake-policies.yaml` runs the online policies inside
# the engine instead.

# %% [markdown]
# ## What queue-lookahead prefetch buys
#
# Inside the engine, with `kv.mode: offload` (a prefix cache that spills from HBM to DRAM),
# a request whose prefix lives in DRAM loads it over the host link before it runs.
# `kv.prefetch: queue_lookahead` starts those loads while the request still waits in the
# queue. The first 60 requests of the synthetic trace at half its arrival rate, Llama-3-8B
# on an H100, the HBM pool forced to 1,000 blocks so that prefixes are evicted to DRAM.

# %%
from importlib.resources import files
from pathlib import Path

from sim.config import load_config
from sim.run import simulate

configs = Path(str(files("experiments") / "configs"))
engine_runs = {}
for prefetch in ("none", "queue_lookahead"):
    config = load_config(
        configs / "mooncake-synthetic.yaml",
        [
            "workload.max_requests=60",
            "workload.rate_scale=0.5",
            "engine.kv_pool_blocks=1000",
            "kv.mode=offload",
            f"kv.prefetch={prefetch}",
        ],
    )
    engine_runs[prefetch] = simulate(config, base_dir=configs).summary
# cross-request hit rates (a request's own re-hits after preemption left out), and whether the
# engine keeps up with the arrivals (docs/outputs.md)
keys = ["hbm_reuse_hit_rate", "dram_reuse_hit_rate", "ttft_p50_s", "ttft_p99_s", "h2d_bytes"]
keys += ["stall_s", "overloaded"]
pd.DataFrame(engine_runs).loc[keys]

# %% [markdown]
# Lookahead turns DRAM hits into HBM hits (the blocks are already up when the request is
# admitted) at the price of extra H2D traffic for blocks brought up early. On an H100 with
# PCIe gen5 a DRAM hit is a short copy, so latency barely moves here; the gain grows with
# slower links, longer shared prefixes and deeper queues. docs/policies.md describes the
# prefetchers and their parameters.
