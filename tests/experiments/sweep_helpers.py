"""Small sweep files for the experiments tests (closed batches that run in a blink)."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any

import yaml

from experiments import tasks
from tests.conftest import BASE

FAST_BASE: dict[str, Any] = copy.deepcopy(BASE)
FAST_BASE["workload"] = {
    "kind": "synthetic",
    "num_requests": 4,
    "arrival": {"kind": "poisson", "rate": 50.0},
    "prompt_tokens": {"kind": "uniform", "min": 128, "max": 512},
    "output_tokens": {"kind": "uniform", "min": 8, "max": 24},
}
SPARSE = {"kind": "sparse", "sink_blocks": 1, "window_blocks": 2, "topk_blocks": 2}


def write_sweep(folder: Path, sweep: dict[str, Any], name: str = "sweep.yaml") -> Path:
    """Write a sweep file (and ``base.yaml`` when the base is given inline as FAST_BASE)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def small_sweep(folder: Path, **extra: Any) -> Path:
    """hbm vs dram_centric (sparse) x 2 batch sizes x 2 seeds, base in ``base.yaml``."""
    (folder / "base.yaml").parent.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text(yaml.safe_dump(FAST_BASE))
    sweep = {
        "base": "base.yaml",
        "grid": {"workload.num_requests": [2, 4]},
        "zip": {"kv.mode": ["hbm", "dram_centric"], "kv.access": ["full", SPARSE]},
        "seeds": [0, 1],
        **extra,
    }
    return write_sweep(folder, sweep)


HANG_VAR = "KVSIM_TEST_HANG_POINT"


def hanging_run_task(task: tasks.Task, out: Path) -> tasks.Outcome:
    """``run_task``, except that the point whose id is in ``$KVSIM_TEST_HANG_POINT`` never ends."""
    while task.point_id == os.environ.get(HANG_VAR):
        time.sleep(0.05)
    return tasks.run_task(task, out)
