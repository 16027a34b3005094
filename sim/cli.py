"""The ``kvsim`` command line: subcommands are small modules that register themselves.

Built-in commands live in ``sim.commands``; other packages (``experiments``) add theirs
through the ``kvsim.commands`` entry-point group, so ``sim`` never imports them. A built-in
command's run loads no plugin (nor the entry points' metadata): it starts sooner.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from sim.errors import KvsimError

BUILTIN_COMMANDS = ("sim.commands.run", "sim.commands.replay", "sim.commands.trace")  # NAME last
EXIT_USAGE = 2  # a bad input: config, trace, sweep file, output folder
EXIT_INVARIANT = 3  # the simulator broke one of its invariants (a bug, not the input's fault)


def build_parser(plugins: bool = True) -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand (``plugins``: with those of
    the ``kvsim.commands`` entry points; else the built-in ones only)."""
    parser = argparse.ArgumentParser(prog="kvsim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in BUILTIN_COMMANDS:
        importlib.import_module(module_name).add_command(sub)
    if plugins:
        _add_plugins(sub)
    return parser


def _add_plugins(sub: argparse._SubParsersAction) -> None:
    """Register the commands of the ``kvsim.commands`` entry points."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group="kvsim.commands"), key=lambda e: e.name):
        try:
            ep.load()(sub)
        except Exception as error:  # a broken plugin must not take the other commands down
            print(f"kvsim: warning: command {ep.name!r} unavailable: {error}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; user errors print one message and exit with status 2.

    Called as the program (no ``argv``), a command that sets ``quick_exit`` (``run``) ends
    the process when it succeeds, by :func:`quick_exit`. A built-in command (none does
    linear algebra) starts numpy's BLAS on one thread (:func:`limit_blas_threads`)."""
    program = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    builtin = {name.rsplit(".", 1)[-1] for name in BUILTIN_COMMANDS}
    if argv and argv[0] in builtin:
        limit_blas_threads(1)
    args = build_parser(plugins=not argv or argv[0] not in builtin).parse_args(argv)
    try:
        code = int(args.func(args) or 0)
    except KvsimError as error:
        if _is_invariant_violation(error):
            print(f"kvsim: internal error (please report it): {error}", file=sys.stderr)
            return EXIT_INVARIANT
        print(f"kvsim: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if program and getattr(args, "quick_exit", False):
        quick_exit(code)
    return code


def limit_blas_threads(threads: int) -> None:
    """Start numpy's BLAS (OpenBLAS, or MKL) with ``threads`` threads, unless numpy is loaded
    already or the environment says otherwise. For commands that do no linear algebra (the
    validation package's torch kernels keep their threads): with a thread a core, OpenBLAS
    spends ~55 ms starting them as numpy loads (two cores), and a long dot product's
    rounding would depend on the machine's core count."""
    if "numpy" in sys.modules:
        return
    for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, str(threads))


def quick_exit(code: int) -> NoReturn:
    """End the process with ``code`` now: run the ``atexit`` handlers and flush stdout and
    stderr, as an interpreter's exit does, but skip the rest of its teardown, which frees the
    finished run's objects one by one (~0.05 s after a run; issue 29). Only for a process
    whose work is done and whose files are closed."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # (a reader gone: a closed pipe)
            stream.flush()
    os._exit(code)


def _is_invariant_violation(error: BaseException) -> bool:
    """Whether ``error`` is the simulator's own broken invariant (its module is imported by
    then: only a run that checked invariants raises one; the parser does not import it)."""
    invariants = sys.modules.get("sim.observe.invariants")
    return invariants is not None and isinstance(error, invariants.InvariantViolation)


if __name__ == "__main__":
    sys.exit(main())
