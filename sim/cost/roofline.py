"""Time and activation memory of one engine step: a roofline per operator.

Every parameter lives in :class:`CostParams`, built from a hardware profile's figures and
efficiency factors (or from a calibrated profile). :func:`sim.cost.cost_model_for` gives
a run's cost model: this roofline, or (``hardware.cost_model: table``) interpolation in
measured tables (``sim.cost.tables``). Equations: ``docs/cost-model.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from sim.config.hardware import HardwareSpec, Kernel
from sim.config.model import ModelSpec

if TYPE_CHECKING:  # built by the factory only under tensor parallelism
    from sim.cost.collectives import Collectives

Duration = float | np.ndarray  # seconds: of one step, or of each of several steps

# The sampler's dummy run of the memory profile: bytes per logit (one sequence x one vocab
# entry) at its peak; the default of engine.sampler_bytes_per_logit (PyTorch's sort path).
# fit: vLLM PR #10511's Llama-3-8B profile on an H100 (max_num_seqs 256, 8192 batched
# tokens): "PyTorch activation peak memory 1.26GiB" at TP 1 and at TP 2 alike, so the
# unsharded sampler sets it (the forward pass peaks at 0.78 GiB at TP 1): (1.26 GiB -
# 8192 x 4096 x 2 B of hidden states) / (256 x 128256) = 39.2 B: fp32 logits, probabilities
# and log-probabilities, top-p/top-k's sort (fp32 values, int64 indices), the bf16 logits
SAMPLER_BYTES_PER_LOGIT = 39.2
FP8_WIDTH = 1.0  # bytes per fp8 weight
# elementwise kernels of one layer and how often each runs (Vidur's per-layer convention:
# two norms, one rope, one residual add; the activation runs once per MLP, dense or MoE, and
# the embedding once per step)
KERNELS_PER_LAYER = {"norm": 2, "rope": 1, "residual_add": 1}
# vLLM's Triton fused_moe tile height (BLOCK_SIZE_M): the smallest and the largest its tuned
# configs use (E=128,N=768 on H100 and H200, SGLang's E=128,N=768 A800 file, E=8,N=7168 on
# H100: docs/cost-model.md, "Mixture of experts")
MOE_BLOCK_ROWS = (16, 128)


def blend(a: float, b: float, p: float) -> float:
    """Soft maximum ``(a^p + b^p)^(1/p)``: ``max(a, b)`` for ``p = inf``, ``a + b`` for 1."""
    if math.isinf(p):
        return max(a, b)
    top = max(a, b)
    if top <= 0.0:
        return 0.0
    return top * ((a / top) ** p + (b / top) ** p) ** (1.0 / p)


@dataclass(frozen=True)
class KernelParams:
    """A calibrated memory-bound kernel (norm, rope, activation, residual add, embedding).

    Over ``rows`` token rows of ``row_bytes`` each (read + written), it takes
    ``blend(latency + row_bytes / row_bandwidth, rows * row_bytes / (B * memory), blend)``:
    a floor set by one row's work, then streaming at a fraction of peak bandwidth.
    """

    latency_s: float
    memory_efficiency: float
    row_bandwidth: float = math.inf
    blend: float = math.inf

    @classmethod
    def from_config(cls, kernel: Kernel | None) -> KernelParams | None:
        """The parameters of one ``efficiency.kernels`` entry (None stays None)."""
        if kernel is None:
            return None
        return cls(
            latency_s=kernel.latency,
            memory_efficiency=kernel.memory,
            row_bandwidth=kernel.row_bandwidth or math.inf,
            blend=kernel.blend or math.inf,
        )


@dataclass(frozen=True)
class KernelSet:
    """Calibrated elementwise kernels; a missing one costs nothing beyond ``layer_overhead``."""

    norm: KernelParams | None = None
    rope: KernelParams | None = None
    activation: KernelParams | None = None
    residual_add: KernelParams | None = None
    embedding: KernelParams | None = None


@dataclass(frozen=True)
class CostParams:
    """The cost model's parameters, in one place (SI units).

    The fields after ``layer_overhead_s`` are calibrated refinements; their defaults give
    the plain roofline (hard max, no GEMM latency, no separate elementwise kernels).
    """

    peak_flops: float
    hbm_bandwidth: float
    gemm_efficiency: float
    attention_efficiency: float
    hbm_efficiency: float
    step_overhead_s: float
    layer_overhead_s: float
    gemm_memory_efficiency: float | None = None
    gemm_latency_s: float = 0.0
    gemm_blend: float = math.inf
    kernels: KernelSet | None = None
    attention_latency_s: float = 0.0
    attention_extra_keys: int = 0
    decode_attention_efficiency: float | None = None
    decode_attention_latency_s: float | None = None
    sequence_overhead_s: float = 0.0
    async_scheduling: bool = False  # engine.async_scheduling
    async_step_gap_s: float = 0.0  # efficiency.async_step_gap
    fp8_flops: float | None = None
    gemm_row_block: int | None = None
    gemm_max_passes: int | None = None
    moe_gemm_efficiency: float = 1.0
    moe_latency_s: float = 0.0
    moe_memory_efficiency: float = 1.0
    moe_row_s: float = 0.0  # efficiency.moe_row_time
    sampler_bytes_per_logit: float = SAMPLER_BYTES_PER_LOGIT  # engine.sampler_bytes_per_logit

    @classmethod
    def from_hardware(cls, hw: HardwareSpec) -> CostParams:
        """Parameters from a hardware profile's peak figures and efficiency section."""
        eff = hw.efficiency
        kernels = None
        if eff.kernels is not None:
            kernels = KernelSet(**{name: KernelParams.from_config(k) for name, k in eff.kernels})
        return cls(
            peak_flops=hw.compute.bf16_flops,
            hbm_bandwidth=hw.hbm.bandwidth,
            gemm_efficiency=eff.gemm,
            attention_efficiency=eff.attention,
            hbm_efficiency=eff.hbm,
            step_overhead_s=eff.step_overhead,
            layer_overhead_s=eff.layer_overhead,
            gemm_memory_efficiency=eff.gemm_memory,
            gemm_latency_s=eff.gemm_latency,
            gemm_blend=eff.gemm_blend or math.inf,
            kernels=kernels,
            attention_latency_s=eff.attention_latency,
            attention_extra_keys=eff.attention_extra_keys,
            decode_attention_efficiency=eff.decode_attention,
            decode_attention_latency_s=eff.decode_attention_latency,
            sequence_overhead_s=eff.sequence_overhead,
            async_step_gap_s=eff.async_step_gap,
            fp8_flops=hw.compute.fp8_flops,
            gemm_row_block=eff.gemm_row_block,
            gemm_max_passes=eff.gemm_max_passes,
            moe_gemm_efficiency=eff.moe_gemm,
            moe_latency_s=eff.moe_latency,
            moe_memory_efficiency=eff.moe_gemm_memory,
            moe_row_s=eff.moe_row_time,
        )

    @property
    def gemm_flops(self) -> float:
        """Achieved GEMM FLOP/s."""
        return self.peak_flops * self.gemm_efficiency

    @property
    def gemm_fp8_flops(self) -> float:
        """Achieved FLOP/s of a GEMM whose weights are fp8: ``compute.fp8_flops`` at the bf16
        fit's fraction (``efficiency.gemm``; docs/cost-model.md), else (no fp8 tensor cores:
        weight-only fp8, dequantised to bf16) the bf16 rate."""
        if self.fp8_flops is None:
            return self.gemm_flops
        return self.fp8_flops * self.gemm_efficiency

    @property
    def gemm_bandwidth(self) -> float:
        """Achieved HBM bytes/s of a weight-streaming GEMM."""
        if self.gemm_memory_efficiency is None:
            return self.memory_bandwidth
        return self.hbm_bandwidth * self.gemm_memory_efficiency

    @property
    def attention_flops(self) -> float:
        """Achieved attention FLOP/s."""
        return self.peak_flops * self.attention_efficiency

    @property
    def memory_bandwidth(self) -> float:
        """Achieved HBM bytes/s."""
        return self.hbm_bandwidth * self.hbm_efficiency

    @property
    def decode_bandwidth(self) -> float:
        """Achieved HBM bytes/s of the decode attention kernel (its KV reads)."""
        if self.decode_attention_efficiency is None:
            return self.memory_bandwidth
        return self.hbm_bandwidth * self.decode_attention_efficiency

    @property
    def decode_latency_s(self) -> float:
        """Fixed time of one decode attention call, one layer."""
        if self.decode_attention_latency_s is None:
            return self.attention_latency_s
        return self.decode_attention_latency_s


