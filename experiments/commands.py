"""``kvsim`` subcommands that live in ``experiments`` (registered by entry point)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sim.commands.lazy import LazyChoices
from sim.errors import KvsimError

if TYPE_CHECKING:
    from experiments.plots import PlotOptions

EXIT_FAILED_POINTS = 1


def _plot_options(args: argparse.Namespace) -> PlotOptions:
    """The figure's options from ``kvsim plot``'s flags (limits checked here)."""
    from experiments.plots import PlotOptions, parse_limits

    return PlotOptions(
        where=tuple(args.where),
        x=args.x,
        metric=args.metric,
        hue=tuple(h for h in args.hue.split(",") if h) if args.hue is not None else None,
        panel=args.panel,
        title=args.title,
        xlabel=args.xlabel,
        ylabel=args.ylabel,
        xlim=parse_limits(args.xlim, "--xlim") if args.xlim is not None else None,
        ylim=parse_limits(args.ylim, "--ylim") if args.ylim is not None else None,
        legend=args.legend,
        logx=args.logx,
        logy=args.logy,
        kv_detail=args.kv_detail,
        data_out=args.data_out,
    )


def plot_command(args: argparse.Namespace) -> int:
    """Draw one figure from run directories, a sweep directory, or a replay CSV."""
    from experiments.plots import PLOTS

    first = Path(args.paths[0])
    default = (first if first.is_dir() else first.parent) / f"{args.kind}.png"
    options = _plot_options(args)
    out = PLOTS[args.kind](args.paths, args.out or default, options)
    print(f"wrote {out}" + (f" and {options.data_out}" if options.data_out else ""))
    return 0


def _kinds() -> list[str]:
    from experiments.plots import PLOTS  # (imported when needed: matplotlib is slow to load)

    return sorted(PLOTS)


def _legends() -> tuple[str, ...]:
    from experiments.plots import LEGENDS

    return tuple(LEGENDS)


def _add_look_options(parser: argparse.ArgumentParser) -> None:
    """``kvsim plot``'s options for how the figure looks (any kind)."""
    look = parser.add_argument_group("how it looks (any kind; default: the figure's own)")
    look.add_argument("--title", help="figure title ('' for none; default: model, GPU, KV mode)")
    look.add_argument("--xlabel", help="x axis label")
    look.add_argument("--ylabel", help="y axis label")
    look.add_argument("--xlim", metavar="LOW,HIGH",
                      help="x range in the axis' unit; a side may be empty (0,); --xlim=-1,5 "
                      "for a negative LOW")  # fmt: skip
    look.add_argument("--ylim", metavar="LOW,HIGH", help="y range, as --xlim")
    look.add_argument(
        "--legend", choices=LazyChoices(_legends), metavar="WHERE",
        help="'outside' (right of the panels), 'none', or a matplotlib location ('best', "
        "'upper left', ...); default: inside while it is small and the panel alone",
    )  # fmt: skip
    look.add_argument("--logx", action=argparse.BooleanOptionalAction,
                      help="log x axis (default: where the values span a wide range)")  # fmt: skip
    look.add_argument("--logy", action=argparse.BooleanOptionalAction, help="log y axis")
    look.add_argument(
        "--kv-detail", action=argparse.BooleanOptionalAction,
        help="hbm-pressure: a strip under each panel with the KV alone (default: when KV is "
        "under 15%% of HBM)",
    )  # fmt: skip
    look.add_argument("--data-out", type=Path, metavar="FILE.csv",
                      help="also write the numbers the figure draws, as CSV")  # fmt: skip


def add_plot_command(sub: argparse._SubParsersAction) -> None:
    """Register ``kvsim plot PATH... --kind K [--out FILE] [--where KEY=VALUE] ...``."""
    parser = sub.add_parser(
        "plot",
        help="draw a figure from run directories, a sweep directory or a replay CSV",
        description="Draw a figure (PNG, PDF or SVG, by the --out suffix) from run files.",
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH",
        help="run directories (one panel or line each), a sweep directory, or a "
        "'kvsim replay' CSV (hit-rate)",
    )  # fmt: skip
    parser.add_argument("--kind", choices=LazyChoices(_kinds), default="hbm-pressure",
                        metavar="KIND", help="%(choices)s (default: hbm-pressure)")  # fmt: skip
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help="PNG, PDF or SVG file (default: PATH/KIND.png)"
    )
    parser.add_argument(
        "--where", action="append", default=[], metavar="KEY=VALUE",
        help="keep the sweep points whose axis KEY equals VALUE, or one of V1|V2|... "
        "(repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--x", metavar="AXIS",
        help="throughput/hit-rate: the axis on x (routing: the routers, default "
        "cluster.router.kind)",
    )  # fmt: skip
    parser.add_argument(
        "--metric", metavar="NAME",
        help="throughput/hit-rate: the summary figure on y (default: output_tokens_per_s; "
        "hit-rate: hbm, dram or ssd, the tier's cross-request hit rate, default hbm; "
        "routing: hit or reuse, default hit)",
    )  # fmt: skip
    parser.add_argument(
        "--hue", metavar="AXIS,...",
        help="throughput/hit-rate/routing: axes that tell lines (bars) apart (default: every "
        "other axis that varies; '' for one line)",
    )  # fmt: skip
    parser.add_argument(
        "--panel", metavar="AXIS",
        help="throughput/hit-rate/routing: one panel per value (routing: default workload "
        "where it varies; '' for none)",
    )  # fmt: skip
    _add_look_options(parser)
    parser.set_defaults(func=plot_command)


