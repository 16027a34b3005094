"""Hardware profile schema: one GPU (or a CPU standing in), its host DRAM, link and SSD."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from sim.config.base import (
    Bandwidth,
    Bytes,
    FlopRate,
    PositiveBytes,
    Seconds,
    Strict,
    plausible,
)
from sim.config.errors import KeyedValueError

Rate = Annotated[FlopRate, plausible("compute rate")]
LinkBandwidth = Annotated[Bandwidth, plausible("host link bandwidth")]
StorageBandwidth = Annotated[Bandwidth, plausible("storage bandwidth")]
KernelSeconds = Annotated[Seconds, plausible("kernel latency")]
LinkKind = Literal["pcie-gen4", "pcie-gen5", "nvlink-c2c", "infinity-fabric", "memcpy"]
InterconnectKind = Literal[
    "nvlink3", "nvlink4", "nvlink5", "nvlink-bridge", "pcie-gen4", "pcie-gen5", "infinity-fabric"
]


class Hbm(Strict):
    """Device memory: capacity, peak bandwidth, and what the driver and runtime keep.

    ``capacity``: the total nvidia-smi reports; ``driver_reserve``: the part of it torch does
    not see (``capacity - torch.cuda.mem_get_info()[1]``); ``runtime_reserve``: memory outside
    torch's allocator inside vLLM's budget (its profiled ``non_torch_memory``: cuBLAS
    workspaces; docs/cost-model.md); ``runtime_reserve_tp``: what each GPU adds to it when
    ``engine.tensor_parallel_size`` > 1 (the TP group's NCCL communicators and vLLM's
    custom all-reduce buffers), one step whatever the degree.
    """

    capacity: Annotated[PositiveBytes, plausible("device memory capacity")]
    bandwidth: Annotated[Bandwidth, plausible("device memory bandwidth")]
    runtime_reserve: Annotated[Bytes, plausible("runtime reserve")] = 0.0
    runtime_reserve_tp: Annotated[Bytes, plausible("runtime reserve")] = 0.0
    driver_reserve: Annotated[Bytes, plausible("driver reserve")] = 0.0


class Compute(Strict):
    """Dense peak compute rates."""

    bf16_flops: Rate
    fp8_flops: Rate | None = None


class Dram(Strict):
    """Host memory available to this device.

    ``bandwidth`` is shared by the ``shared_by`` GPUs of one socket (or host): under tensor
    parallelism an instance's host-link copies together draw at most ``bandwidth`` per socket
    they span (``docs/tiering.md``).
    """

    capacity: Annotated[Bytes, plausible("host memory capacity")]
    bandwidth: Annotated[Bandwidth, plausible("host memory bandwidth")]
    shared_by: int = Field(1, ge=1, description="GPUs whose host copies share `bandwidth`")


CopyLayout = Literal["auto", "block", "layer", "layer_kv"]
Copier = Literal["ce", "sm"]
Direction = Literal["h2d", "d2h"]


class Link(Strict):
    """The host link, per direction: achievable bandwidth, per-transfer latency, chunk costs.

    A copy of chunks of ``s`` bytes gets ``1 / (1 + (h / s)^p)^(1/p)`` of the bandwidth,
    ``h = half_efficiency_bytes`` (0 = size-independent), ``p = chunk_blend`` (1: each chunk
    costs ``h / bandwidth`` on top of its bytes, ``s / (s + h)``; larger: the per-chunk cost
    and the bytes overlap more). ``copy_layout`` says how a KV block is cut into contiguous
    chunks (``auto``: as vLLM lays its KV out for the KV mode, :meth:`RunConfig.copy_layout`);
    ``load_overhead`` is the fixed cost of one request's prefix load.

    ``h2d_copier`` / ``d2h_copier`` say what moves a direction's KV bytes: ``ce``, the copy
    engines (one ``cudaMemcpyAsync`` per chunk: ``h2d``/``d2h`` and the chunk curve), or
    ``sm``, a kernel that reads or writes pinned host memory itself (LMCache's
    ``multi_layer_kv_transfer``): ``sm_h2d``/``sm_d2h`` (nvbandwidth's ``*_memcpy_sm``),
    no per-chunk cost.
    """

    kind: LinkKind
    h2d: LinkBandwidth
    d2h: LinkBandwidth
    latency: Annotated[Seconds, plausible("transfer latency")] = 0.0
    coherent: bool = False
    half_efficiency_bytes: Annotated[Bytes, plausible("half-efficiency copy size")] = 0.0
    shared_by: int = Field(
        1,
        ge=1,
        description="GPUs behind one host link (1: each GPU has its own x16 port; 2: "
        "pairs share a PCIe switch's uplink); GPU g uses link g // shared_by",
    )
    chunk_blend: float = Field(1.0, ge=1, le=8)
    copy_layout: CopyLayout = "block"
    load_overhead: Annotated[Seconds, plausible("load overhead")] = 0.0
    h2d_copier: Copier = "ce"
    d2h_copier: Copier = "ce"
    sm_h2d: LinkBandwidth | None = None
    sm_d2h: LinkBandwidth | None = None

    @model_validator(mode="after")
    def _sm_copies_need_their_bandwidth(self) -> Link:
        for direction, test in (("h2d", "host_to_device"), ("d2h", "device_to_host")):
            copier, key = f"{direction}_copier", f"sm_{direction}"
            if getattr(self, copier) == "sm" and getattr(self, key) is None:
                raise KeyedValueError(
                    copier,
                    f"'sm' (a copy kernel) needs {key}, which is not set: expected {key}, "
                    f"the host's nvbandwidth {test}_memcpy_sm figure, or {copier}: ce",
                )
        return self

    def copy_path(self, direction: Direction) -> tuple[float, float, float]:
        """(bandwidth, half_efficiency_bytes, chunk_blend) of ``direction``'s KV copies, by
        its copier: the copy engines' curve, or a copy kernel's flat bandwidth."""
        if getattr(self, f"{direction}_copier") == "sm":
            return getattr(self, f"sm_{direction}"), 0.0, 1.0
        return getattr(self, direction), self.half_efficiency_bytes, self.chunk_blend


class AllReduceKernel(Strict):
    """One all-reduce kernel: its fixed time and the rate at which it moves the message."""

    latency: Annotated[Seconds, plausible("collective latency")]
    bandwidth: Annotated[Bandwidth, plausible("GPU interconnect bandwidth")]


CUSTOM_WORKERS = (2, 4, 6, 8)  # the GPU counts vLLM's custom all-reduce runs on


class CustomAllReduce(Strict):
    """vLLM's own all-reduce for small messages over NVLink (``csrc/custom_all_reduce.cuh``),
    which it runs instead of NCCL on 2, 4, 6 or 8 GPUs for messages under ``max_bytes[N]``:
    the one-stage kernel (each GPU reads every peer's buffer: ``latency + (N-1)·M /
    bandwidth``) or the two-stage one (reduce-scatter, then all-gather: ``latency +
    2(N-1)/N·M / bandwidth``), picked by size as vLLM picks (docs/cost-model.md)."""

    max_bytes: dict[int, Annotated[Bytes, plausible("all-reduce message size")]]
    one_stage: AllReduceKernel
    two_stage: AllReduceKernel

    @field_validator("max_bytes")
    @classmethod
    def _known_counts(cls, limits: dict[int, float]) -> dict[int, float]:
        if bad := sorted(set(limits) - set(CUSTOM_WORKERS)):
            raise ValueError(
                f"GPU count {bad[0]}: vLLM's custom all-reduce runs on 2, 4, 6 or 8 GPUs only"
            )
        return limits


class Interconnect(Strict):
    """The GPU-to-GPU interconnect that tensor-parallel collectives run over.

    One NCCL all-reduce of ``M`` bytes over ``N`` GPUs takes ``latency +
    (2(N-1)/N)^workers_exponent · (M + half_efficiency_bytes) / (bandwidth · efficiency)``
    (``docs/cost-model.md``); ``latency``, ``efficiency``, ``half_efficiency_bytes`` and
    ``workers_exponent`` are fitted by ``kvsim calibrate --comm``. ``custom_allreduce`` prices
    the messages vLLM's own kernel takes instead (none: every all-reduce is NCCL's).
    """

    kind: InterconnectKind
    bandwidth: Annotated[Bandwidth, plausible("GPU interconnect bandwidth")]
    latency: Annotated[Seconds, plausible("collective latency")] = 0.0
    efficiency: float = Field(1.0, gt=0, le=1)
    half_efficiency_bytes: Annotated[Bytes, plausible("half-efficiency copy size")] = 0.0
    workers_exponent: float = Field(1.0, ge=0, le=2)
    custom_allreduce: CustomAllReduce | None = None


class Nic(Strict):
    """The network interface of one GPU (a DGX node has one per GPU), per direction: what a
    cluster's KV pool fetches and prefill-to-decode transfers cross."""

    bandwidth: Annotated[Bandwidth, plausible("NIC bandwidth")]
    latency: Annotated[Seconds, plausible("transfer latency")] = 0.0