def gemm_seconds(
    p: CostParams, tokens: float, fan_in: float, fan_out: float, dtype_bytes: float,
    act_bytes: float | None = None,
) -> float:  # fmt: skip
    """Roofline time of a (tokens x fan_in) @ (fan_in x fan_out) GEMM whose weights have
    ``dtype_bytes`` per element and activations ``act_bytes`` (the same unless given).

    fp8 weights (1 byte under 2-byte activations) run at :attr:`CostParams.gemm_fp8_flops`.
    Calibrated profiles add a fixed latency and soften the roofline's corner:
    ``latency + blend(compute, memory, p)``; the defaults give ``max(compute, memory)``.
    """
    return p.gemm_latency_s + gemm_work_seconds(p, tokens, fan_in, fan_out, dtype_bytes, act_bytes)


def gemm_work_seconds(
    p: CostParams, rows: float, fan_in: float, fan_out: float, dtype_bytes: float,
    act_bytes: float | None = None,
) -> float:  # fmt: skip
    """The roofline part of :func:`gemm_seconds` (its fixed latency left out):
    ``blend(compute, memory)`` of one GEMM of ``fan_in x fan_out`` weights over ``rows`` rows."""
    act = dtype_bytes if act_bytes is None else act_bytes
    compute, memory = gemm_parts(p, rows, rows, fan_in, fan_out, dtype_bytes, act)
    return blend(compute, memory, p.gemm_blend)  # (the hard max at p = inf)


