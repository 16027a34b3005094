"""``kvsim replay TRACE --capacities 1000,10000 --policies lru,arc,opt [--out hits.csv]``.

Replays a trace's prompt blocks through one demand-cached pool per (policy, capacity) and
writes one CSV row each: policy, capacity_blocks, accesses, hits, hit_rate.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from sim.replay import (
    FORMATS,
    format_table,
    parse_capacities,
    parse_policies,
    read_trace,
    replay_table,
    write_csv,
)


def replay_command(args: argparse.Namespace) -> int:
    """Read the trace, replay every (policy, capacity), print the table, write the CSV."""
    capacities = parse_capacities(args.capacities)
    policies = parse_policies(args.policies, args.param)
    trace = read_trace(args.trace, args.format)
    jobs = args.jobs or min(len(os.sched_getaffinity(0)), len(policies) * len(capacities))
    start = time.perf_counter()
    rows = replay_table(
        trace,
        policies,
        capacities,
        jobs=jobs,
        fast=not args.generic,
        seed=args.seed,
        progress=not args.quiet,
    )
    elapsed = time.perf_counter() - start
    print(format_table(rows))
    print(f"{len(trace.keys):,} accesses x {len(rows)} runs in {elapsed:.1f} s ({jobs} jobs)")
    if args.out:
        write_csv(rows, args.out)
        print(f"wrote {args.out}")
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register ``kvsim replay``."""
    parser = sub.add_parser(
        "replay",
        help="hit rates of eviction policies on a trace's blocks (one pool, no engine)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("trace", help="trace file (as given, then under $KVSIM_TRACES)")
    parser.add_argument("--format", default="mooncake", choices=FORMATS, help="default: mooncake")
    parser.add_argument(
        "--capacities", required=True, metavar="N,N,...", help="pool sizes in blocks"
    )
    parser.add_argument(
        "--policies", default="lru,lfu,arc,s3fifo,opt", metavar="NAME,...",
        help="eviction policies (default: lru,lfu,arc,s3fifo,opt)",
    )  # fmt: skip
    parser.add_argument(
        "--param", action="append", default=[], metavar="POLICY.KEY=VALUE",
        help="a policy parameter, e.g. s3fifo.small_fraction=0.2 (repeatable)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="CSV file to write")
    parser.add_argument("--jobs", type=int, default=0, help="processes (default: one per core)")
    parser.add_argument("--seed", type=int, default=0, help="seed of policies that draw numbers")
    parser.add_argument(
        "--generic", action="store_true",
        help="drive policies through their interface instead of the fused loops (slow; a check)",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=replay_command)
