"""Every notebook runs top to bottom (jupytext percent files executed with nbclient).

Each runs in its own temporary working directory; any cell error fails the test. Run
time per notebook is printed (``-s``); the notebooks are sized to take well under a
minute on two cores.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from sim.workload.trace import traces_root

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.py"))
NEEDS_TRACES = {"03-policies-on-real-traces"}
NEEDS_TORCH = {"04-calibration"}
TIMEOUT_S = 300  # per cell: a hung cell fails the test instead of hanging CI


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
def test_notebook_runs(path: Path, tmp_path: Path):
    if path.stem in NEEDS_TRACES and not (traces_root() and traces_root().is_dir()):
        pytest.skip("the Mooncake traces are not here (set KVSIM_TRACES to the traces folder)")
    if path.stem in NEEDS_TORCH and importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (pip install -e '.[validation]')")
    notebook = jupytext.read(path)
    client = nbclient.NotebookClient(
        notebook,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    print(f"{path.stem}: {time.perf_counter() - start:.1f} s")
