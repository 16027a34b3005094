"""``kvsim trace stats TRACE --format F [--json]``: what a trace file holds."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim.commands.lazy import LazyChoices
from sim.errors import ConfigError


def _formats() -> tuple[str, ...]:
    from sim.config.workload import TRACE_FORMATS

    return tuple(TRACE_FORMATS)


def _time_units() -> tuple[str, ...]:
    from sim.config.workload import TIME_UNITS

    return tuple(TIME_UNITS)


COLUMN_KEYS = ("arrival", "prompt_tokens", "output_tokens", "session", "hash_ids")


def parse_columns(text: str) -> dict[str, str]:
    """``arrival=ts,prompt_tokens=in`` -> {'arrival': 'ts', 'prompt_tokens': 'in'}."""
    columns = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in COLUMN_KEYS:
            raise ConfigError(
                f"--columns expects FIELD=COLUMN pairs with FIELD one of {', '.join(COLUMN_KEYS)}, "
                f"got {item!r}"
            )
        columns[key.strip()] = value.strip()
    return columns


def stats_command(args: argparse.Namespace) -> int:
    """Read the trace, print its statistics (table or one JSON object)."""
    from sim.config.loader import validate
    from sim.config.workload import TraceSource
    from sim.workload.trace import load_source
    from sim.workload.tracestats import format_stats, trace_stats

    source: dict[str, object] = {"format": args.format, "path": args.trace}
    if args.columns:
        source["columns"] = parse_columns(args.columns)
    if args.time_unit:
        source["time_unit"] = args.time_unit
    if args.hash_block_tokens:
        source["hash_block_tokens"] = args.hash_block_tokens
    if args.on_bad_rows:
        source["on_bad_rows"] = args.on_bad_rows
    spec = validate(TraceSource, source, "kvsim trace stats")
    table = load_source(spec, Path.cwd(), key="trace")
    if table.bad_rows or table.failed_rows:
        print(
            f"kvsim: {table.path}: skipped {table.bad_rows} bad rows, "
            f"dropped {table.failed_rows} failed requests",
            file=sys.stderr,
        )
    stats = trace_stats(table)
    if args.json:
        print(json.dumps(stats))
    else:
        print(format_stats(stats, table.hash_block_tokens))
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register ``kvsim trace`` and its ``stats`` subcommand."""
    parser = sub.add_parser("trace", help="inspect request traces", description=__doc__)
    actions = parser.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    stats = actions.add_parser(
        "stats",
        help="rows, time span, rate, length percentiles, repeated-block fraction",
        description="Statistics of one trace file (relative paths: here, then $KVSIM_TRACES).",
    )
    stats.add_argument("trace", help="trace file")
    stats.add_argument("--format", required=True, choices=LazyChoices(_formats),
                       metavar="FORMAT", help="one of %(choices)s")  # fmt: skip
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.add_argument(
        "--columns",
        metavar="FIELD=COLUMN,...",
        help="csv/jsonl column mapping, e.g. arrival=ts,prompt_tokens=in,output_tokens=out",
    )
    stats.add_argument("--time-unit", choices=LazyChoices(_time_units), metavar="UNIT",
                       help="csv/jsonl time unit: %(choices)s (default s)")  # fmt: skip
    stats.add_argument(
        "--hash-block-tokens", type=int, metavar="N", help="tokens per block of hash_ids"
    )
    stats.add_argument("--on-bad-rows", choices=("error", "skip"), help="default: error")
    stats.set_defaults(func=stats_command)
