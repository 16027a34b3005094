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
# # 05 · Write your own eviction policy, register it, sweep it
#
# An eviction policy in kvsim is a small class that sees block ids (ints) and never the
# engine: it is told about inserts, hits and removals, and proposes victims
# ([docs/policies.md](../docs/policies.md) has the full protocol). This notebook writes a
# segmented LRU (SLRU: new blocks enter a *probation* segment, a hit promotes them to a
# *protected* one, victims come from probation first), checks it against a plainly
# written reference, registers it, replays it beside LRU, and runs it in the engine
# through a sweep. Its sweep file and results go to `runs/05-write-your-own-policy/` in the
# working directory, made afresh on each run; it writes nothing else.

# %%
from collections import OrderedDict
from itertools import islice
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import yaml

from policies import AccessTrace, EvictionPolicy, Pool, register
from policies.base import fraction, param_table, pinned_predicate
from policies.registry import eviction_names, make_eviction

# %% [markdown]
# ## The policy
#
# Four methods (`on_insert`, `on_access`, `on_remove`, `victims`), a `name`, and its
# parameters with their checks (`params`). `victims` must not change any state: the pool
# evicts what it proposes and then calls `on_evict` (by default `on_remove`) for each.
# `capacity` is a context argument the caller passes (the pool size in blocks).
#
# One thing to know about the engine: in the HBM pool a cached block that a new request
# reuses stays known to the policy but is pinned (never a victim) while the request runs,
# and the policy sees the use as `on_access` when the request frees it; in the replay every
# hit is an `on_access` at once. Either way, a reuse is an `on_access`.


# %%
class SLRU(EvictionPolicy):
    """Segmented LRU. Eviction order: probation (LRU first), then protected (LRU first).

    A block used again (``on_access``) moves to protected.
    """

    name = "slru"
    params = param_table(protected_fraction=fraction(0.8))

    def __init__(self, capacity: int, protected_fraction: float = 0.8) -> None:
        self.limit = max(1, int(capacity * protected_fraction))
        self.probation: OrderedDict[int, None] = OrderedDict()
        self.protected: OrderedDict[int, None] = OrderedDict()

    def on_insert(self, key: int, now: float = 0.0) -> None:
        self.probation[key] = None

    def on_access(self, key: int, now: float = 0.0) -> None:
        if key in self.protected:
            self.protected.move_to_end(key)
        else:
            del self.probation[key]
            self._protect(key)

    def on_remove(self, key: int) -> None:
        self._forget(key)

    def victims(self, n: int, pinned=None) -> list[int]:
        is_pinned = pinned_predicate(pinned)
        order = (k for seg in (self.probation, self.protected) for k in seg if not is_pinned(k))
        return list(islice(order, max(n, 0)))

    def _protect(self, key: int) -> None:
        self.protected[key] = None
        if len(self.protected) > self.limit:  # demote the protected segment's LRU key
            demoted, _ = self.protected.popitem(last=False)
            self.probation[demoted] = None

    def _forget(self, key: int) -> None:
        if self.probation.pop(key, 0) is not None:
            del self.protected[key]


# %% [markdown]
# ## Check it against a reference
#
# The same rule written as plainly as possible (two lists), and both replayed on random
# access sequences: every access must hit or miss identically.


# %%
def reference_hits(keys, capacity, protected_fraction=0.8):
    limit = max(1, int(capacity * protected_fraction))
    probation, protected, hits = [], [], []
    for key in keys:
        if key in protected:
            protected.remove(key)
            protected.append(key)
            hits.append(True)
        elif key in probation:
            probation.remove(key)
            protected.append(key)
            hits.append(True)
            if len(protected) > limit:
                probation.append(protected.pop(0))
        else:
            hits.append(False)
            if len(probation) + len(protected) >= capacity:
                (probation if probation else protected).pop(0)
            probation.append(key)
    return hits


rng = np.random.default_rng(0)
for trial in range(200):
    capacity = int(rng.integers(1, 12))
    keys = rng.integers(0, 20, size=200).tolist()
    pool = Pool(SLRU(capacity), capacity)
    assert [pool.access(k) for k in keys] == reference_hits(keys, capacity), (trial, capacity)
print("SLRU matches the reference on 200 random sequences")

