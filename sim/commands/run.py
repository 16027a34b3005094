"""``kvsim run CONFIG [--out DIR] [--force] [--quiet] [--set KEY=VALUE ...]``: one simulation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sim.errors import ConfigError, KvsimError
from sim.units import format_bytes

if TYPE_CHECKING:
    from sim.run import RunResult

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
    ("decode step p50 / p99", ("decode_step_p50_s", "decode_step_p99_s"), "ms"),
    (
        "reuse hits HBM / DRAM / SSD",
        ("hbm_reuse_hit_rate", "dram_reuse_hit_rate", "ssd_reuse_hit_rate"),
        "rates",
    ),
    (  # every admission's lookups: a preempted request's re-hits of its own blocks too
        "hits with re-hits HBM / DRAM / SSD",
        ("hbm_hit_rate", "dram_hit_rate", "ssd_hit_rate"),
        "rates",
    ),
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


def _hbm_cache_row(result: RunResult) -> tuple[str, str] | None:
    """In ``dram_centric`` the KV pool row shows HBM's cache of hot blocks, whose size follows
    each step's activations: its range over the run (the timeline's ``hbm_kv_pool_bytes``)."""
    cache = result.tables["timeline"]["hbm_kv_pool_bytes"]
    if result.config.kv.mode != "dram_centric" or not len(cache):
        return None
    low, high = format_bytes(float(cache.min())), format_bytes(float(cache.max()))
    return "HBM cache (dram_centric)", low if low == high else f"{low} to {high}"


def format_summary(result: RunResult) -> str:
    """The short table ``kvsim run`` prints."""
    rows = [(label, _cell(result.summary, key, fmt)) for label, key, fmt in SUMMARY_ROWS]
    cache = _hbm_cache_row(result)
    if cache is not None:
        rows = [cache if label == "KV pool" else (label, text) for label, text in rows]
    if result.plan.gpus > 1:  # tensor parallelism: HBM figures are one GPU's
        per_gpu = ("HBM", "KV pool")
        rows = [(f"{label} per GPU" if label.startswith(per_gpu) else label, text)
                for label, text in rows]  # fmt: skip
        rows.insert(0, ("GPUs (tensor parallel)", str(result.plan.gpus)))
    rows += _cluster_rows(result.summary)
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {text}" for label, text in rows)


def _cluster_rows(summary: dict) -> list[tuple[str, str]]:
    """A cluster's rows: requests per instance, the KV pool's hits, the NICs' bytes."""
    instances = summary.get("instances")
    if instances is None:
        return []
    counts = " / ".join(str(i["requests"]) for i in instances)
    rows = [("instances", f"{len(instances)} (requests {counts})")]
    if "pool_hit_rate" in summary:
        rows.append(("cluster KV pool hits", f"{summary['pool_hit_rate']:.1%}"))
    rows.append(("NIC in / out", _cell(summary, ("nic_in_bytes", "nic_out_bytes"), "bytes")))
    return rows


def check_schedulable(result: RunResult, source: str) -> None:
    """Refuse a run in which no request could ever be scheduled (every one rejected), naming
    the key that limits the shortest request: ``engine.max_model_len``,
    ``engine.max_batched_tokens`` without chunked prefill, or the room KV lives in (the KV
    pool's key, :meth:`HbmPlan.pool_key`; in ``dram_centric`` the DRAM capacity's)."""
    summary = result.summary
    if summary["requests_finished"] or not summary["requests_rejected"]:
        return
    config, plan, engine = result.config, result.plan, result.config.engine
    requests = result.tables["requests"]
    shortest = int((requests["prompt_tokens"] + requests["output_tokens"]).min())
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


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}/s"


def overload_warning(summary: dict) -> str | None:
    """The one warning line of an overloaded run (``overloaded`` in the summary), or None."""
    if not summary.get("overloaded"):
        return None
    offered, served = summary.get("offered_rate_rps"), summary.get("served_rate_rps")
    return (
        f"kvsim: warning: overloaded: requests arrived at {_rate(offered)} but were served at "
        f"{_rate(served)}, so the waiting queue grew all run and latencies measure that "
        "backlog; lower the arrival rate (workload.arrival.rate, workload.rate_scale) or add "
        "capacity"
    )


def check_out(out: Path, force: bool) -> None:
    """Refuse a non-empty ``out`` unless ``force``; refuse one holding folders (a sweep's,
    say) even then: ``--force`` replaces a run directory, not a tree."""
    entries = sorted(out.iterdir()) if out.is_dir() else []
    if entries and not force:
        shown = ", ".join(p.name for p in entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise KvsimError(
            f"{out}: the output folder is not empty (it holds {shown}); pass --force to "
            "replace it, or choose another --out"
        )
    folders = [p.name for p in entries if p.is_dir()]
    if folders:
        raise KvsimError(
            f"{out}: holds folders ({folders[0]}/), so it is not a run directory and --force "
            "will not replace it; choose another --out"
        )


def run_command(args: argparse.Namespace) -> int:
    """Load, check the output folder, simulate (a progress bar on a terminal), print the
    summary and any overload warning, write the run directory."""
    from sim.config.loader import load_config  # (imported here: `kvsim --help` stays quick)
    from sim.observe.progress import RunProgress
    from sim.run import simulate
    from sim.rundir import check_writable, write_run

    overrides = [*args.set, *([f"engine.check={args.check}"] if args.check is not None else [])]
    config = load_config(args.config, overrides)
    out = check_writable(args.out or Path("runs") / Path(args.config).stem)
    check_out(out, args.force)
    progress = RunProgress(sys.stderr)
    observers = [progress.attach] if not args.quiet and sys.stderr.isatty() else []
    try:
        with progress:
            result = simulate(config, base_dir=Path(args.config).parent, observers=observers)
        check_schedulable(result, str(args.config))
    except ConfigError as error:
        raise error.at(str(args.config)) from None
    print(format_summary(result))
    warning = overload_warning(result.summary)
    if warning:
        print(warning, file=sys.stderr)
    write_run(result, out)
    print(f"wrote {out}/")
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register ``kvsim run``."""
    parser = sub.add_parser("run", help="simulate one config", description=__doc__)
    parser.add_argument("config", help="run config YAML")
    parser.add_argument("--out", type=Path, help="run directory (default: runs/CONFIG_NAME)")
    parser.add_argument(
        "--force", action="store_true",
        help="replace --out if it is not empty (by default a non-empty folder is refused)",
    )  # fmt: skip
    parser.add_argument(
        "--quiet", action="store_true",
        help="draw no progress bar (by default runs longer than a few seconds draw one on "
        "stderr when it is a terminal)",
    )  # fmt: skip
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
    parser.set_defaults(func=run_command, quick_exit=True)  # (see sim.cli.quick_exit)