def gemm_parts(
    p: CostParams, flop_rows: float, rows: float, fan_in: float, fan_out: float,
    dtype_bytes: float, act_bytes: float, copies: float = 1.0,
) -> tuple[float, float]:  # fmt: skip
    """(compute, memory) seconds of ``copies`` GEMMs of ``fan_in x fan_out`` weights that share
    ``rows`` rows (one GEMM, or a fused-MoE call's touched experts): ``flop_rows`` rows' FLOPs
    (``rows``, or the MoE kernel's padded rows) at the GEMM rate (fp8 weights under wider
    activations at the fp8 rate); every copy's weights (read once, or per row block on a CPU)
    and the rows' activations at the weight-streaming bandwidth."""
    flops = 2.0 * flop_rows * fan_in * fan_out
    weights = fan_in * fan_out * weight_passes(p, rows / copies)  # once, or per row block
    traffic = copies * weights * dtype_bytes + rows * (fan_in + fan_out) * act_bytes
    fp8 = dtype_bytes == FP8_WIDTH and act_bytes > FP8_WIDTH
    return flops / (p.gemm_fp8_flops if fp8 else p.gemm_flops), traffic / p.gemm_bandwidth


def weight_passes(p: CostParams, tokens: float) -> int:
    """How often a GEMM of ``tokens`` rows reads its weights from memory: once, or (a
    calibrated CPU whose few-row GEMM works through ``gemm_row_block`` rows per pass, as
    MKL's does) ``ceil(tokens / gemm_row_block)`` times, at most ``gemm_max_passes``."""
    if p.gemm_row_block is None or tokens <= p.gemm_row_block:
        return 1
    passes = math.ceil(tokens / p.gemm_row_block)
    return passes if p.gemm_max_passes is None else min(passes, p.gemm_max_passes)


def moe_block_rows(group: float) -> int:
    """The fused-MoE tile height ``BLOCK_SIZE_M`` for experts that each hold ``group`` routed
    rows on average: the smallest power of two at or above it, within :data:`MOE_BLOCK_ROWS`."""
    low, high = MOE_BLOCK_ROWS
    if group <= low:
        return low
    return min(high, 1 << math.ceil(math.log2(group)))