def compare_command(args: argparse.Namespace) -> int:
    """Print the runs' summaries side by side."""
    from experiments.compare import compare, format_table

    keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else None
    print(format_table(compare(args.runs, keys)))
    return 0


def add_compare_command(sub: argparse._SubParsersAction) -> None:
    """Register ``kvsim compare RUN_DIR... [--keys K1,K2,...]``."""
    parser = sub.add_parser(
        "compare",
        help="set the summaries of runs side by side, with differences",
        description="A table of the runs' summary.json: a column per run (named by its "
        "folder), a row per key, each run's difference from the first (absolute and %).",
    )
    parser.add_argument(
        "runs", nargs="+", metavar="RUN_DIR",
        help="run directories ('kvsim run --out') or sweep point folders (DIR/points/ID)",
    )  # fmt: skip
    parser.add_argument(
        "--keys", metavar="K1,K2,...",
        help="summary keys to show, in order (default: the headline latency, throughput, "
        "hit-rate and memory keys)",
    )  # fmt: skip
    parser.set_defaults(func=compare_command)


def sweep_command(args: argparse.Namespace) -> int:
    """Expand and check the sweep, run its points, write ``results.parquet``."""
    from experiments.runner import SweepInterrupted, run_sweep
    from experiments.sweep import load_sweep, with_checks
    from experiments.tasks import Limits

    if args.workers is not None and args.workers < 1:
        raise KvsimError(f"--workers must be at least 1, got {args.workers}")
    if args.point_timeout is not None and args.point_timeout <= 0:
        raise KvsimError(f"--point-timeout must be positive, got {args.point_timeout}")
    sweep = load_sweep(args.sweep)
    if args.check:
        sweep = with_checks(sweep)
    print(f"{args.sweep}: {len(sweep.points)} points over {', '.join(sweep.axes) or 'no axis'}")
    try:
        limits = Limits(args.workers, args.point_timeout)
        results = run_sweep(sweep, args.out, limits, args.backend, args.resume, not args.quiet)
    except SweepInterrupted as stop:
        print(
            f"kvsim: sweep stopped by {stop}; finished points are kept in {args.out}; "
            "rerun with --resume to finish it",
            file=sys.stderr,
        )
        return 128 + stop.signum
    counts = results.status.value_counts()
    done, failed = int(counts.get("done", 0)), int(counts.get("failed", 0))
    print(f"{done} done, {failed} failed; wrote {Path(args.out) / 'results.parquet'}")
    for _, row in results[results.status == "failed"].head(5).iterrows():
        print(f"  failed {row.point_id}: {row.error}", file=sys.stderr)
    return EXIT_FAILED_POINTS if failed else 0


def add_sweep_command(sub: argparse._SubParsersAction) -> None:
    """Register ``kvsim sweep SWEEP.yaml --out DIR [--workers N] [--backend B] [--resume]``."""
    parser = sub.add_parser(
        "sweep",
        help="run every point of a sweep file (grid/zip/seeds over a base config)",
        description="Run a sweep: one run directory per point plus DIR/results.parquet. "
        "Exit status 1 if a point failed (its error is in results.parquet).",
    )
    parser.add_argument("sweep", help="sweep YAML (base, grid, zip, seeds)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="sweep directory")
    parser.add_argument(
        "--workers", type=int, metavar="N", help="points at once (default: all cores)"
    )
    parser.add_argument(
        "--backend", choices=("local", "ray"), default="local",
        help="local process pool (default) or Ray tasks on ray.init() ($RAY_ADDRESS)",
    )  # fmt: skip
    parser.add_argument("--resume", action="store_true", help="skip points already done in DIR")
    parser.add_argument(
        "--check", action="store_true",
        help="verify invariants after every step of every point (engine.check; same point ids)",
    )  # fmt: skip
    parser.add_argument(
        "--point-timeout", type=float, metavar="SECONDS",
        help="stop a point that runs longer and record it as failed (default: no limit)",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=sweep_command)
