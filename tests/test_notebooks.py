"""Every notebook runs top to bottom, twice in a row, and leaves nothing behind but its own
run folder (jupytext percent files executed with nbclient).

Each runs in its own temporary working directory, all its cells twice over in one kernel (as
"Run All" twice): a second run must find what the first left and still work. Any cell error
fails the test. Run time per notebook is printed (``-s``); the notebooks are sized to take
well under a minute on two cores.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import pytest

from sim.workload.trace import traces_root

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.py"))
NEEDS_TRACES = {"03-policies-on-real-traces"}
TIMEOUT_S = 300  # per cell: a hung cell fails the test instead of hanging CI
NO_TORCH = "torch is not installed"  # what 04 says first when it skips its measuring cells


def run_twice(path: Path, cwd: Path, env: dict[str, str] | None = None) -> list[str]:
    """Run every cell of ``path`` twice in a row in one kernel, working in ``cwd``; the
    text each cell printed or displayed, in order."""
    notebook = jupytext.read(path)
    notebook.cells = notebook.cells + copy.deepcopy(notebook.cells)
    client = nbclient.NotebookClient(
        notebook,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute(**({"env": env} if env is not None else {}))  # raises on any cell error
    texts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text", "") + output.get("data", {}).get("text/plain", ""))
    return texts


def stray_files(cwd: Path, stem: str) -> list[str]:
    """What a notebook left in ``cwd`` outside ``runs/STEM/`` (its own run folder)."""
    own = cwd / "runs" / stem
    return sorted(
        str(p.relative_to(cwd))
        for p in cwd.rglob("*")
        if p != own.parent and p != own and own not in p.parents
    )


def test_the_five_notebooks_exist():
    names = [p.stem for p in NOTEBOOKS]
    assert names == [
        "01-quickstart",
        "02-paged-vs-dram-centric",
        "03-policies-on-real-traces",
        "04-calibration",
        "05-write-your-own-policy",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_twice_and_writes_only_its_run_folder(path: Path, tmp_path: Path):
    if path.stem in NEEDS_TRACES and not (traces_root() and traces_root().is_dir()):
        pytest.skip("the Mooncake traces are not here (set KVSIM_TRACES to the traces folder)")
    start = time.perf_counter()
    run_twice(path, tmp_path)
    print(f"{path.stem}: {time.perf_counter() - start:.1f} s for two runs")
    assert stray_files(tmp_path, path.stem) == []


def test_calibration_notebook_says_when_torch_is_missing_and_skips(tmp_path: Path):
    hidden = tmp_path / "no-torch" / "torch"  # an ``import torch`` that fails
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('torch is hidden by the test')\n")
    paths = [str(hidden.parent), os.environ.get("PYTHONPATH", ""), str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    work = tmp_path / "work"
    work.mkdir()
    texts = run_twice(ROOT / "notebooks" / "04-calibration.py", work, env)
    said = "\n".join(texts)
    assert said.count(NO_TORCH) == 2 * 4, said  # each run: the note and 3 skipped cells
    assert "cpu-host (placeholder)" in said and "calibrated" not in said.replace(NO_TORCH, "")
    assert stray_files(work, "04-calibration") == []
    assert not any((work / "runs" / "04-calibration").iterdir())  # nothing was measured