@lru_cache(maxsize=1 << 14)
def moe_padded_rows(tokens: int, top_k: int, experts: int, block: int) -> float:
    """Rows the fused-MoE GEMMs multiply: ``moe_align_block_size`` pads each expert's rows to a
    multiple of ``block``, so ``E * block * E[ceil(n / block)]`` with ``n``, the rows of one
    expert, ``Binomial(tokens, top_k / experts)`` (each token picks ``top_k`` distinct experts).
    The sum runs over ``n`` within 12 standard deviations of the mean (all of it at small
    tokens), one vectorised pass (~10-20 us; cached, as the callers' token counts repeat)."""
    if tokens <= 0:
        return 0.0
    p = top_k / experts
    if p >= 1.0:
        return float(experts * block * math.ceil(tokens / block))
    spread = 12.0 * math.sqrt(tokens * p * (1.0 - p))
    low = max(0, math.floor(tokens * p - spread))
    high = min(tokens, math.ceil(tokens * p + spread) + 1)
    n = np.arange(low, high + 1, dtype=np.float64)
    # log pmf at ``low``, then the ratio of neighbours pmf(n+1) / pmf(n)
    first = (math.lgamma(tokens + 1) - math.lgamma(low + 1) - math.lgamma(tokens - low + 1)
             + low * math.log(p) + (tokens - low) * math.log1p(-p))  # fmt: skip
    steps = np.log((tokens - n[:-1]) / (n[:-1] + 1.0)) + math.log(p / (1.0 - p))
    pmf = np.exp(first + np.concatenate(([0.0], np.cumsum(steps))))
    tiles = float(np.dot(pmf, np.ceil(n / block)) / pmf.sum())
    return experts * block * tiles


def kernel_seconds(
    p: CostParams, kernel: KernelParams | None, rows: float, row_bytes: float
) -> float:
    """A memory-bound kernel over ``rows`` rows of ``row_bytes`` each; 0 if not calibrated."""
    if kernel is None or rows <= 0:
        return 0.0
    floor = kernel.latency_s + row_bytes / kernel.row_bandwidth
    streaming = rows * row_bytes / (p.hbm_bandwidth * kernel.memory_efficiency)
    return blend(floor, streaming, kernel.blend)


@dataclass(frozen=True)
class StepCost:
    """One step's time, by part (seconds); ``comm_s``, the tensor-parallel collectives, is
    a part of ``linear_s`` (they run between the GEMMs, on the compute stream), and
    ``idle_host_s``, the runtime's host time the GPU waits out, a part of ``overhead_s``."""

    linear_s: float
    attention_s: float
    overhead_s: float
    comm_s: float = 0.0
    idle_host_s: float = 0.0

    @property
    def total_s(self) -> float:
        """Wall time of the step."""
        return self.linear_s + self.attention_s + self.overhead_s


