"""Shared fixtures: small configs built from dicts, and the shared traces folder."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from sim.config import RunConfig, build_config

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "seed": 0,
    "model": "llama-3-8b",
    "hardware": "h100-sxm",
    "workload": {
        "kind": "synthetic",
        "num_requests": 20,
        "arrival": {"kind": "poisson", "rate": 4.0},
        "prompt_tokens": 512,
        "output_tokens": 64,
    },
    "engine": {"max_num_seqs": 64, "max_batched_tokens": 4096},
    "kv": {"mode": "hbm"},
}


def make_config(*overrides: str, **sections: dict) -> RunConfig:
    """The base config with whole sections replaced and ``--set``-style overrides."""
    data = copy.deepcopy(BASE)
    for name, value in sections.items():
        data[name] = value
    return build_config(data, "<test>", overrides)


@pytest.fixture
def config_factory():
    """Build a small run config: ``config_factory('engine.block_tokens=32', workload={...})``."""
    return make_config


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The shared traces folder ($KVSIM_TRACES, else ../shared/traces); skip if absent."""
    path = Path(os.environ.get("KVSIM_TRACES", REPO.parent / "shared" / "traces"))
    if not path.is_dir():
        pytest.skip(f"shared traces not found at {path} (set KVSIM_TRACES)")
    return path