class Ssd(Strict):
    """Optional NVMe tier (capacity 0 = none)."""

    capacity: Annotated[Bytes, plausible("storage capacity")] = 0.0
    read: StorageBandwidth = 7e9
    write: StorageBandwidth = 4e9
    latency: Annotated[Seconds, plausible("storage latency")] = 80e-6


class Kernel(Strict):
    """A calibrated memory-bound kernel: a per-row floor, then streaming at ``memory`` x peak.

    Time over T token rows of r bytes: ``blend(latency + r / row_bandwidth, T·r / (B·memory))``
    (``docs/cost-model.md``); no ``row_bandwidth`` means no per-row term, no ``blend`` a hard max.
    """

    latency: KernelSeconds
    memory: float = Field(gt=0, le=1)
    row_bandwidth: Annotated[Bandwidth, plausible("kernel row bandwidth")] | None = None
    blend: float | None = Field(None, ge=1)


class Kernels(Strict):
    """Calibrated elementwise kernels (``kvsim calibrate``); one left out costs nothing extra."""

    norm: Kernel | None = None
    rope: Kernel | None = None
    activation: Kernel | None = None
    residual_add: Kernel | None = None
    embedding: Kernel | None = None


class Efficiency(Strict):
    """Achieved fractions of peak and fixed overheads: the cost model's tunable parameters.

    ``gemm_memory``, ``gemm_latency``, ``gemm_blend``, ``gemm_row_block`` (rows per pass over
    the weights, with at most ``gemm_max_passes`` passes), ``kernels`` and
    ``attention_latency`` (fixed time of one attention kernel call, per layer) are optional
    calibrated refinements; without them a GEMM is the hard roofline at ``gemm`` and ``hbm``
    efficiency, reading its weights once.

    The overheads are the serving runtime's host time (vLLM V1 in the GPU profiles): a fixed
    ``step_overhead`` per engine step and ``sequence_overhead`` per sequence in the step,
    with the GPU idle; under ``engine.async_scheduling`` the GPU instead idles
    ``async_step_gap`` a step, plus whatever host time its step does not hide.
    Attention: ``attention`` and ``attention_extra_keys`` price the prefill (flash) kernel,
    ``decode_attention`` and ``decode_attention_latency`` the decode (paged) kernel
    (``docs/cost-model.md``). The routed experts run as one fused-MoE kernel call, not a dense
    GEMM per expert: each expert GEMM one roofline over the touched experts, its FLOPs on the
    rows padded to the kernel's tile height, no per-GEMM latency. ``moe_gemm`` scales that
    roofline's compute rate (the GEMM rate), ``moe_gemm_memory`` its weight-streaming rate
    (the GEMM bandwidth), both 1 by default; ``moe_row_time`` adds to each expert GEMM's
    compute a time per padded routed row (the gathered rows' loads and the scattered,
    weighted results, which the tile's math does not hide), 0 by default; ``moe_latency`` is
    the call's fixed time per MoE layer (routing top-k, token sort, the top-k sum), 0 by
    default.
    """

    gemm: float = Field(0.7, gt=0, le=1)
    attention: float = Field(0.5, gt=0, le=1)
    hbm: float = Field(0.85, gt=0, le=1)
    step_overhead: Annotated[Seconds, plausible("step overhead")] = 0.0
    layer_overhead: KernelSeconds = 0.0
    gemm_memory: float | None = Field(None, gt=0, le=1)
    gemm_latency: KernelSeconds = 0.0
    gemm_blend: float | None = Field(None, ge=1)
    gemm_row_block: int | None = Field(None, ge=1, le=65536)
    gemm_max_passes: int | None = Field(None, ge=2, le=65536)
    kernels: Kernels | None = None
    attention_latency: KernelSeconds = 0.0
    attention_extra_keys: int = Field(0, ge=0, le=100_000)
    decode_attention: float | None = Field(None, gt=0, le=1)
    decode_attention_latency: KernelSeconds | None = None
    moe_gemm: float = Field(1.0, gt=0, le=10)
    moe_gemm_memory: float = Field(1.0, gt=0, le=10)
    moe_latency: KernelSeconds = 0.0
    moe_row_time: KernelSeconds = 0.0
    sequence_overhead: Annotated[Seconds, plausible("sequence overhead")] = 0.0
    async_step_gap: Annotated[Seconds, plausible("asynchronous step gap")] = 0.0

    @model_validator(mode="after")
    def _passes_need_a_row_block(self) -> Efficiency:
        passes = self.gemm_max_passes
        if passes is not None and self.gemm_row_block is None:
            raise KeyedValueError(
                "gemm_max_passes",
                f"{passes} limits the passes over a GEMM's weights, but gemm_row_block is "
                "null (one pass): expected gemm_row_block too, or gemm_max_passes: null",
            )
        return self


