"""``kvsim replay TRACE --capacities 1000,10000 --policies lru,arc,opt [--out hits.csv]``.

Replays a trace's prompt blocks through one demand-cached pool per (policy, capacity) and
writes one CSV row each: policy, capacity_blocks, accesses, hits, hit_rate, block_tokens,
requests. ``--block-tokens 16 --max-requests N`` replays in the engine's units: the first N
requests (as an engine run with ``workload.max_requests: N``), their prompts in engine blocks
hashed as the engine hashes them, the blocks the engine looks up counted (its full blocks but
the last token); capacities are then in engine blocks.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sim.commands.lazy import LazyChoices

if TYPE_CHECKING:
    from sim.replay import ReplayTrace


def _formats() -> tuple[str, ...]:
    from sim.replay import FORMATS

    return FORMATS


def replay_command(args: argparse.Namespace) -> int:
    """Read the trace, replay every (policy, capacity), print the table, write the CSV."""
    from sim.replay import (
        format_table,
        parse_capacities,
        parse_policies,
        read_replay_trace,
        replay_table,
        write_csv,
    )

    capacities = parse_capacities(args.capacities)
    policies = parse_policies(args.policies, args.param)
    trace = read_replay_trace(
        args.trace, args.format, block_tokens=args.block_tokens, max_requests=args.max_requests
    )
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
    print(units(trace))
    print(format_table(rows))
    print(f"{len(rows)} runs in {elapsed:.1f} s ({jobs} jobs)")
    if args.out:
        write_csv(rows, args.out)
        print(f"wrote {args.out}")
    return 0


def units(trace: ReplayTrace) -> str:
    """One line: the requests replayed, what an access is, and the unit of the capacities."""
    if trace.block_tokens is None:
        what = "trace blocks (one hash id each); capacities in trace blocks"
    else:
        what = (
            f"{trace.block_tokens}-token engine blocks the engine looks up (a prompt's full "
            f"blocks but the last token); capacities in {trace.block_tokens}-token blocks"
        )
    return f"{trace.requests:,} requests, {trace.lookups:,} accesses of {what}"


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 1")
    return value


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register ``kvsim replay``."""
    parser = sub.add_parser(
        "replay",
        help="hit rates of eviction policies on a trace's blocks (one pool, no engine)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("trace", help="trace file (as given, then under $KVSIM_TRACES)")
    parser.add_argument("--format", default="mooncake", choices=LazyChoices(_formats),
                        metavar="FORMAT", help="%(choices)s (default: mooncake)")  # fmt: skip
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
    parser.add_argument(
        "--block-tokens", type=positive, metavar="N",
        help="replay in engine blocks of N tokens (a divisor of the trace's 512), counting the "
        "blocks the engine looks up; capacities are then in these blocks (default: trace blocks)",
    )  # fmt: skip
    parser.add_argument(
        "--max-requests", type=positive, metavar="N",
        help="the first N requests in arrival order, as workload.max_requests selects them "
        "(default: all)",
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
