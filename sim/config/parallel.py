"""Tensor parallelism as data: which configs may split, and the per-GPU shard of a model.

An instance of ``tensor_parallel_size`` N spans N GPUs; each holds, as vLLM lays it out,
column-parallel QKV and up(+gate) projections and row-parallel output and down projections
(weights / N), a vocab-parallel embedding and LM head (``ceil(vocab / N)`` rows), replicated
norms, and ``ceil(kv_heads / N)`` KV heads (replicated when N > kv_heads). The shard is a
:class:`ModelSpec` with those per-GPU widths, so every size the cost model and the HBM plan
derive from it (weights, GEMM shapes, attention heads, KV bytes, activations) is one GPU's.
"""

from __future__ import annotations

import math

from sim.config.errors import KeyedValueError
from sim.config.hardware import HardwareSpec
from sim.config.model import ModelSpec

KEY = "engine.tensor_parallel_size"


def check_tensor_parallel(model: ModelSpec, hw: HardwareSpec, n: int) -> None:
    """Refuse a tensor-parallel degree this model or hardware cannot take (KeyedValueError)."""
    if n == 1:
        return
    if hw.interconnect is None:
        raise KeyedValueError(
            KEY, f"tensor_parallel_size {n} needs a GPU interconnect, and hardware "
            f"{hw.name!r} has none (hardware.interconnect); expected 1 or a profile with one",
        )  # fmt: skip
    if n > hw.gpus_per_node:
        raise KeyedValueError(
            KEY, f"tensor_parallel_size {n} exceeds hardware.gpus_per_node {hw.gpus_per_node} "
            f"of {hw.name!r}: an instance spans one node; expected at most {hw.gpus_per_node}",
        )  # fmt: skip
    if model.mla is not None:
        raise KeyedValueError(
            KEY, f"model {model.name!r} uses multi-head latent attention, whose tensor-parallel "
            "layout (a replicated latent KV) is not modelled; expected tensor_parallel_size 1",
        )  # fmt: skip
    kv = model.kv_heads
    if (kv % n) if n <= kv else (n % kv):
        raise KeyedValueError(
            KEY, f"tensor_parallel_size {n} must divide model {model.name!r}'s kv_heads ({kv}) "
            "or be a multiple of them (replicated KV heads), as vLLM requires",
        )  # fmt: skip
    widths = {"heads": model.heads, "intermediate": model.intermediate}
    if model.moe is not None:
        widths["moe.expert_intermediate"] = model.moe.expert_intermediate
    for name, width in widths.items():
        if width % n:
            raise KeyedValueError(
                KEY, f"tensor_parallel_size {n} does not divide model {model.name!r}'s "
                f"{name} ({width}), as vLLM requires; expected a divisor of {width}",
            )  # fmt: skip


def kv_heads_per_gpu(model: ModelSpec, n: int) -> int:
    """KV heads each GPU holds: ``ceil(kv_heads / n)`` (replicated when n > kv_heads)."""
    return math.ceil(model.kv_heads / n)


def kv_share(model: ModelSpec, n: int) -> float:
    """The fraction of a token's KV bytes one GPU holds (and moves over its host link)."""
    return 1.0 if n == 1 else kv_heads_per_gpu(model, n) / model.kv_heads


def shard_model(model: ModelSpec, n: int) -> ModelSpec:
    """One GPU's part of ``model`` split over ``n`` GPUs (``model`` itself for n = 1)."""
    if n == 1:
        return model
    fields = model.model_dump()
    fields.update(
        name=f"{model.name}/tp{n}",
        heads=model.heads // n,
        kv_heads=kv_heads_per_gpu(model, n),
        intermediate=model.intermediate // n,
        vocab=math.ceil(model.vocab / n),
        params=None,  # the declared count is the whole model's
    )
    if model.moe is not None:
        fields["moe"]["expert_intermediate"] = model.moe.expert_intermediate // n
    return ModelSpec.model_validate(fields)
