"""Results stay bit-identical: a few small runs' output files against committed digests.

Each case runs one small config through ``simulate`` and ``write_run``, reads the files back
and hashes their contents: ``requests.parquet`` and ``timeline.parquet`` (column names,
dtypes and every value, via ``pd.util.hash_pandas_object``) and ``summary.json`` without
``wall_time_s``. The digests are compared with ``tests/data/golden_digests.json``.

A change that is *meant* to change results regenerates the golden file on purpose:

    KVSIM_REGEN_GOLDEN=1 python -m pytest -q tests/test_bit_identity.py
    # or: python -m tests.test_bit_identity

and the diff of ``tests/data/golden_digests.json`` goes into the same commit, with the reason.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from sim.config import RunConfig, build_config
from sim.run import simulate
from sim.rundir import write_run
from tests.conftest import synthetic

GOLDEN = Path(__file__).parent / "data" / "golden_digests.json"
REGEN = os.environ.get("KVSIM_REGEN_GOLDEN") == "1"

# this file's own base (not conftest's, which other tests may change)
BASE = {
    "seed": 0,
    "model": "llama-3-8b",
    "hardware": "h100-sxm",
    "engine": {"max_num_seqs": 64, "max_batched_tokens": 4096},
    "kv": {"mode": "hbm"},
}


def make_config(*overrides: str, **sections: dict) -> RunConfig:
    """:data:`BASE` with whole sections replaced and ``--set``-style overrides."""
    data = copy.deepcopy(BASE)
    data.update(copy.deepcopy(sections))
    return build_config(data, "<bit-identity>", overrides)


def _lognormal(mean: float, sigma: float, low: int, high: int) -> dict:
    return {"kind": "lognormal", "mean": mean, "sigma": sigma, "min": low, "max": high}


def _multi_turn(sessions: int) -> dict:
    return {
        "kind": "multi_turn",
        "num_sessions": sessions,
        "session_arrival": {"kind": "poisson", "rate": 2.0},
        "turns": _lognormal(4, 0.5, 1, 8),
        "think_time": {"kind": "exponential", "mean": "5s"},
        "user_tokens": _lognormal(200, 0.8, 8, 1024),
        "output_tokens": _lognormal(120, 0.6, 4, 512),
        "system_prompt_tokens": 512,
        "system_prompts": 2,
        "max_context_tokens": 8192,
    }


_PROMPTS = _lognormal(1500, 0.7, 64, 6000)
_OUTPUTS = _lognormal(150, 0.6, 4, 600)

# name -> (overrides, sections); each runs in well under 3 s
CASES: dict[str, tuple[tuple[str, ...], dict]] = {
    "hbm_prefix_recompute": (
        ("engine.kv_pool_blocks=500", "engine.max_num_seqs=32"),
        {"workload": synthetic(60, _PROMPTS, _OUTPUTS, rate=20.0, shared=768)},
    ),
    "hbm_swap_preemption": (
        ("engine.kv_pool_blocks=700", "engine.preemption=swap", "kv.prefix_caching=false"),
        {"workload": synthetic(40, _PROMPTS, _OUTPUTS, rate=20.0)},
    ),
    "offload_s3fifo_multi_turn": (
        (
            "kv.mode=offload",
            "kv.eviction=s3fifo",
            "engine.kv_pool_blocks=1200",
            "kv.dram_capacity=2GiB",
            "kv.ssd_capacity=64GiB",
        ),
        {"workload": _multi_turn(25)},
    ),
    "offload_write_back_lru": (
        ("kv.mode=offload", "kv.write_policy=write_back", "engine.kv_pool_blocks=400"),
        {"workload": _multi_turn(15)},
    ),
    "dram_centric_sparse_layerwise": (
        (
            "kv.mode=dram_centric",
            "hardware.hbm.capacity=20GiB",
            "engine.max_num_seqs=16",
        ),
        {
            "workload": synthetic(24, _lognormal(4000, 0.5, 512, 12000), 120, shared=512),
            "kv": {
                "mode": "dram_centric",
                "access": {"kind": "sparse", "window_blocks": 8, "topk_blocks": 16},
                "layerwise": True,
            },
        },
    ),
    "dram_centric_full_write_back": (
        ("hardware.hbm.capacity=20GiB", "engine.max_num_seqs=16"),
        {
            "workload": synthetic(16, _lognormal(3000, 0.5, 256, 8000), 60),
            "kv": {"mode": "dram_centric", "layerwise": False, "write_policy": "write_back"},
        },
    ),
    "dram_centric_layer_events": (
        ("hardware.hbm.capacity=20GiB", "engine.max_num_seqs=8", "engine.layer_events=true"),
        {
            "workload": synthetic(8, 2000, 30),
            "kv": {"mode": "dram_centric", "access": {"kind": "sparse", "topk_blocks": 8}},
        },
    ),
}


def _frame_digest(frame: pd.DataFrame) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([[c, str(t)] for c, t in frame.dtypes.items()]).encode())
    h.update(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())
    return h.hexdigest()


def run_digests(name: str) -> dict[str, str]:
    """Run case ``name``, write its run directory, hash the files' contents."""
    overrides, sections = CASES[name]
    result = simulate(make_config(*overrides, **sections))
    with tempfile.TemporaryDirectory() as tmp:
        out = write_run(result, Path(tmp) / name)
        summary = json.loads((out / "summary.json").read_text())
        summary.pop("wall_time_s")
        return {
            "requests": _frame_digest(pd.read_parquet(out / "requests.parquet")),
            "timeline": _frame_digest(pd.read_parquet(out / "timeline.parquet")),
            "summary": hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest(),
            "steps": summary["steps"],
        }


def regenerate() -> dict:
    """Recompute every case's digests and write the golden file."""
    golden = {name: run_digests(name) for name in CASES}
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n")
    return golden


@pytest.fixture(scope="module")
def golden() -> dict:
    if REGEN:
        return regenerate()
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_match_golden_digests(name: str, golden: dict) -> None:
    assert name in golden, f"{name} has no golden digest: regenerate (see module docstring)"
    assert run_digests(name) == golden[name]


def test_every_golden_case_still_exists(golden: dict) -> None:
    assert sorted(golden) == sorted(CASES)


if __name__ == "__main__":
    for case, digests in regenerate().items():
        print(f"{case:32s} steps={digests['steps']}")
    print(f"wrote {GOLDEN}")
