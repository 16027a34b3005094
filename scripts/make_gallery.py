"""Regenerate the README's gallery (``docs/img/*.png``) from the experiment configs.

Each group runs its study with the ordinary commands (``kvsim sweep``, ``kvsim plot``,
``kvsim replay``) into ``--runs`` (resuming a sweep that is already there) and writes its
figures into ``--out``. Times are on two cores.

    python scripts/make_gallery.py                          # every group (~45 min)
    python scripts/make_gallery.py --only seed-study,mooncake-replay   # ~4 min

Groups: seed-study (~30 s), tp-study (~30 s), workload-mix (~3 min), mooncake-replay (~3 min;
needs the Mooncake traces: $KVSIM_TRACES or ../shared/traces), mooncake-policies (~3 min;
traces), cluster-routing (~15 min; traces), pd-study (~17 min; traces).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "experiments" / "configs"
MOONCAKE = {
    "conversation": "mooncake_fast25_conversation_trace.jsonl",
    "synthetic": "mooncake_fast25_synthetic_trace.jsonl",
}
REPLAY_CAPACITIES = "1000,2000,5000,10000,20000,50000"
REPLAY_POLICIES = (
    "fifo,lru,lfu,arc,s3fifo,sieve,gds,heat,length_aware,scheduler_aware,prefix_lru,opt"
)


def kvsim(*args: str | Path) -> None:
    """Run one kvsim command; stop the gallery if it fails."""
    cmd = [sys.executable, "-m", "sim", *map(str, args)]
    print("$ kvsim", " ".join(map(str, args)), flush=True)
    subprocess.run(cmd, check=True)


def sweep(config: str, runs: Path, workers: int) -> Path:
    """Run (or resume) a sweep of ``experiments/configs``; its directory."""
    out = runs / Path(config).stem
    resume = ["--resume"] if (out / "sweep.json").is_file() else []
    kvsim("sweep", CONFIGS / config, "--out", out, "--workers", workers, "--quiet", *resume)
    return out


def seed_study(runs: Path, img: Path, workers: int) -> None:
    """PagedAttention vs DRAM-centric KV: throughput, TPOT, HBM pressure, link use."""
    r = sweep("seed-study.yaml", runs, workers)
    big = ["--where", "workload.num_requests=32", "--where", "workload.prompt_tokens=8192"]
    kvsim("plot", r, "--kind", "throughput", "--x", "workload.prompt_tokens", "--panel",
          "hardware", "--where", "model=llama-3-8b", "--where", "workload.num_requests=32",
          "--out", img / "seed-study-throughput.png")  # fmt: skip
    kvsim("plot", r, "--kind", "throughput", "--metric", "tpot_p50_s", "--x",
          "workload.num_requests", "--panel", "hardware", "--where", "model=llama-3-70b",
          "--where", "workload.prompt_tokens=4096",
          "--out", img / "seed-study-tpot.png")  # fmt: skip
    kvsim("plot", r, "--kind", "hbm-pressure", "--where", "hardware=h100-sxm", "--where",
          "model=llama-3-8b", *big, "--out", img / "seed-study-hbm-pressure.png")  # fmt: skip
    kvsim("plot", r, "--kind", "hbm-pressure", "--where", "hardware=h200-sxm", "--where",
          "model=llama-3-70b", *big, "--out", img / "seed-study-hbm-pressure-70b.png")  # fmt: skip
    kvsim("plot", r, "--kind", "link", "--where", "hardware=h200-sxm", "--where",
          "model=llama-3-70b", *big, "--where", "kv.mode=dram_centric",
          "--out", img / "seed-study-link.png")  # fmt: skip


def tp_study(runs: Path, img: Path, workers: int) -> None:
    """Llama-3-70B bf16 on 2, 4, 8 H100s: HBM pressure per GPU at TP 2, TPOT against batch."""
    r = sweep("tp-study.yaml", runs, workers)
    kvsim("plot", r, "--kind", "hbm-pressure", "--where", "engine.tensor_parallel_size=2",
          "--where", "workload.num_requests=32", "--where", "workload.prompt_tokens=8192",
          "--out", img / "tp-study-hbm-pressure.png")  # fmt: skip
    kvsim("plot", r, "--kind", "throughput", "--metric", "tpot_p50_s", "--x",
          "workload.num_requests", "--panel", "engine.tensor_parallel_size", "--where",
          "workload.prompt_tokens=4096", "--out", img / "tp-study-tpot.png")  # fmt: skip


def workload_mix(runs: Path, img: Path, workers: int) -> None:
    """The four workload presets through the three KV modes: latency CDFs."""
    r = sweep("workload-mix.yaml", runs, workers)
    kvsim("plot", r, "--kind", "latency-cdf", "--where", "workload.preset=long-doc-summary",
          "--out", img / "workload-mix-latency.png")  # fmt: skip


def cluster_routing(runs: Path, img: Path, workers: int) -> None:
    """Every router on 8 H100s, without and with a cluster-wide KV pool: hit rate and TTFT."""
    r = sweep("cluster-routing.yaml", runs, workers)
    kvsim("plot", r, "--kind", "routing", "--logy", "--out", img / "cluster-routing.png")


def pd_study(runs: Path, img: Path, workers: int) -> None:
    """Colocated against 1P3D, 2P2D and 3P1D: goodput and TPOT p99 against the rate."""
    r = sweep("pd-study.yaml", runs, workers)
    draw_goodput(pd.read_parquet(r / "results.parquet"), img / "pd-study-goodput.png")


def _layout(cluster: str) -> str:
    """``colocated (4 mixed)`` or ``1P3D``, from a sweep point's ``cluster`` axis (JSON)."""
    groups = json.loads(cluster)["groups"]
    roles = {g.get("role", "mixed"): g["count"] for g in groups}
    if "prefill" not in roles:
        return f"colocated ({sum(roles.values())} mixed)"
    return f"{roles['prefill']}P{roles['decode']}D"


