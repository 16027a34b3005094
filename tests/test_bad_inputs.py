"""The bad-input corpus (tests/bad_inputs/cases.yaml): every case is one clear message, exit 2.

Each case runs through the CLI from the corpus folder; its message must name the input file
and contain the case's fragments (the key or line, the value, what was expected), with no
traceback, and a run or sweep must leave no output behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.cli import main
from tests.conftest import REPO

CORPUS = Path(__file__).parent / "bad_inputs"
CASES: dict[str, dict] = yaml.safe_load((CORPUS / "cases.yaml").read_text())
PREFIX = "kvsim: error: "


def command(case: dict, out: Path) -> list[str]:
    """The case's arguments, with ``--out`` for the commands that write."""
    args = [str(a) for a in case["args"]]
    return [*args, "--out", str(out)] if args[0] in ("run", "sweep") else args


def check_message(name: str, err: str) -> None:
    """One ``kvsim: error:`` message holding every fragment of the case, no traceback."""
    case = CASES[name]
    assert err.startswith(PREFIX), err
    assert err.count("kvsim: error") == 1, err
    assert "Traceback" not in err and 'File "' not in err, err
    assert str(case.get("names", case["args"][1])) in err, err
    for fragment in case["expect"]:
        assert fragment in err, f"{name}: {fragment!r} not in:\n{err}"


def test_corpus_is_large_and_every_file_is_used():
    assert len(CASES) >= 30
    used = {str(a) for case in CASES.values() for a in case["args"]}
    inputs = {p.name for p in CORPUS.glob("*.yaml") if p.name != "cases.yaml"}
    referenced = {"sweep_base.yaml", "trace_good.jsonl", "trace_empty.jsonl", "trace_fields.csv"}
    assert inputs - used - referenced == set()


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_clear_message(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(CORPUS)
    monkeypatch.syspath_prepend(str(CORPUS))  # broken_policy.py, a user module that fails
    out = tmp_path / "out"
    assert main(command(CASES[name], out)) == 2
    check_message(name, capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize("name", ["unit_bandwidth_as_size", "trace_truncated"])
def test_a_subprocess_exits_2_without_traceback(name, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(CORPUS), str(REPO)))}
    proc = subprocess.run(
        [sys.executable, "-m", "sim", *command(CASES[name], tmp_path / "out")],
        cwd=CORPUS,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    check_message(name, proc.stderr)
    assert proc.stderr.count("\n") == 1  # one line