class HardwareSpec(Strict):
    """A hardware profile (``hardware_profiles/NAME.yaml``).

    ``cost_model``: ``roofline`` (the efficiency section's equations) or ``table``
    (interpolation in the measured operator times of ``cost_table``, ``sim/cost/tables.py``).
    """

    name: str
    description: str = ""
    hbm: Hbm
    compute: Compute
    dram: Dram
    link: Link
    ssd: Ssd = Ssd()
    efficiency: Efficiency = Efficiency()
    gpus_per_node: int = Field(1, ge=1, description="GPUs of one node: the most one instance spans")
    interconnect: Interconnect | None = Field(
        None, description="GPU interconnect for tensor parallelism (none: one GPU per instance)"
    )
    nic: Nic | None = Field(
        None,
        description="each GPU's NIC, for clusters: an instance of N GPUs gets N times its "
        "bandwidth (absent, or `cluster.network` given: `cluster.network`)",
    )
    cost_table: str | None = Field(
        None,
        min_length=1,
        description="measured operator times for `cost_model: table`: a long-format CSV/parquet "
        "from `kvsim calibrate --device`, or a folder of Vidur `mlp.csv` tables (absolute, "
        "else under the working directory, else under `$KVSIM_CALIBRATION`)",
    )
    cost_model: Literal["roofline", "table"] = Field(
        "roofline",
        description="`roofline`: the efficiency section's equations; `table`: interpolate "
        "`cost_table`'s measured operator times (docs/cost-model.md)",
    )

    @field_validator("cost_table")
    @classmethod
    def _table_exists(cls, path: str | None) -> str | None:
        if path is not None:
            from sim.config.paths import resolve_table_path

            resolve_table_path(path)
        return path

    @field_validator("cost_model")
    @classmethod
    def _table_for_table_model(cls, kind: str, info: ValidationInfo) -> str:
        if kind == "table" and info.data.get("cost_table") is None and "cost_table" in info.data:
            raise ValueError(
                "cost_model: table needs cost_table: the measured operator times to "
                "interpolate (a long-format CSV/parquet from 'kvsim calibrate --device', or a "
                "folder of Vidur mlp.csv tables)"
            )
        return kind
