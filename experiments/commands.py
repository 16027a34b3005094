"""``kvsim`` subcommands that live in ``experiments`` (registered by entry point)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.errors import KvsimError


def plot_command(args: argparse.Namespace) -> int:
    """Draw one figure from a run directory."""
    from experiments.plots import PLOTS

    run_dir = Path(args.run_dir)
    if not (run_dir / "timeline.parquet").is_file():
        raise KvsimError(
            f"{run_dir}: not a run directory (no timeline.parquet); run 'kvsim run' first"
        )
    out = PLOTS[args.kind](run_dir, args.out or run_dir / f"{args.kind}.png")
    print(f"wrote {out}")
    return 0


def add_plot_command(sub: argparse._SubParsersAction) -> None:
    """Register ``kvsim plot RUN_DIR --kind K [--out FILE]``."""
    from experiments.plots import PLOTS

    parser = sub.add_parser("plot", help="draw a figure from a run directory")
    parser.add_argument("run_dir", help="a directory written by 'kvsim run'")
    parser.add_argument("--kind", choices=sorted(PLOTS), default="hbm-pressure")
    parser.add_argument("--out", type=Path, help="PNG or PDF file (default: RUN_DIR/KIND.png)")
    parser.set_defaults(func=plot_command)
