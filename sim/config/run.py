"""The run config: one YAML file describes one simulation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from sim.config.base import DTYPE_BYTES, Strict
from sim.config.hardware import HardwareSpec
from sim.config.model import Dtype, ModelSpec
from sim.config.workload import WorkloadConfig

KV_MODES = ("hbm",)


class EngineConfig(Strict):
    """Continuous-batching engine settings, named as vLLM names them."""

    max_num_seqs: int = Field(256, gt=0)
    max_batched_tokens: int = Field(8192, gt=0)
    chunked_prefill: bool = True
    block_tokens: int = Field(16, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    preemption: Literal["recompute"] = "recompute"
    max_model_len: int | None = Field(None, gt=0)


class KvConfig(Strict):
    """Where KV lives. ``hbm``: PagedAttention, a static pool in HBM."""

    mode: str = "hbm"
    dtype: Dtype | None = None

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, mode: str) -> str:
        if mode not in KV_MODES:
            raise ValueError(
                f"unknown KV mode {mode!r}; the modes that exist: {', '.join(KV_MODES)}"
            )
        return mode


class RunConfig(Strict):
    """A whole run: seed, model, hardware, workload, engine and KV settings."""

    seed: int = Field(0, ge=0)
    model: ModelSpec
    hardware: HardwareSpec
    workload: WorkloadConfig
    engine: EngineConfig = EngineConfig()
    kv: KvConfig = KvConfig()

    @property
    def kv_dtype_bytes(self) -> float:
        """Bytes per KV element in HBM."""
        return DTYPE_BYTES[self.kv.dtype] if self.kv.dtype else self.model.dtype_bytes

    @property
    def block_bytes(self) -> float:
        """Bytes of one KV block (``block_tokens`` tokens, all layers) in HBM."""
        return self.engine.block_tokens * self.model.kv_bytes_per_token(self.kv_dtype_bytes)
