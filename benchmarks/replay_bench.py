"""Benchmark of ``kvsim replay``: the Mooncake conversation trace, 8 policies x 6 capacities.

Not a test. Run ``python benchmarks/replay_bench.py [TRACE] [--jobs N] [--generic]``; it
prints the wall time and accesses per second of each policy and of the whole table.
"""

from __future__ import annotations

import argparse
import time

from sim.replay import format_table, read_trace, replay_table

POLICIES = ("fifo", "lru", "lfu", "arc", "s3fifo", "sieve", "opt", "prefix_lru")
CAPACITIES = (1000, 5000, 10_000, 30_000, 50_000, 100_000)
DEFAULT_TRACE = "mooncake_fast25_conversation_trace.jsonl"


def main() -> None:
    """Time each policy over all capacities, then the whole table with ``--jobs``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default=DEFAULT_TRACE, help="(under $KVSIM_TRACES)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--generic", action="store_true", help="interface path, not fused loops")
    args = parser.parse_args()

    start = time.perf_counter()
    trace = read_trace(args.trace)
    accesses = len(trace.keys)
    print(f"read {accesses:,} accesses in {time.perf_counter() - start:.2f} s")
    fast = not args.generic
    for name in POLICIES:
        start = time.perf_counter()
        replay_table(trace, {name: name}, CAPACITIES, fast=fast, progress=False)
        wall = time.perf_counter() - start
        rate = accesses * len(CAPACITIES) / wall
        print(f"{name:>12}: {wall:6.2f} s for {len(CAPACITIES)} capacities, {rate:,.0f} accesses/s")
    start = time.perf_counter()
    rows = replay_table(
        trace, {n: n for n in POLICIES}, CAPACITIES, jobs=args.jobs, fast=fast, progress=False
    )
    wall = time.perf_counter() - start
    total = accesses * len(rows)
    print(format_table(rows))
    print(f"table: {len(rows)} runs, {total:,} accesses in {wall:.2f} s with {args.jobs} jobs "
          f"({total / wall:,.0f} accesses/s)")  # fmt: skip


if __name__ == "__main__":
    main()
