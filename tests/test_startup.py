"""Start-up: the ``kvsim`` parser and ``--help`` import no heavy library (issue 29).

Each command imports what it needs when it runs; a subprocess shows which modules a fresh
interpreter holds after building the parser and printing the help.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

HEAVY = ("pandas", "matplotlib", "torch", "pyarrow", "pydantic", "scipy", "simpy")

PROBE = """
import json, sys
import sim.cli
parser = sim.cli.build_parser()
try:
    sim.cli.main([{argv}])
except SystemExit:
    pass
print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))
"""


def loaded_after(argv: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv)],
        capture_output=True, text=True, env=env, cwd=REPO, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_help_imports_no_heavy_library():
    loaded = loaded_after("'--help'")
    assert "sim" in loaded  # the probe did import the command line
    assert [m for m in HEAVY if m in loaded] == []


def test_command_help_imports_no_heavy_library():
    """(The help of ``plot``, ``replay`` and ``trace stats`` lists choices its command's
    modules hold: those load them.)"""
    for command in ("run", "sweep", "compare"):
        loaded = loaded_after(f"'{command}', '--help'")
        assert [m for m in HEAVY if m in loaded] == [], command


def test_a_command_that_runs_imports_what_it_needs():
    """The probe can see a heavy import: ``trace stats`` on a missing file loads the config
    schema (pydantic) before it fails."""
    loaded = loaded_after("'trace', 'stats', 'no-such-trace.csv', '--format', 'azure'")
    assert "pydantic" in loaded