class CostModel:
    """Step time from the batch's shape: GEMMs, attention, LM head, overheads.

    Under tensor parallelism ``model`` is one GPU's shard (:func:`sim.config.parallel.shard_model`)
    and ``comm`` prices the collectives, which :meth:`linear_time` includes.
    """

    def __init__(
        self, model: ModelSpec, params: CostParams, kv_dtype_bytes: float | None = None,
        comm: Collectives | None = None,
    ):  # fmt: skip
        self.model = model
        self.params = params
        self.comm = comm
        # the sampled sequences' logits: gathered whole on one GPU (the full vocabulary)
        self.logits_vocab = comm.model.vocab if comm is not None else model.vocab
        self.kv_bytes_per_token_layer = model.kv_elements_per_token_per_layer * (
            model.act_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        )
        # causal attention FLOPs per (query token, key token) pair, one layer, all heads
        self.attention_flops_per_pair = (
            2.0 * model.heads * (model.attention_qk_dim + model.attention_v_dim)
        )
        # decode kernels whose FLOPs take under half their reads' time, whatever the batch:
        # rounding cannot make the FLOPs the larger, so the roofline's max is the reads'
        # (a step's decode kernel and a run's, :meth:`_decode_kernels`, skip the FLOPs)
        flop_s = self.attention_flops_per_pair / params.attention_flops
        read_s = self.kv_bytes_per_token_layer / params.decode_bandwidth
        self.decode_reads_bound = flop_s < 0.5 * read_s
        linear = self._linear_time if comm is None else self._linear_with_comm
        self.linear_time = lru_cache(maxsize=1 << 16)(linear)
        self.token_parts = lru_cache(maxsize=1 << 14)(self._token_parts)

    # --- GEMMs ----------------------------------------------------------------------------

    def gemm_time(
        self, tokens: float, fan_in: int, fan_out: int, weight_bytes: float | None = None
    ) -> float:
        """Roofline time of a (tokens x fan_in) @ (fan_in x fan_out) GEMM, its weights at
        ``model.dtype`` unless ``weight_bytes`` is given."""
        m = self.model
        width = m.dtype_bytes if weight_bytes is None else weight_bytes
        return gemm_seconds(self.params, tokens, fan_in, fan_out, width, m.act_bytes)

    def _gemms_time(self, tokens: float, gemms: tuple[tuple[int, int], ...]) -> float:
        return sum(self.gemm_time(tokens, i, o) for i, o in gemms)

    def routed_rows(self, tokens: int) -> tuple[float, float, float]:
        """(touched experts, routed rows, rows padded to the tile height) of one layer's
        fused-MoE call over ``tokens`` tokens (:func:`moe_padded_rows`, :func:`moe_block_rows`)."""
        moe = self.model.moe
        assert moe is not None
        routed = tokens * moe.top_k
        # each token picks top_k distinct experts: P(expert unused) = (1 - k/E)^tokens
        touched = moe.experts * (1.0 - (1.0 - moe.top_k / moe.experts) ** tokens)
        block = moe_block_rows(routed / touched)
        return touched, routed, moe_padded_rows(tokens, moe.top_k, moe.experts, block)

    def routed_experts_parts(self, tokens: int) -> list[tuple[float, float]]:
        """(compute, memory) seconds of each expert GEMM of one layer's fused-MoE call
        (:func:`gemm_parts`), before ``moe_gemm``, ``moe_gemm_memory`` and ``moe_row_time``:
        its FLOPs on the rows padded to the tile height (:meth:`routed_rows`), the touched
        experts' weights read once."""
        if tokens <= 0:
            return []
        return self._expert_parts(*self.routed_rows(tokens))

    def _expert_parts(
        self, touched: float, routed: float, padded: float
    ) -> list[tuple[float, float]]:
        """:meth:`routed_experts_parts` of a call whose :meth:`routed_rows` are given."""
        m, moe = self.model, self.model.moe
        assert moe is not None
        p, width, act = self.params, m.dtype_bytes, m.act_bytes
        return [
            gemm_parts(p, padded, routed, i, o, width, act, touched)
            for i, o in m.mlp_gemms(moe.expert_intermediate)
        ]

    def routed_experts_time(self, tokens: int) -> float:
        """One layer's routed experts as one fused-MoE kernel (docs/cost-model.md): each
        expert GEMM's roofline (:meth:`routed_experts_parts`), its compute at ``moe_gemm`` times
        the dense GEMM's plus ``moe_row_time`` per padded row, its memory at
        ``moe_gemm_memory`` times the dense GEMM's, blended as a GEMM is; no fixed time per
        expert."""
        if tokens <= 0:
            return 0.0
        p, rows = self.params, self.routed_rows(tokens)
        row_time = rows[2] * p.moe_row_s
        return sum(
            blend(
                compute / p.moe_gemm_efficiency + row_time,
                memory / p.moe_memory_efficiency,
                p.gemm_blend,
            )
            for compute, memory in self._expert_parts(*rows)
        )

    def _moe_time(self, tokens: int) -> float:
        """Routed experts, shared experts (dense GEMMs on all tokens), the router and the
        fused-MoE call's fixed time (``moe_latency``: routing top-k, token sort, top-k sum)."""
        m, moe = self.model, self.model.moe
        assert moe is not None
        expert = m.mlp_gemms(moe.expert_intermediate)
        shared = moe.shared_experts * self._gemms_time(tokens, expert)
        router = self.gemm_time(tokens, m.hidden, moe.experts, m.class_bytes("router"))
        return self.routed_experts_time(tokens) + shared + router + self.params.moe_latency_s

    def _linear_time(self, tokens: int, sampled: int) -> float:
        """All layers' projections and MLPs for ``tokens`` tokens, plus the LM head."""
        if tokens == 0:
            return 0.0
        layers, elementwise = self.token_parts(tokens)
        m = self.model
        total = layers + self.gemm_time(sampled, m.hidden, m.vocab, m.class_bytes("lm_head"))
        if self.params.kernels is not None:
            total += elementwise
        return total

    def comm_time(self, tokens: int, sampled: int) -> float:
        """The step's collectives (0 on one GPU); a part of :meth:`linear_time`."""
        return 0.0 if self.comm is None else self.comm.step_s(tokens, sampled)

    def _linear_with_comm(self, tokens: int, sampled: int) -> float:
        return self._linear_time(tokens, sampled) + self.comm_time(tokens, sampled)

    def _token_parts(self, tokens: int) -> tuple[float, float]:
        """The parts of :meth:`_linear_time` that depend on ``tokens`` only: every layer's
        GEMMs, and the elementwise kernels."""
        m = self.model
        attention = self._gemms_time(tokens, m.attention_gemms)
        dense = self._gemms_time(tokens, m.mlp_gemms(m.intermediate))
        total = m.layers * attention + m.dense_layers * dense
        if m.moe_layers:
            total += m.moe_layers * self._moe_time(tokens)
        return total, self.elementwise_time(tokens)

    # --- elementwise kernels (calibrated profiles only) -----------------------------------------

    def kernel_time(self, kernel: KernelParams | None, rows: float, row_bytes: float) -> float:
        """One memory-bound kernel over ``rows`` rows of ``row_bytes``; 0 if not calibrated."""
        return kernel_seconds(self.params, kernel, rows, row_bytes)

    def kernel_row_bytes(self) -> dict[str, float]:
        """Bytes one token row reads and writes in each elementwise kernel (dense MLP)."""
        m, b = self.model, self.model.act_bytes
        if m.mla:
            rope_width = (m.heads + 1) * m.mla.qk_rope_head_dim  # one rope key shared by heads
        else:
            rope_width = (m.heads + m.kv_heads) * m.head_dim
        return {
            "norm": 2.0 * m.hidden * b,  # read x, write normed x
            "rope": 2.0 * rope_width * b,  # read and write q and k
            "activation": (3.0 if m.gated_mlp else 2.0) * m.intermediate * b,
            "residual_add": 3.0 * m.hidden * b,  # read two, write one
            "embedding": 2.0 * m.hidden * b,  # gather a row, write it
        }

    def elementwise_time(self, tokens: int) -> float:
        """All layers' norms, rope, activation and residual add, plus the embedding, for a step."""
        m, kernels = self.model, self.params.kernels
        if kernels is None or tokens <= 0:
            return 0.0
        rows = self.kernel_row_bytes()
        layer = sum(
            count * self.kernel_time(getattr(kernels, name), tokens, rows[name])
            for name, count in KERNELS_PER_LAYER.items()
        )
        total = m.layers * layer + m.dense_layers * self.kernel_time(
            kernels.activation, tokens, rows["activation"]
        )
        if m.moe:
            width = (3.0 if m.gated_mlp else 2.0) * m.moe.expert_intermediate * m.act_bytes
            expert_rows = tokens * (m.moe.top_k + m.moe.shared_experts)
            total += m.moe_layers * self.kernel_time(kernels.activation, expert_rows, width)
        return total + self.kernel_time(kernels.embedding, tokens, rows["embedding"])

    # --- attention --------------------------------------------------------------------------

    def attention_time(self, new_tokens: np.ndarray, context: np.ndarray) -> float:
        """All layers' attention for sequences adding ``new_tokens`` after ``context`` cached.

        Compute: every new token attends to the cached context and, causally, to the new
        tokens before it. Memory: the KV of every attended token is read once per layer.
        Prefill-like (more than one new token) and decode sequences are separate kernels.
        """
        m, p = self.model, self.params
        new_tokens, context = np.asarray(new_tokens), np.asarray(context)
        total = 0.0
        prefill = new_tokens > 1
        if prefill.any():
            new = new_tokens[prefill].astype(np.float64)
            ctx = self._attended(context[prefill])
            keys = ctx + (new + 1.0) / 2.0 + p.attention_extra_keys
            total += self._kernel_time(new * keys, ctx + new)
            total += m.layers * p.attention_latency_s  # 0 unless calibrated
        decode = new_tokens == 1
        if decode.any():
            # NOTE: the prefill formulas with new = 1.0 are exactly ctx + 1.0 for both
            span = self._attended(context if decode.all() else context[decode]) + 1.0
            total += self._kernel_time(span, span, decode=True)
            total += m.layers * p.decode_latency_s
        return total

    def _attended(self, context: np.ndarray) -> np.ndarray:
        """Cached tokens a sequence's attention reads (the sliding window's, if any)."""
        ctx = context.astype(np.float64)
        return np.minimum(ctx, self.model.sliding_window) if self.model.sliding_window else ctx

    def _kernel_time(self, pairs: np.ndarray, attended: np.ndarray, decode: bool = False) -> float:
        """One attention kernel over all layers: its FLOPs (``pairs`` of query and key
        tokens) or its KV reads (``attended`` tokens), whichever takes longer (a decode
        kernel's reads, unsummed FLOPs, when they are known to: ``decode_reads_bound``)."""
        layers = self.model.layers
        traffic = (attended * self.kv_bytes_per_token_layer * layers).sum()
        if decode and self.decode_reads_bound:
            return self.kernel_seconds(0.0, traffic, decode=True)
        flops = (pairs * self.attention_flops_per_pair * layers).sum()
        return self.kernel_seconds(flops, traffic, decode)

    def kernel_seconds(self, flops: float, traffic: float, decode: bool = False) -> float:
        """An attention kernel's time from its FLOPs and its KV bytes read (all layers): the
        roofline's maximum (a decode kernel reads at its own bandwidth, and its reads alone
        bound it where ``decode_reads_bound``). The one formula both the step price and the
        step planner's sums use."""
        p = self.params
        if decode:
            reads = traffic / p.decode_bandwidth
            return reads if self.decode_reads_bound else max(flops / p.attention_flops, reads)
        return max(flops / p.attention_flops, traffic / p.memory_bandwidth)

    # --- a whole step -----------------------------------------------------------------------

    def step(self, new_tokens: np.ndarray, context: np.ndarray, sampled: int) -> StepCost:
        """Cost of one forward pass over a batch (prefill chunks and decodes mixed)."""
        tokens = int(np.sum(new_tokens))
        linear = self.linear_time(tokens, sampled)
        attention = self.attention_time(new_tokens, context)
        idle, overhead = self._overheads(int(np.count_nonzero(new_tokens)), linear + attention)
        return StepCost(
            linear_s=linear,
            attention_s=attention,
            overhead_s=overhead,
            comm_s=self.comm_time(tokens, sampled),
            idle_host_s=idle,
        )

    def decode_steps(self, context: np.ndarray, steps: int) -> tuple[float, np.ndarray, np.ndarray]:
        """(linear, attention per step, overhead per step) seconds of ``steps`` consecutive
        decode steps of one batch whose contexts start at ``context`` and grow a token a step.

        The same floating-point results as :meth:`step` on each of those steps (a test
        checks): the roofline's per-step sums are row sums of one 2-D array.
        """
        n = len(context)
        if not self._vectorised():  # another attention model (measured tables): a call a step
            ones = np.ones(n, dtype=np.int64)
            costs = [self.step(ones, context + j, n) for j in range(steps)]
            attention = np.array([c.attention_s for c in costs])
            return costs[0].linear_s, attention, np.array([c.overhead_s for c in costs])
        latency = self.model.layers * self.params.decode_latency_s
        linear = self.linear_time(n, n)
        attention = self._decode_kernels(context, steps) + latency
        overhead = np.broadcast_to(self.overhead_s(n, linear + attention), attention.shape)
        return linear, attention, overhead

    @property
    def roofline_attention(self) -> bool:
        """Whether attention is this class's roofline (a measured-table model overrides it)."""
        return type(self).attention_time is CostModel.attention_time

    def host_s(self, sequences: int) -> float:
        """The runtime's host time of a step of ``sequences`` sequences: a fixed cost per step
        (scheduling, input preparation, launch) and one per sequence (its input and block-table
        rows, sampling, output processing)."""
        p = self.params
        return p.step_overhead_s + sequences * p.sequence_overhead_s

    def idle_host_s(self, sequences: int, kernels_s: Duration) -> Duration:
        """The host time the GPU waits out in a step whose kernels take ``kernels_s``: all of
        it, or under asynchronous scheduling (the next step prepared while this one runs) the
        step gap it leaves plus what the kernels are too short to hide."""
        p = self.params
        if not p.async_scheduling:
            return self.host_s(sequences)
        return p.async_step_gap_s + np.maximum(self.host_s(sequences) - kernels_s, 0.0)

    def overhead_s(self, sequences: int, kernels_s: Duration) -> Duration:
        """The step's time outside its GEMMs and attention (``kernels_s``): the host time the
        GPU waits out plus the per-layer overhead."""
        return self._overheads(sequences, kernels_s)[1]

    def constant_overhead_s(self, sequences: int) -> float | None:
        """:meth:`overhead_s` where it does not depend on the kernels' time (synchronous
        scheduling: all the host time is waited out), else None."""
        return None if self.params.async_scheduling else self.overhead_s(sequences, 0.0)

    def _overheads(self, sequences: int, kernels_s: Duration) -> tuple[Duration, Duration]:
        """(the host time the GPU waits out, the step's whole overhead: that plus the
        per-layer overhead) of a step whose GEMMs and attention take ``kernels_s``."""
        layers = self.model.layers * self.params.layer_overhead_s
        idle = self.idle_host_s(sequences, kernels_s + layers)
        return idle, idle + layers

    def _vectorised(self) -> bool:
        """Whether attention is this roofline (a step's sums can be rows of one array)."""
        return self.roofline_attention and not self.model.sliding_window

    def _decode_kernels(self, context: np.ndarray, steps: int) -> np.ndarray:
        """The decode kernel's time in each of ``steps`` decode steps from ``context``."""
        m, p = self.model, self.params
        span = (context + 1.0)[None, :] + np.arange(steps, dtype=np.float64)[:, None]  # exact
        reads = (span * self.kv_bytes_per_token_layer * m.layers).sum(axis=1) / p.decode_bandwidth
        if self.decode_reads_bound:
            return reads
        flops = (span * self.attention_flops_per_pair * m.layers).sum(axis=1)
        return np.maximum(flops / p.attention_flops, reads)

    def prefill_time(self, prompt_tokens: int, cached: int = 0) -> float:
        """One sequence's prefill (one chunk, ``cached`` tokens already in KV)."""
        n = prompt_tokens - cached
        return self.step(np.array([n]), np.array([cached]), sampled=1).total_s

    def decode_time(self, contexts: np.ndarray) -> float:
        """One decode step of a batch whose sequences hold ``contexts`` tokens in KV."""
        contexts = np.asarray(contexts)
        return self.step(np.ones_like(contexts), contexts, sampled=len(contexts)).total_s

    # --- memory -----------------------------------------------------------------------------

    def activation_bytes(self, tokens: int, sampled: int) -> float:
        """Peak transient HBM of one step, as vLLM's profile measures it: the larger of the
        forward pass (its widest layer phase) and the sampler over ``sampled`` sequences' logits
        beside the forward's output hidden states.

        Attention phase keeps residual, normed input, QKV and attention output; MLP phase
        keeps residual, normed input, up(+gate) output and the activated product.
        """
        m = self.model
        up = (2 if m.gated_mlp else 1) + 1
        if m.moe:
            mlp_width = m.moe.top_k * (up * m.moe.expert_intermediate + m.hidden)
            mlp_width = max(mlp_width, up * m.intermediate if m.dense_layers else 0)
        else:
            mlp_width = up * m.intermediate
        attention_width = 2 * m.q_dim + 2 * m.kv_dim
        forward = tokens * (2 * m.hidden + max(attention_width, mlp_width)) * m.act_bytes
        sampler = sampled * self.logits_vocab * self.params.sampler_bytes_per_logit
        return max(forward, tokens * m.hidden * m.act_bytes + sampler)
