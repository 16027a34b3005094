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


def probe(script: str, *argv: str, env: dict[str, str] | None = None) -> list:
    """What ``script`` (run in a fresh interpreter with ``argv``) prints last, as JSON."""
    env = {**(os.environ if env is None else env), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", script, *argv],
        capture_output=True, text=True, env=env, cwd=REPO, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def loaded_after(argv: str) -> list[str]:
    return probe(PROBE.format(argv=argv))


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


RUN_PROBE = """
import json, sys, types
used = []
class Unused(types.ModuleType):  # pandas, as a module that records what is taken from it
    def __getattr__(self, name):
        if not name.startswith("__"):
            used.append(name)
        raise AttributeError(f"pandas.{name}: used by the run")
sys.modules["pandas"] = Unused("pandas")
import sim.cli
assert sim.cli.main(["run", sys.argv[1], "--out", sys.argv[2], "--quiet"]) == 0
if sys.argv[3] == "use":  # the probe's control: asking for a DataFrame of the run uses pandas
    from sim.run import as_frame
    try:
        as_frame({"a": [1]})
    except AttributeError:
        pass
print(json.dumps(sorted(set(used)) + [m for m in ("tqdm",) if m in sys.modules]))
"""
SMALL_RUN = """
seed: 0
model: llama-3-8b
hardware: h100-sxm
workload: {kind: synthetic, num_requests: 8, arrival: {kind: poisson, rate: 4.0},
           prompt_tokens: 256, output_tokens: 8}
engine: {max_num_seqs: 8, max_batched_tokens: 1024}
kv: {mode: hbm}
"""


def used_by_a_run(tmp_path, control: bool = False) -> list[str]:
    config = tmp_path / "small.yaml"
    config.write_text(SMALL_RUN)
    return probe(RUN_PROBE, str(config), str(tmp_path / "run"), "use" if control else "-")


def test_a_run_uses_no_pandas_nor_tqdm(tmp_path):
    """``kvsim run`` (a synthetic workload, no progress bar) computes its summary and writes
    its parquet files without pandas: a module that imports it eagerly but never uses it
    costs nothing here: the probe's pandas records what is taken from it, not imports."""
    assert used_by_a_run(tmp_path) == []
    assert (tmp_path / "run" / "timeline.parquet").is_file()


def test_a_synthetic_run_never_imports_pandas(tmp_path):
    """Not even a module of the engine imports pandas eagerly: a synthetic ``kvsim run``
    (no trace file to parse) ends with no pandas nor matplotlib in the interpreter."""
    config = tmp_path / "small.yaml"
    config.write_text(SMALL_RUN)
    loaded = loaded_after(f"'run', {str(config)!r}, '--out', {str(tmp_path / 'run')!r}, '--quiet'")
    assert "simpy" in loaded  # the probe did run the engine
    assert [m for m in ("pandas", "matplotlib", "tqdm") if m in loaded] == []


def test_the_run_probe_sees_pandas_used(tmp_path):
    assert used_by_a_run(tmp_path, control=True) == ["DataFrame"]


FITTED_RUN = """
seed: 0
model: llama-3-8b
hardware: h100-sxm
workload:
  kind: fitted
  from: {format: azure, path: conv.csv}
  num_requests: 8
  arrival: {kind: poisson, rate: 4.0}
engine: {max_num_seqs: 8, max_batched_tokens: 1024}
kv: {mode: hbm}
"""
AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:51.2224670,879,55\n"
)


def test_a_run_fitted_to_a_csv_trace_never_imports_pandas(tmp_path):
    """The CSV trace is read without pandas (sim.workload.csvfast): a ``kvsim run`` fitted
    to an Azure trace ends with no pandas in the interpreter, and has read the trace."""
    (tmp_path / "conv.csv").write_text(AZURE)
    config = tmp_path / "fitted.yaml"
    config.write_text(FITTED_RUN)
    out = tmp_path / "run"
    loaded = loaded_after(f"'run', {str(config)!r}, '--out', {str(out)!r}, '--quiet'")
    assert "simpy" in loaded
    assert [m for m in ("pandas", "matplotlib", "tqdm") if m in loaded] == []
    workload = json.loads((out / "summary.json").read_text())["workload"]
    assert workload["rows_in_file"] == 3 and workload["requests"] == 3


QUICK_EXIT_PROBE = """
import atexit, pathlib, sys
atexit.register(pathlib.Path(sys.argv[3]).write_text, "ran")
sys.argv = ["kvsim", "run", sys.argv[1], "--out", sys.argv[2], "--quiet"]
import sim.cli
code = sim.cli.main()
print("main returned", code)
"""


def test_a_run_as_the_program_skips_teardown_but_not_exit_handlers(tmp_path):
    """Called as the program, a successful ``kvsim run`` ends the process in ``main``
    (sim.cli.quick_exit): its output is flushed to a pipe, its files are written, the
    ``atexit`` handlers ran, and status 0; a failing one returns its status as before."""
    config = tmp_path / "small.yaml"
    config.write_text(SMALL_RUN)
    out, marker = tmp_path / "run", tmp_path / "atexit"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", QUICK_EXIT_PROBE, str(config), str(out), str(marker)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"wrote {out}/"  # (not "main returned")
    assert marker.read_text() == "ran"
    assert (out / "timeline.parquet").is_file() and (out / "summary.json").is_file()
    argv[3] = str(tmp_path / "missing.yaml")
    failed = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO)
    assert failed.stdout.splitlines()[-1] == "main returned 2"
    assert "kvsim: error:" in failed.stderr


BLAS_PROBE = """
import json, os, sys
import sim.cli
sim.cli.main(sys.argv[1:])
import numpy  # (loaded by the command, with the environment it saw)
tasks = len(os.listdir("/proc/self/task"))
print(json.dumps([os.environ.get("OPENBLAS_NUM_THREADS"), tasks]))
"""


def blas_after(argv: list[str], **env: str) -> list:
    environ = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    return probe(BLAS_PROBE, *argv, env={**environ, **env})


def test_a_command_without_linear_algebra_starts_one_blas_thread(tmp_path):
    """``kvsim trace stats`` loads numpy with OpenBLAS on one thread: the variable is set
    before numpy loads, and the process runs no BLAS worker thread (one thread in all); a
    value the environment gives is kept."""
    (tmp_path / "conv.csv").write_text(AZURE)
    argv = ["trace", "stats", str(tmp_path / "conv.csv"), "--format", "azure"]
    assert blas_after(argv) == ["1", 1]
    assert blas_after(argv, OPENBLAS_NUM_THREADS="2")[0] == "2"
