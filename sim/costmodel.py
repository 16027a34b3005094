"""Time and activation memory of one engine step: a roofline per operator.

Every parameter lives in :class:`CostParams`, built from a hardware profile's figures and
efficiency factors (or from a calibrated profile). Equations: ``docs/cost-model.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sim.config.hardware import HardwareSpec
from sim.config.model import ModelSpec

LOGIT_BYTES = 4.0  # logits and sampling probabilities are fp32
LOGIT_COPIES = 2.0  # logits + softmax probabilities live at once


@dataclass(frozen=True)
class CostParams:
    """The cost model's parameters, in one place (SI units)."""

    peak_flops: float
    hbm_bandwidth: float
    gemm_efficiency: float
    attention_efficiency: float
    hbm_efficiency: float
    step_overhead_s: float
    layer_overhead_s: float

    @classmethod
    def from_hardware(cls, hw: HardwareSpec) -> CostParams:
        """Parameters from a hardware profile's peak figures and efficiency section."""
        eff = hw.efficiency
        return cls(
            peak_flops=hw.compute.bf16_flops,
            hbm_bandwidth=hw.hbm.bandwidth,
            gemm_efficiency=eff.gemm,
            attention_efficiency=eff.attention,
            hbm_efficiency=eff.hbm,
            step_overhead_s=eff.step_overhead,
            layer_overhead_s=eff.layer_overhead,
        )

    @property
    def gemm_flops(self) -> float:
        """Achieved GEMM FLOP/s."""
        return self.peak_flops * self.gemm_efficiency

    @property
    def attention_flops(self) -> float:
        """Achieved attention FLOP/s."""
        return self.peak_flops * self.attention_efficiency

    @property
    def memory_bandwidth(self) -> float:
        """Achieved HBM bytes/s."""
        return self.hbm_bandwidth * self.hbm_efficiency


@dataclass(frozen=True)
class StepCost:
    """One step's time, by part (seconds)."""

    linear_s: float
    attention_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        """Wall time of the step."""
        return self.linear_s + self.attention_s + self.overhead_s


class CostModel:
    """Step time from the batch's shape: GEMMs, attention, LM head, overheads."""

    def __init__(self, model: ModelSpec, params: CostParams, kv_dtype_bytes: float | None = None):
        self.model = model
        self.params = params
        self.kv_bytes_per_token_layer = model.kv_elements_per_token_per_layer * (
            model.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        )
        # causal attention FLOPs per (query token, key token) pair, one layer, all heads
        self.attention_flops_per_pair = (
            2.0 * model.heads * (model.attention_qk_dim + model.attention_v_dim)
        )
        self.linear_time = lru_cache(maxsize=1 << 16)(self._linear_time)

    # --- GEMMs ----------------------------------------------------------------------------

    def gemm_time(self, tokens: float, fan_in: int, fan_out: int) -> float:
        """Roofline time of a (tokens x fan_in) @ (fan_in x fan_out) GEMM."""
        p, b = self.params, self.model.dtype_bytes
        flops = 2.0 * tokens * fan_in * fan_out
        traffic = (fan_in * fan_out + tokens * (fan_in + fan_out)) * b
        return max(flops / p.gemm_flops, traffic / p.memory_bandwidth)

    def _gemms_time(self, tokens: float, gemms: tuple[tuple[int, int], ...]) -> float:
        return sum(self.gemm_time(tokens, i, o) for i, o in gemms)

    def _moe_time(self, tokens: int) -> float:
        """Routed experts: the experts touched each run their share of the tokens."""
        m, moe = self.model, self.model.moe
        assert moe is not None
        routed = tokens * moe.top_k
        # each token picks top_k distinct experts: P(expert unused) = (1 - k/E)^tokens
        touched = moe.experts * (1.0 - (1.0 - moe.top_k / moe.experts) ** tokens)
        expert = m.mlp_gemms(moe.expert_intermediate)
        shared = moe.shared_experts * self._gemms_time(tokens, expert)
        router = self.gemm_time(tokens, m.hidden, moe.experts)
        return touched * self._gemms_time(routed / touched, expert) + shared + router

    def _linear_time(self, tokens: int, sampled: int) -> float:
        """All layers' projections and MLPs for ``tokens`` tokens, plus the LM head."""
        m = self.model
        if tokens == 0:
            return 0.0
        attention = self._gemms_time(tokens, m.attention_gemms)
        dense = self._gemms_time(tokens, m.mlp_gemms(m.intermediate))
        total = m.layers * attention + m.dense_layers * dense
        if m.moe_layers:
            total += m.moe_layers * self._moe_time(tokens)
        return total + self.gemm_time(sampled, m.hidden, m.vocab)

    # --- attention --------------------------------------------------------------------------

    def attention_time(self, new_tokens: np.ndarray, context: np.ndarray) -> float:
        """All layers' attention for sequences adding ``new_tokens`` after ``context`` cached.

        Compute: every new token attends to the cached context and, causally, to the new
        tokens before it. Memory: the KV of every attended token is read once per layer.
        Prefill-like (more than one new token) and decode sequences are separate kernels.
        """
        m, p = self.model, self.params
        new = np.asarray(new_tokens, dtype=np.float64)
        ctx = np.asarray(context, dtype=np.float64)
        if m.sliding_window:
            ctx = np.minimum(ctx, m.sliding_window)
        pairs = new * (ctx + (new + 1.0) / 2.0)
        flops = pairs * self.attention_flops_per_pair * m.layers
        traffic = (ctx + new) * self.kv_bytes_per_token_layer * m.layers
        total = 0.0
        for mask in (new > 1, new == 1):
            if mask.any():
                total += max(
                    flops[mask].sum() / p.attention_flops,
                    traffic[mask].sum() / p.memory_bandwidth,
                )
        return total

    # --- a whole step -----------------------------------------------------------------------

    def step(self, new_tokens: np.ndarray, context: np.ndarray, sampled: int) -> StepCost:
        """Cost of one forward pass over a batch (prefill chunks and decodes mixed)."""
        tokens = int(np.sum(new_tokens))
        overhead = self.params.step_overhead_s + self.model.layers * self.params.layer_overhead_s
        return StepCost(
            linear_s=self.linear_time(tokens, sampled),
            attention_s=self.attention_time(new_tokens, context),
            overhead_s=overhead,
        )

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
        """Peak transient HBM of one step: the widest layer phase plus the logits.

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
        per_token = (2 * m.hidden + max(attention_width, mlp_width)) * m.dtype_bytes
        return tokens * per_token + sampled * m.vocab * LOGIT_BYTES * LOGIT_COPIES