# %% [markdown]
# ## Register it
#
# `policies.register` adds the class under its `name`, so `slru` works wherever a policy
# name does: `kv.eviction: slru`, `{name: slru, protected_fraction: 0.5}`, the replay.
# (To use it from the command line or in a sweep with several worker processes, put the
# class in a module on the Python path and name it by dotted path instead:
# `kv.eviction: "my_policies:SLRU"`, `kvsim replay TRACE --policies my_policies:SLRU`.)

# %%
if "slru" not in eviction_names():  # run again in the same kernel: registered already
    register(SLRU)
make_eviction({"name": "slru", "protected_fraction": 0.5}, capacity=100).limit

# %% [markdown]
# ## Replay: scan resistance
#
# A request stream where a hot set of shared prefixes (Zipf-popular) is interleaved with
# long one-off scans (documents read once). LRU lets every scan flush the hot set; SLRU
# keeps blocks that were hit at least once in the protected segment.

# %%
from sim.replay import replay_table

rng = np.random.default_rng(1)
requests, fresh = [], 10_000
for _ in range(3000):
    if rng.random() < 0.3:  # a one-off document: 40 blocks never seen again
        requests.append(list(range(fresh, fresh + 40)))
        fresh += 40
    else:  # a popular prefix: 8 blocks of one of 200 prefixes
        p = int(rng.zipf(1.2)) % 200
        requests.append([p * 8 + i for i in range(8)])
trace = AccessTrace.from_requests(requests)
rows = replay_table(
    trace,
    {"lru": "lru", "slru": "slru", "s3fifo": "s3fifo", "opt": "opt"},
    [100, 200, 400, 800, 1600],
    jobs=1,
    progress=False,
)
hits = pd.DataFrame(
    [(r.policy, r.capacity_blocks, r.hit_rate) for r in rows],
    columns=["policy", "capacity_blocks", "hit_rate"],
)
hits.pivot(index="policy", columns="capacity_blocks", values="hit_rate").round(3)

# %% [markdown]
# ## Sweep it in the engine
#
# The same policy managing vLLM's HBM prefix cache: questions on shared documents (the
# `doc-qa` preset, made small: 150 questions on 40 documents at 1 request/s), Llama-3-8B
# on an H100 with the KV pool forced to a few sizes. The sweep runs in this process
# (`workers=1`), where `slru` is registered.

# %%
import shutil
from importlib.resources import files

from experiments.runner import run_sweep
from experiments.sweep import load_sweep
from experiments.tasks import Limits

quickstart = Path(str(files("experiments") / "configs" / "quickstart.yaml"))
HERE = Path("runs/05-write-your-own-policy")  # this notebook's folder, made afresh
shutil.rmtree(HERE, ignore_errors=True)
HERE.mkdir(parents=True)
sweep = {
    "base": str(quickstart),
    "set": {
        "workload": {
            "preset": "doc-qa",
            "num_requests": 150,
            "num_documents": 40,
            "arrival": {"kind": "poisson", "rate": 1.0},
        }
    },
    "grid": {"kv.eviction": ["lru", "slru"], "engine.kv_pool_blocks": [2000, 4000, 8000]},
}
(HERE / "slru-sweep.yaml").write_text(yaml.safe_dump(sweep))
results = run_sweep(
    load_sweep(HERE / "slru-sweep.yaml"), HERE / "slru", Limits(workers=1), progress=False
)
results.pivot(
    index="engine.kv_pool_blocks",
    columns="kv.eviction",
    values=["hbm_reuse_hit_rate", "ttft_p50_s"],
).round(3)

# %%
fig, ax = plt.subplots(figsize=(5, 3))
for policy, rows in results.groupby("kv.eviction"):
    ax.plot(rows["engine.kv_pool_blocks"], rows.hbm_reuse_hit_rate, marker="o", label=policy)
ax.set(xlabel="HBM KV pool (16-token blocks)", ylabel="cross-request hit rate (HBM)", xscale="log")
ax.legend()
fig.tight_layout()

# %% [markdown]
# The same figure from the command line: `kvsim plot runs/05-write-your-own-policy/slru
# --kind hit-rate --x engine.kv_pool_blocks`. In the engine, blocks in use by running
# requests are pinned (never proposed as victims) and a request frees its blocks tail
# first, so a prefix policy sees a different stream than the replay: both views are worth
# having.
