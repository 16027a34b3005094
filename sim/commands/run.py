"""``kvsim run CONFIG [--out DIR] [--set KEY=VALUE ...]``: one simulation."""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.config.loader import load_config
from sim.errors import ConfigError
from sim.run import RunResult, simulate
from sim.rundir import check_writable, write_run
from sim.units import format_bytes

SUMMARY_ROWS = (
    ("requests finished", "requests_finished", "{:d}"),
    ("requests rejected", "requests_rejected", "{:d}"),
    ("output tokens/s", "output_tokens_per_s", "{:,.1f}"),
    ("TTFT p50 / p99", ("ttft_p50_s", "ttft_p99_s"), "ms"),
    ("TPOT p50 / p99", ("tpot_p50_s", "tpot_p99_s"), "ms"),
    ("E2E p50", ("e2e_p50_s",), "ms"),
    ("HBM peak", "hbm_peak_bytes", "bytes"),
    ("KV pool", "kv_pool_bytes", "bytes"),
    ("preemptions", "preemptions", "{:d}"),
    ("prefix hits HBM / DRAM / SSD", ("hbm_hit_rate", "dram_hit_rate", "ssd_hit_rate"), "rates"),
    ("host link H2D / D2H", ("h2d_bytes", "d2h_bytes"), "bytes"),
    ("stall", "stall_s", "{:.2f} s"),
    ("simulated time", "sim_time_s", "{:.1f} s"),
    ("wall time", "wall_time_s", "{:.2f} s"),
)


def _cell(summary: dict, key: str | tuple[str, ...], fmt: str) -> str:
    if fmt == "ms":
        values = [summary[k] for k in key]
        return " / ".join("-" if v is None else f"{v * 1e3:.1f} ms" for v in values)
    if fmt == "bytes":
        keys = (key,) if isinstance(key, str) else key
        return " / ".join(format_bytes(summary[k]) for k in keys)
    if fmt == "rates":
        return " / ".join(f"{summary[k]:.1%}" for k in key)
    return fmt.format(summary[key])


def format_summary(summary: dict) -> str:
    """The short table ``kvsim run`` prints."""
    width = max(len(label) for label, _, _ in SUMMARY_ROWS)
    return "\n".join(f"{label:<{width}}  {_cell(summary, k, f)}" for label, k, f in SUMMARY_ROWS)


def check_schedulable(result: RunResult, source: str) -> None:
    """Refuse a run in which no request could ever be scheduled (every one rejected)."""
    summary = result.summary
    if summary["requests_finished"] or not summary["requests_rejected"]:
        return
    reasons = ", ".join(f"{why}: {n}" for why, n in summary["rejected_reasons"].items())
    requests, engine = result.requests, result.config.engine
    shortest = int((requests.prompt_tokens + requests.output_tokens).min())
    limits = [
        f"max_batched_tokens {engine.max_batched_tokens} with chunked_prefill "
        f"{str(engine.chunked_prefill).lower()}",
        f"a KV pool of {result.plan.pool_blocks} blocks of {engine.block_tokens} tokens",
    ]
    if engine.max_model_len:
        limits.append(f"max_model_len {engine.max_model_len}")
    raise ConfigError(
        f"no request can ever be scheduled: all {summary['requests_rejected']} were rejected "
        f"({reasons}); the shortest needs {shortest} tokens; expected engine limits that fit "
        f"it, got {', '.join(limits)}",
        source=source,
        key="engine",
    )


def run_command(args: argparse.Namespace) -> int:
    """Load, check the output folder, simulate, print the summary, write the run directory."""
    overrides = [*args.set, *([f"engine.check={args.check}"] if args.check is not None else [])]
    config = load_config(args.config, overrides)
    out = check_writable(args.out or Path("runs") / Path(args.config).stem)
    try:
        result = simulate(config, base_dir=Path(args.config).parent)
        check_schedulable(result, str(args.config))
    except ConfigError as error:
        raise error.at(str(args.config)) from None
    print(format_summary(result.summary))
    write_run(result, out)
    print(f"wrote {out}/")
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register ``kvsim run``."""
    parser = sub.add_parser("run", help="simulate one config", description=__doc__)
    parser.add_argument("config", help="run config YAML")
    parser.add_argument("--out", type=Path, help="run directory (default: runs/CONFIG_NAME)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set engine.max_num_seqs=64 (repeatable)",
    )
    parser.add_argument(
        "--check", action=argparse.BooleanOptionalAction, default=None,
        help="verify invariants after every step and run of steps (engine.check; default: the "
        "config's)",
    )  # fmt: skip
    parser.set_defaults(func=run_command)
