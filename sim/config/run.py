"""The run config: one YAML file describes one simulation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from sim.config.base import DTYPE_BYTES, Seconds, Strict, deep_merge, plausible
from sim.config.cluster import ClusterConfig, Group
from sim.config.errors import KeyedValueError, config_error
from sim.config.hardware import HardwareSpec
from sim.config.kv import KvConfig
from sim.config.model import ModelSpec
from sim.config.workload import WorkloadConfig


class EngineConfig(Strict):
    """Continuous-batching engine settings, named as vLLM names them."""

    max_num_seqs: int = Field(256, gt=0)
    max_batched_tokens: int = Field(8192, gt=0)
    chunked_prefill: bool = True
    block_tokens: int = Field(16, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    preemption: Literal["recompute", "swap"] = "recompute"
    max_model_len: int | None = Field(None, gt=0)
    kv_pool_blocks: int | None = Field(None, gt=0)
    layer_events: bool = False
    kv_heat: bool = False  # write kv_heat.parquet: per step, the blocks attention read
    kv_heat_interval_s: float = Field(0.0, ge=0)  # record a step at most this often (0 = all)
    check: bool = False  # verify invariants after every step and run (sim/observe/invariants.py)
    decode_runs: bool = True  # take steps that need no clock at once (sim/instance/runs.py)
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="GPUs one instance spans (vLLM's name); weights, KV heads and "
        "activations are split per GPU, collectives priced over `hardware.interconnect`",
    )
    pipeline_parallel_size: int = Field(
        1, ge=1, description="pipeline stages; only 1 (pipeline parallelism is not modelled)"
    )
    sampler_bytes_per_logit: float = Field(
        39.2,
        ge=0,
        le=100,
        description="bytes a logit (one sequence x one vocab entry) at the peak of the sampler's "
        "dummy run in vLLM's memory profile: 39.2 = the PyTorch top-k/top-p sort path (fit, "
        "PR #10511); ~14-16 for FlashInfer's or the Triton sampler (by tensor count); "
        "docs/cost-model.md, 'Activation peak'",
    )
    async_scheduling: bool = Field(
        False,
        description="schedule step n+1 while the GPU runs step n (vLLM's `--async-scheduling`; "
        "its default from v0.14): the runtime's host time (`hardware.efficiency.step_overhead`, "
        "`sequence_overhead`) hides under the previous step and the GPU idles "
        "`hardware.efficiency.async_step_gap` a step, plus the host time a step too short to "
        "hide it leaves; false: the GPU idles for all of it (vLLM V1 up to v0.13)",
    )
    frontend_latency: Annotated[Seconds, plausible("front-end latency")] = Field(
        0.0,
        description="time from a client sending a request to the scheduler seeing it (the "
        "serving front end: HTTP, chat template, hand-off to the engine), counted in its TTFT "
        "and latency; vLLM's API server: ~10 ms (`docs/model.md`); 0 = the engine's own TTFT",
    )
    frontend_token_latency: Annotated[Seconds, plausible("front-end time a token")] = Field(
        0.0,
        description="the front end's time per prompt token on top of `frontend_latency` "
        "(tokenization: ~2 us a token, `docs/model.md`)",
    )

    @field_validator("pipeline_parallel_size")
    @classmethod
    def _no_pipeline(cls, size: int) -> int:
        if size > 1:
            raise ValueError(
                f"pipeline parallelism is not modelled (a later issue): expected 1; use "
                f"engine.tensor_parallel_size to spread a model over {size} GPUs"
            )
        return size


FRONT_END_KEYS = frozenset({"frontend_latency", "frontend_token_latency"})


class Slo(Strict):
    """Latency targets a request must meet to count as goodput (both, when both are given)."""

    ttft: Seconds | None = None
    tpot: Seconds | None = None


class MetricsConfig(Strict):
    """Figures computed beyond the defaults: ``slo`` adds goodput and SLO attainment."""

    slo: Slo | None = None


class RunConfig(Strict):
    """A whole run: seed, model, hardware, workload, engine and KV settings."""

    seed: int = Field(0, ge=0)
    model: ModelSpec
    hardware: HardwareSpec
    workload: WorkloadConfig
    engine: EngineConfig = EngineConfig()
    kv: KvConfig = KvConfig()
    cluster: ClusterConfig | None = None
    metrics: MetricsConfig = MetricsConfig()

    @model_validator(mode="after")
    def _members_valid(self) -> RunConfig:
        if self.cluster is not None:
            members = self.members()  # each group's overrides validate here, at load
            if self.cluster.kv_pool is not None:
                _one_block_format(members)
                if not all(m.config.kv.prefix_caching for m in members):
                    raise KeyedValueError(
                        "cluster.kv_pool",
                        "the KV pool finds blocks by prefix hash: it needs kv.prefix_caching: "
                        "true on every instance",
                    )
            if self.cluster.disaggregation is not None:
                _one_kv_dtype(members)
        return self

    def members(self) -> list[Member]:
        """The cluster's instances in order (one, this run's, without a ``cluster`` key)."""
        cluster = self.cluster
        if cluster is None or cluster.groups is None:
            count = cluster.size if cluster is not None else 1
            plain = self.model_copy(update={"cluster": None})
            return [Member(i, "", plain) for i in range(count)]
        out: list[Member] = []
        for g, group in enumerate(cluster.groups):
            config = self._for_group(group, f"cluster.groups.{g}")
            out += [
                Member(len(out) + i, group.name, config, group.role) for i in range(group.count)
            ]
        return out

    def _for_group(self, group: Group, key: str) -> RunConfig:
        """This run with ``group``'s hardware, engine and kv laid over its own."""
        if clash := sorted(FRONT_END_KEYS & group.engine.keys()):
            raise KeyedValueError(
                f"{key}.engine.{clash[0]}",
                f"{group.engine[clash[0]]!r}: a cluster has one front end, which every request "
                f"crosses before the router: expected engine.{clash[0]} at the run's engine, "
                "not per group",
            )
        sections: dict[str, Any] = {"hardware": group.hardware or self.hardware}
        for name, over in (("engine", group.engine), ("kv", group.kv)):
            base = getattr(self, name).model_dump(exclude_unset=True)
            try:
                sections[name] = type(getattr(self, name)).model_validate(deep_merge(base, over))
            except ValidationError as error:
                message = config_error(type(getattr(self, name)), error, "").message
                raise ValueError(message.replace("key '", f"key '{key}.{name}.")) from None
        fields = {name: getattr(self, name) for name in ("seed", "model", "workload", "metrics")}
        return RunConfig.model_validate({**fields, **sections})

    @model_validator(mode="after")
    def _coherent_link_for_direct_read(self) -> RunConfig:
        if self.kv.direct_read and not self.hardware.link.coherent:
            raise KeyedValueError(
                "kv.direct_read",
                f"kv.direct_read needs a coherent host link (hardware.link.coherent: true, as "
                f"NVLink-C2C on gh200); {self.hardware.name!r} has {self.hardware.link.kind}",
            )
        return self

    @model_validator(mode="after")
    def _tensor_parallel_fits(self) -> RunConfig:
        from sim.config.parallel import check_tensor_parallel

        check_tensor_parallel(self.model, self.hardware, self.engine.tensor_parallel_size)
        return self

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs of one instance."""
        return self.engine.tensor_parallel_size

    @property
    def kv_dtype_bytes(self) -> float:
        """Bytes per KV element in HBM."""
        return DTYPE_BYTES[self.kv.dtype] if self.kv.dtype else self.model.act_bytes

    def tier_dtype_bytes(self, tier: str) -> float:
        """Bytes per KV element in ``hbm``, ``dram`` or ``ssd`` (lower tiers may compress)."""
        dram = DTYPE_BYTES[self.kv.dram_dtype] if self.kv.dram_dtype else self.kv_dtype_bytes
        if tier == "hbm":
            return self.kv_dtype_bytes
        if tier == "dram":
            return dram
        return DTYPE_BYTES[self.kv.ssd_dtype] if self.kv.ssd_dtype else dram

    def tier_capacity(self, tier: str) -> tuple[str, float]:
        """The key that sets KV's room in ``dram`` or ``ssd`` (``kv.dram_capacity`` where
        given, else ``hardware.dram.capacity``, per GPU: times ``tensor_parallel_size``) and
        its bytes."""
        own = getattr(self.kv, f"{tier}_capacity")
        if own is not None:
            return f"kv.{tier}_capacity", own
        capacity = getattr(self.hardware, tier).capacity
        if tier == "dram" and self.tensor_parallel_size > 1:  # each GPU's share of the host
            return "hardware.dram.capacity", capacity * self.tensor_parallel_size
        return f"hardware.{tier}.capacity", capacity

    def tier_block_bytes(self, tier: str) -> float:
        """Bytes of one KV block (``block_tokens`` tokens, all layers) in a tier."""
        per_token = self.model.kv_bytes_per_token(self.tier_dtype_bytes(tier))
        return self.engine.block_tokens * per_token

    @property
    def block_bytes(self) -> float:
        """Bytes of one KV block in HBM."""
        return self.tier_block_bytes("hbm")

    def copy_layout(self) -> str:
        """``hardware.link.copy_layout``, ``auto`` resolved as vLLM lays out its KV: in
        ``offload`` mode its offloading connector asks for cross-layer blocks (every layer's
        K and V of a block contiguous, ``prefer_cross_layer_blocks``, vllm#27743): ``block``;
        otherwise the FlashAttention paged layout, a tensor per layer and K/V: ``layer_kv``."""
        layout = self.hardware.link.copy_layout
        if layout != "auto":
            return layout
        return "block" if self.kv.mode == "offload" else "layer_kv"

    def copy_chunk_bytes(self) -> float:
        """Bytes of one contiguous chunk of a DRAM-tier KV block in a host copy, as
        :meth:`copy_layout` cuts it: the whole block, one per layer, or one per layer and
        K/V (MLA keeps one latent per layer: one chunk per layer)."""
        layout, model = self.copy_layout(), self.model
        pieces = 1 if layout == "block" else model.layers
        if layout == "layer_kv" and not model.mla:
            pieces *= 2
        return self.tier_block_bytes("dram") / pieces


@dataclass(frozen=True)
class Member:
    """One instance of a cluster: its index, its group's name and its own run config."""

    index: int
    group: str
    config: RunConfig
    role: str = "mixed"  # mixed | prefill | decode (a disaggregated cluster)


def _one_block_format(members: list[Member]) -> None:
    """A KV pool shares blocks by prefix hash: every instance must write the same blocks."""
    formats = {(m.config.engine.block_tokens, m.config.tier_block_bytes("dram")) for m in members}
    if len(formats) > 1:
        raise KeyedValueError(
            "kv_pool",
            "the instances' KV blocks differ (engine.block_tokens or the KV dtype), so they "
            f"cannot share a pool: {sorted(formats)}; expected one (block_tokens, bytes)",
        )


def _one_kv_dtype(members: list[Member]) -> None:
    """A disaggregated request's KV is sent as the prefill instance holds it and kept as the
    decode instance holds it: both must hold it in one dtype."""
    dtypes = {m.config.kv_dtype_bytes for m in members}
    if len(dtypes) > 1:
        raise KeyedValueError(
            "cluster.disaggregation",
            f"the instances hold KV in different dtypes ({sorted(dtypes)} bytes per element); "
            "expected one (the KV is sent as it is held: set kv.dtype alike)",
        )
