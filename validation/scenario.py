"""The workloads ``kvsim calibrate`` and ``kvsim validate`` run on the mini-engine.

One model and one engine setting per device; calibration and validation use different
seeds and request mixes, so the step overhead fitted on one is checked on the other.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from sim.config.hardware import HardwareSpec
from sim.config.loader import build_config
from sim.config.run import RunConfig

# Llama-style, scaled down for a CPU (issue 7: "e.g. 4 layers"); GQA 2:1, fp32. Its weights
# (~64 MB read per step) exceed a server CPU's last-level cache, as a GPU model's exceed L2,
# so the cold-cache microbenchmarks time what the engine's steps do.
MINI_CPU: dict[str, Any] = {
    "name": "mini-llama-cpu", "layers": 4, "hidden": 512, "heads": 8, "kv_heads": 4,
    "head_dim": 64, "intermediate": 1408, "vocab": 8192, "dtype": "fp32", "gated_mlp": True,
}  # fmt: skip
# on a GPU: Llama-3-8B's layer shapes, 4 layers, bf16
MINI_CUDA: dict[str, Any] = {
    "name": "mini-llama-cuda", "layers": 4, "hidden": 4096, "heads": 32, "kv_heads": 8,
    "head_dim": 128, "intermediate": 14336, "vocab": 128256, "dtype": "bf16", "gated_mlp": True,
}  # fmt: skip
ENGINE = {"max_num_seqs": 8, "max_batched_tokens": 256, "block_tokens": 16}
ENGINE_CUDA = {"max_num_seqs": 32, "max_batched_tokens": 2048, "block_tokens": 16}
MODES = ("hbm", "offload", "dram_centric")
SEEDS = {"calibrate": 101, "validate": 202}


def mini_model(device: str) -> dict[str, Any]:
    """The mini-engine's model for ``device``."""
    return copy.deepcopy(MINI_CUDA if device.startswith("cuda") else MINI_CPU)


def workload(purpose: str, device: str, quick: bool) -> dict[str, Any]:
    """Closed batches (all requests at t = 0): prefill, decode and mixed steps all occur."""
    cuda = device.startswith("cuda")
    count = {"calibrate": 8, "validate": 12}[purpose] * (1 if quick else 2) * (4 if cuda else 1)
    prompt = (256, 1536) if cuda else (32, 192)
    return {
        "kind": "synthetic",
        "num_requests": count,
        "arrival": {"kind": "all_at_once"},
        "prompt_tokens": {"kind": "uniform", "min": prompt[0], "max": prompt[1]},
        "output_tokens": {"kind": "uniform", "min": 8, "max": 32 if purpose == "validate" else 24},
        "shared_prefix_tokens": prompt[0],  # a shared system prompt: offload's prefix hits
    }


def scenario_config(
    hardware: HardwareSpec, purpose: str, device: str, mode: str, quick: bool
) -> RunConfig:
    """The run config both the mini-engine and the simulator run."""
    engine = dict(ENGINE_CUDA if device.startswith("cuda") else ENGINE)
    # hbm and offload: a pool small enough that preemption can happen; dram_centric: the
    # device cache holds every block, so the only traffic is the write-through of new KV
    engine["kv_pool_blocks"] = 4096 if mode == "dram_centric" else 64
    kv: dict[str, Any] = {"mode": mode, "prefix_caching": False, "layerwise": False}
    if mode == "offload":  # a prefix cache written through to a host pool of 4x the device's
        kv |= {"prefix_caching": True, "ssd_capacity": 0}
    data = {
        "seed": SEEDS[purpose],
        "model": mini_model(device),
        "hardware": hardware.model_dump(mode="json"),
        "workload": workload(purpose, device, quick),
        "engine": engine,
        "kv": kv,
    }
    config = build_config(data, f"<{purpose} scenario>")
    if mode == "offload":
        host = 4 * engine["kv_pool_blocks"] * config.tier_block_bytes("dram")
        config = build_config(data | {"kv": kv | {"dram_capacity": host}}, f"<{purpose} scenario>")
    return config


def pin_threads(device: str) -> None:
    """One CPU thread: steadier timings, and the other core stays free for the test runner."""
    if not device.startswith("cuda"):
        torch.set_num_threads(1)
