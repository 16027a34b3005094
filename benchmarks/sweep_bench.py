"""Benchmark of ``kvsim sweep``: a 200-point sweep of small configs, serially and in parallel.

Not a test. Run ``python benchmarks/sweep_bench.py [--workers 1,2]``; it
prints the wall time of the whole sweep for each worker count and the speed-up over the
first. Points: kv.mode (hbm, dram_centric) x 5 prompt lengths x 4 batch sizes x 5 seeds of a
closed batch of Llama-3-8B requests on an H100 (32..96 output tokens each). Other load on
the machine skews the figure: the load average is printed first, and last the speed-up a
plain CPU-bound loop gets from the same number of processes (the ceiling right now).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import yaml

from experiments.pool import default_workers
from experiments.runner import run_sweep
from experiments.sweep import load_sweep
from experiments.tasks import Limits

SWEEP = {
    "base": {
        "seed": 0,
        "model": "llama-3-8b",
        "hardware": "h100-sxm",
        "workload": {
            "kind": "synthetic",
            "num_requests": 4,
            "arrival": {"kind": "all_at_once"},
            "prompt_tokens": {"kind": "uniform", "min": 128, "max": 512},
            "output_tokens": {"kind": "uniform", "min": 32, "max": 96},
        },
        "engine": {"max_num_seqs": 64, "max_batched_tokens": 4096},
        "kv": {"mode": "hbm"},
    },
    "grid": {
        "kv.mode": ["hbm", "dram_centric"],
        "workload.prompt_tokens.max": [256, 512, 1024, 2048, 4096],
        "workload.num_requests": [4, 8, 16, 32],
    },
    "seeds": [0, 1, 2, 3, 4],
}


def _burn(n: int) -> int:
    """A CPU-bound loop."""
    total = 0
    for i in range(n):
        total += i * i
    return total


def cpu_ceiling(workers: int, n: int = 10_000_000) -> float:
    """Speed-up of ``workers`` CPU burns in parallel processes over running them serially.

    NOTE: on a shared machine other load caps what any pool can reach; this says how much.
    """
    start = time.perf_counter()
    for _ in range(workers):
        _burn(n)
    serial = time.perf_counter() - start
    with multiprocessing.Pool(workers) as pool:
        start = time.perf_counter()
        pool.map(_burn, [n] * workers)
        parallel = time.perf_counter() - start
    return serial / parallel


def main() -> None:
    """Time the sweep once per worker count; print wall times and speed-ups."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="worker counts to time (default: 1,2)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {default_workers()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweep.yaml"
        path.write_text(yaml.safe_dump(SWEEP))
        start = time.perf_counter()
        sweep = load_sweep(path)
        print(f"{len(sweep.points)} points expanded and checked in "
              f"{time.perf_counter() - start:.2f} s")  # fmt: skip
        walls: dict[int, float] = {}
        for i, workers in enumerate(int(w) for w in args.workers.split(",")):
            start = time.perf_counter()
            out = Path(tmp) / f"run{i}-w{workers}"
            results = run_sweep(sweep, out, Limits(workers), progress=False)
            walls[workers] = time.perf_counter() - start
            done = int((results.status == "done").sum())
            inside = results.wall_time_s.sum()
            print(f"{workers} worker(s): {walls[workers]:6.2f} s wall for {len(results)} points "
                  f"({done} done; {inside:.2f} s inside simulate)")  # fmt: skip
        first = next(iter(walls))
        for workers, wall in walls.items():
            if workers != first:
                speedup = walls[first] / wall
                print(f"speed-up {first} -> {workers} workers: {speedup:.2f}x "
                      f"({speedup / (workers / first):.0%} parallel efficiency)")  # fmt: skip
                ceiling = cpu_ceiling(workers)
                print(
                    f"  the machine's own ceiling now: {workers} pure-Python CPU burns run "
                    f"{ceiling:.2f}x faster in {workers} processes than one after another"
                )


if __name__ == "__main__":
    main()
