"""The ``kvsim`` command line: subcommands are small modules that register themselves.

Built-in commands live in ``sim.commands``; other packages (``experiments``) add theirs
through the ``kvsim.commands`` entry-point group, so ``sim`` never imports them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from sim.errors import KvsimError

BUILTIN_COMMANDS = ("sim.commands.run", "sim.commands.replay", "sim.commands.trace")
EXIT_USAGE = 2  # a bad input: config, trace, sweep file, output folder
EXIT_INVARIANT = 3  # the simulator broke one of its invariants (a bug, not the input's fault)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="kvsim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in BUILTIN_COMMANDS:
        importlib.import_module(module_name).add_command(sub)
    for ep in sorted(entry_points(group="kvsim.commands"), key=lambda e: e.name):
        try:
            ep.load()(sub)
        except Exception as error:  # a broken plugin must not take the other commands down
            print(f"kvsim: warning: command {ep.name!r} unavailable: {error}", file=sys.stderr)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; user errors print one message and exit with status 2."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KvsimError as error:
        if _is_invariant_violation(error):
            print(f"kvsim: internal error (please report it): {error}", file=sys.stderr)
            return EXIT_INVARIANT
        print(f"kvsim: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def _is_invariant_violation(error: BaseException) -> bool:
    """Whether ``error`` is the simulator's own broken invariant (its module is imported by
    then: only a run that checked invariants raises one; the parser does not import it)."""
    invariants = sys.modules.get("sim.observe.invariants")
    return invariants is not None and isinstance(error, invariants.InvariantViolation)


if __name__ == "__main__":
    sys.exit(main())