def _load(workload: str) -> tuple[str, float]:
    """(load name, rate) of a sweep point's ``workload`` axis (JSON): the trace's rate scale,
    or the synthetic load's requests/s."""
    w = json.loads(workload)
    if w["kind"] == "trace":
        return "Mooncake conversation (x trace rate)", w.get("rate_scale", 1.0)
    return "long prompts, 4k-12k tokens (requests/s)", w["arrival"]["rate"]


def draw_goodput(results: pd.DataFrame, out: Path) -> Path:
    """Goodput (top) and TPOT p99 (bottom) against the rate, a column per load, a line per
    cluster layout."""
    from experiments.plots.style import color, figure_legend, marker, save, styled

    frame = results[results.status == "done"].copy()
    frame["layout"] = frame.cluster.map(_layout)
    frame[["load", "rate"]] = frame.workload.map(_load).tolist()
    loads, layouts = list(dict.fromkeys(frame.load)), list(dict.fromkeys(frame.layout))
    rows = (("goodput_rps", "goodput (requests/s)", 1.0), ("tpot_p99_s", "TPOT p99 (ms)", 1e3))
    with styled():
        fig, axes = plt.subplots(2, len(loads), figsize=(4.2 * len(loads), 5.4), squeeze=False)
        for col, load in enumerate(loads):
            points = frame[frame.load == load].sort_values("rate")
            for row, (metric, label, scale) in enumerate(rows):
                ax = axes[row][col]
                for j, layout in enumerate(layouts):
                    line = points[points.layout == layout]
                    ax.plot(line.rate, line[metric] * scale, label=layout, color=color(j),
                            marker=marker(j), ms=3.5)  # fmt: skip
                ax.set(ylabel=label, ylim=(0, None), title=load if row == 0 else "")
                if row == 1:
                    ax.set_xlabel("rate")
        fig.tight_layout()
        figure_legend(fig, list(axes[0]), ncol=len(layouts))
        return save(fig, out)


