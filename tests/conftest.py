"""Shared fixtures: small configs built from dicts, cost-model parameters and a tiny model,
and the shared traces folder."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pandas as pd
import pytest

from sim.config import ModelSpec, RunConfig, build_config
from sim.cost.roofline import CostParams

REPO = Path(__file__).resolve().parents[1]

# NOTE: BASE keeps the HBM carving its pool-pressure tests were sized for (a 2 GiB reserve, no
# driver reserve, no start-up check of the model's 8192-token context); the memory plan as
# vLLM computes it is tested in tests/test_hbm_plan.py
BASE = {
    "seed": 0,
    "model": {"profile": "llama-3-8b", "context_length": None},
    "hardware": {"profile": "h100-sxm", "hbm": {"runtime_reserve": "2GiB", "driver_reserve": 0}},
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


def synthetic(n: int, prompt, output, rate: float = 8.0, shared: int = 0) -> dict:
    """A synthetic workload section: ``n`` Poisson requests of these lengths."""
    return {
        "kind": "synthetic",
        "num_requests": n,
        "arrival": {"kind": "poisson", "rate": rate},
        "prompt_tokens": prompt,
        "output_tokens": output,
        "shared_prefix_tokens": shared,
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


@pytest.fixture
def cost_params() -> CostParams:
    """Round-number cost parameters: 1000 TFLOP/s, 2 TB/s; GEMMs at 500 TFLOP/s, attention at
    250 TFLOP/s, memory at 1 TB/s; 1 ms per step and 10 us per layer of overhead."""
    return CostParams(
        peak_flops=1000e12,
        hbm_bandwidth=2e12,
        gemm_efficiency=0.5,
        attention_efficiency=0.25,
        hbm_efficiency=0.5,
        step_overhead_s=1e-3,
        layer_overhead_s=1e-5,
    )


@pytest.fixture
def tiny_model() -> ModelSpec:
    """A two-layer bf16 model: hidden 1024, 8 heads / 2 KV heads of 128, FFN 4096."""
    return ModelSpec(
        name="tiny",
        layers=2,
        hidden=1024,
        heads=8,
        kv_heads=2,
        head_dim=128,
        intermediate=4096,
        vocab=32000,
        dtype="bf16",
    )


def hbm_parts(timeline: pd.DataFrame) -> pd.Series:
    """Per step: weights + reserve + activations + KV + staging, the HBM a step holds."""
    t = timeline
    return (
        t.hbm_weights_bytes + t.hbm_reserve_bytes + t.hbm_activation_bytes + t.hbm_kv_bytes
        + t.hbm_staging_bytes
    )  # fmt: skip
