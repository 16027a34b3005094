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
    """Refuse a run in which no request could ever be scheduled (every one rejected), naming
    the key that limits the shortest request: ``engine.max_model_len``,
    ``engine.max_batched_tokens`` without chunked prefill, or the room KV lives in (the KV
    pool's key, :meth:`HbmPlan.pool_key`; in ``dram_centric`` the DRAM capacity's)."""
    summary = result.summary
    if summary["requests_finished"] or not summary["requests_rejected"]:
        return
    config, plan, engine = result.config, result.plan, result.config.engine
    requests = result.requests
    shortest = int((requests.prompt_tokens + requests.output_tokens).min())
    blocks = -(-(shortest - 1) // engine.block_tokens)  # its last token needs no KV
    limits: list[tuple[str, str, str]] = []  # key, what it allows, what would do
    if engine.max_model_len and shortest > engine.max_model_len:
        key, most = "engine.max_model_len", engine.max_model_len
        limits.append((key, f"{key} is {most}", f"{key} of at least {shortest}"))
    if not engine.chunked_prefill and shortest > engine.max_batched_tokens:
        key, most = "engine.max_batched_tokens", engine.max_batched_tokens
        said = f"without chunked prefill (engine.chunked_prefill false) one step holds {key} {most}"
        limits.append((key, said, f"{key} of at least {shortest} or engine.chunked_prefill true"))
    if config.kv.mode == "dram_centric":
        key, room = config.tier_capacity("dram")
        block = config.tier_block_bytes("dram")
        held = f"{key} {format_bytes(room)} holds {int(room // block)} blocks"
        if room // block < blocks:
            said = f"in dram_centric every block ({format_bytes(block)}) lives in DRAM, and {held}"
            limits.append((key, said, f"{key} of at least {format_bytes(blocks * block)}"))
    elif plan.pool_blocks < blocks:
        pool = f"{plan.pool_blocks} blocks: " + (
            "engine.kv_pool_blocks" if engine.kv_pool_blocks else plan.carve(config)
        )
        said = f"the KV pool holds {pool}"
        limits.append((plan.pool_key(config), said, f"a KV pool of at least {blocks} blocks"))
    reasons = ", ".join(f"{why}: {n}" for why, n in summary["rejected_reasons"].items())
    said = "; and ".join(limit for _, limit, _ in limits) or "the engine's limits refuse it"
    fixes = " and ".join(fix for _, _, fix in limits) or "engine limits that fit it"
    raise ConfigError(
        f"no request can ever be scheduled: all {summary['requests_rejected']} were rejected "
        f"({reasons}); the shortest needs {shortest} tokens ({blocks} blocks of "
        f"{engine.block_tokens}), but {said}; expected {fixes}",
        source=source,
        key=limits[0][0] if limits else "engine",
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