def mooncake_policies(runs: Path, img: Path, workers: int) -> None:
    """Online eviction policies in the engine on the Mooncake traces: HBM prefix hit rate."""
    r = sweep("mooncake-policies.yaml", runs, workers)
    eight = "kv.eviction=fifo|lru|lfu|arc|s3fifo|sieve|gds|length_aware"  # NOTE: 8 lines at most
    kvsim("plot", r, "--kind", "hit-rate", "--x", "engine.kv_pool_blocks", "--panel",
          "workload.path", "--where", "kv.mode=hbm", "--where", eight,
          "--out", img / "mooncake-policies-hit-rate.png")  # fmt: skip


def mooncake_replay(runs: Path, img: Path, workers: int) -> None:
    """Every eviction policy and Belady's OPT on both whole Mooncake traces (kvsim replay)."""
    tables = {}
    for name, trace in MOONCAKE.items():
        out = runs / f"replay-{name}.csv"
        kvsim("replay", trace, "--capacities", REPLAY_CAPACITIES, "--policies",
              REPLAY_POLICIES, "--jobs", workers, "--quiet", "--out", out)  # fmt: skip
        tables[name] = pd.read_csv(out)
    draw_replay(tables, img / "mooncake-replay-hit-rate.png")


def draw_replay(tables: dict[str, pd.DataFrame], out: Path) -> Path:
    """Hit rate against capacity, one panel per trace, one line per policy (OPT in black)."""
    from experiments.plots.style import PALETTE, figure_legend, marker, panels, save, styled

    colours = [c for c in PALETTE if c != "#000000"]  # black is OPT's alone
    with styled():
        fig, axes = panels(len(tables), width=4.2, height=3.0)
        for ax, (name, table) in zip(axes, tables.items(), strict=True):
            others = [p for p in dict.fromkeys(table.policy) if p != "opt"]
            for policy, rows in table.groupby("policy", sort=False):
                if policy == "opt":
                    style = {"color": "black", "lw": 2.0, "marker": "*", "ms": 5}
                else:
                    j = others.index(policy)
                    dash = "-" if j < len(colours) else "--"
                    style = {"color": colours[j % len(colours)], "lw": 1.0, "ms": 3.5,
                             "marker": marker(j), "ls": dash}  # fmt: skip
                ax.plot(rows.capacity_blocks, rows.hit_rate, label=policy, **style)
            caps = sorted(set(table.capacity_blocks))
            ax.set_xscale("log")
            ax.set_xticks(caps, [f"{c // 1000}k" for c in caps])
            ax.minorticks_off()
            accesses = int(table.accesses.iloc[0])
            ax.set(ylim=(0, None), xlabel="pool (512-token blocks)", ylabel="hit rate",
                   title=f"Mooncake {name} ({accesses:,} accesses)")  # fmt: skip
        fig.tight_layout()
        figure_legend(fig, axes, ncol=6)
        return save(fig, out)


GROUPS: dict[str, Callable[[Path, Path, int], None]] = {
    "seed-study": seed_study,
    "tp-study": tp_study,
    "workload-mix": workload_mix,
    "mooncake-replay": mooncake_replay,
    "cluster-routing": cluster_routing,
    "pd-study": pd_study,
    "mooncake-policies": mooncake_policies,
}


def main(argv: list[str] | None = None) -> int:
    """Run the chosen groups in order; print each one's time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(GROUPS), help="comma-separated groups")
    parser.add_argument("--runs", type=Path, default=Path("runs/gallery"), help="study outputs")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="figure folder")
    parser.add_argument("--workers", type=int, default=2, help="processes per sweep/replay")
    args = parser.parse_args(argv)
    chosen = [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = [g for g in chosen if g not in GROUPS]
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}; expected: {', '.join(GROUPS)}")
    args.runs.mkdir(parents=True, exist_ok=True)
    for group in chosen:
        start = time.perf_counter()
        GROUPS[group](args.runs, args.out, args.workers)
        print(f"{group}: {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
