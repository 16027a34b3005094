"""``kvsim`` subcommands that live in ``experiments`` (registered by entry point)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.errors import KvsimError

EXIT_FAILED_POINTS = 1


def plot_command(args: argparse.Namespace) -> int:
    """Draw one figure from run directories, a sweep directory, or a replay CSV."""
    from experiments.plots import PLOTS, PlotOptions

    first = Path(args.paths[0])
    default = (first if first.is_dir() else first.parent) / f"{args.kind}.png"
    options = PlotOptions(
        where=tuple(args.where),
        x=args.x,
        metric=args.metric,
        hue=tuple(h for h in args.hue.split(",") if h) if args.hue is not None else None,
        panel=args.panel,
    )
    out = PLOTS[args.kind](args.paths, args.out or default, options)
    print(f"wrote {out}")
    return 0


def add_plot_command(sub: argparse._SubParsersAction) -> None:
    """Register ``kvsim plot PATH... --kind K [--out FILE] [--where KEY=VALUE] ...``."""
    from experiments.plots import PLOTS

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
    parser.add_argument("--kind", choices=sorted(PLOTS), default="hbm-pressure")
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help="PNG, PDF or SVG file (default: PATH/KIND.png)"
    )
    parser.add_argument(
        "--where", action="append", default=[], metavar="KEY=VALUE",
        help="keep the sweep points whose axis KEY equals VALUE (repeatable)",
    )  # fmt: skip
    parser.add_argument("--x", metavar="AXIS", help="throughput/hit-rate: the axis on x")
    parser.add_argument(
        "--metric", metavar="NAME",
        help="throughput/hit-rate: the summary figure on y (default: output_tokens_per_s, "
        "hbm_hit_rate)",
    )  # fmt: skip
    parser.add_argument(
        "--hue", metavar="AXIS,...",
        help="throughput/hit-rate: axes that tell lines apart (default: every other axis that "
        "varies; '' for one line)",
    )  # fmt: skip
    parser.add_argument("--panel", metavar="AXIS", help="throughput/hit-rate: one panel per value")
    parser.set_defaults(func=plot_command)


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
