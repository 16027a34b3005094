"""Model profile schema and the sizes derived from it (parameters, KV bytes, FLOPs)."""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import Field, model_validator

from sim.config.base import DTYPE_BYTES, Strict

Dtype = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"]
PARAMS_TOLERANCE = 0.10
WIDE_DTYPE = "bf16"  # what quantised checkpoints keep wide, and compute in


class Weights(Strict):
    """Dtypes of the tensor classes a checkpoint stores apart from its linear layers.

    ``None`` (the default): the model's compute dtype (:attr:`ModelSpec.compute_dtype`): bf16
    for an fp8/int8/int4 checkpoint, which keeps its embedding, LM head, norms and MoE router
    wide (RedHatAI/Meta-Llama-3-70B-Instruct-FP8 quantises only the linear layers of the
    decoder blocks and ignores ``lm_head``; docs/cost-model.md), else ``model.dtype``.
    """

    embedding: Dtype | None = None
    lm_head: Dtype | None = None
    norms: Dtype | None = None
    router: Dtype | None = None


class Moe(Strict):
    """Mixture of experts: routed experts per MoE layer, top-k active per token."""

    experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    expert_intermediate: int = Field(gt=0)
    shared_experts: int = Field(0, ge=0)
    dense_layers: int = Field(0, ge=0)


class Mla(Strict):
    """Multi-head latent attention (DeepSeek-V2/V3): the KV cache holds a latent vector."""

    q_lora_rank: int | None = Field(gt=0)  # null: queries straight from the hidden state
    kv_lora_rank: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)


class ModelSpec(Strict):
    """A model architecture (``model_profiles/NAME.yaml``); derived sizes are properties."""

    name: str
    hf_id: str = ""
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate: int = Field(gt=0)
    vocab: int = Field(gt=0)
    dtype: Dtype = "bf16"
    weights: Weights = Weights()
    gated_mlp: bool = True
    tie_embeddings: bool = False
    params: float | None = Field(None, gt=0)
    sliding_window: int | None = Field(None, gt=0)
    context_length: int | None = Field(
        None,
        gt=0,
        description="the checkpoint's max_position_embeddings: vLLM's default max_model_len; "
        "start-up refuses a KV pool that cannot hold one such sequence unless "
        "`engine.max_model_len` is given (null: no check)",
    )
    moe: Moe | None = None
    mla: Mla | None = None

    model_config = Strict.model_config | {"ignored_types": (cached_property,)}

    @model_validator(mode="after")
    def _check_declared_params(self) -> ModelSpec:
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.moe and self.moe.dense_layers > self.layers:
            raise ValueError("moe.dense_layers exceeds layers")
        if self.params is not None:
            derived = self.total_params
            gap = abs(derived - self.params) / self.params
            if gap > PARAMS_TOLERANCE:
                raise ValueError(
                    f"the shapes give {derived / 1e9:.2f}B parameters but params says "
                    f"{self.params / 1e9:.2f}B ({gap:.0%} apart): check layers, hidden, "
                    "intermediate, vocab and moe"
                )
        return self

    @property
    def dtype_bytes(self) -> float:
        """Bytes per weight of the linear layers (attention projections, MLPs, experts)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def compute_dtype(self) -> str:
        """The dtype of activations, of the wide tensor classes and (vLLM's ``kv_cache_dtype:
        auto``) of KV: ``model.dtype`` where it has 2 bytes or more, else bf16 (a quantised
        checkpoint's ``torch_dtype``)."""
        return self.dtype if DTYPE_BYTES[self.dtype] >= 2 else WIDE_DTYPE

    @property
    def act_bytes(self) -> float:
        """Bytes per activation element (:attr:`compute_dtype`)."""
        return DTYPE_BYTES[self.compute_dtype]

    def class_bytes(self, name: str) -> float:
        """Bytes per weight of a tensor class of ``model.weights`` (its dtype, else the
        compute dtype)."""
        return DTYPE_BYTES[getattr(self.weights, name) or self.compute_dtype]

    @property
    def q_dim(self) -> int:
        """Width of the query projection (heads x head_dim)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (or value) projection (kv_heads x head_dim)."""
        return self.kv_heads * self.head_dim

    # --- per-layer weight shapes, as (in, out) pairs of the GEMMs ---------------------------

    @property
    def attention_gemms(self) -> tuple[tuple[int, int], ...]:
        """(in, out) of the attention projections of one layer, in execution order."""
        if self.mla:
            m = self.mla
            qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = (
                ((self.hidden, m.q_lora_rank), (m.q_lora_rank, self.heads * qk_head))
                if m.q_lora_rank
                else ((self.hidden, self.heads * qk_head),)
            )
            return (
                *q,
                (self.hidden, m.kv_lora_rank + m.qk_rope_head_dim),
                (m.kv_lora_rank, self.heads * (m.qk_nope_head_dim + m.v_head_dim)),
                (self.heads * m.v_head_dim, self.hidden),
            )
        return ((self.hidden, self.q_dim + 2 * self.kv_dim), (self.q_dim, self.hidden))

    def mlp_gemms(self, width: int) -> tuple[tuple[int, int], ...]:
        """(in, out) of one MLP (or one expert) of the given intermediate width."""
        up = (self.hidden, (2 if self.gated_mlp else 1) * width)
        return (up, (width, self.hidden))

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return self.layers - self.moe.dense_layers if self.moe else 0

    @property
    def dense_layers(self) -> int:
        """Layers whose MLP is dense."""
        return self.layers - self.moe_layers

    # --- parameter counts -------------------------------------------------------------------

    @staticmethod
    def _count(gemms: tuple[tuple[int, int], ...]) -> int:
        return sum(i * o for i, o in gemms)

    @property
    def attention_params_per_layer(self) -> int:
        """Weights of one layer's attention projections."""
        return self._count(self.attention_gemms)

    @property
    def dense_mlp_params(self) -> int:
        """Weights of one dense MLP."""
        return self._count(self.mlp_gemms(self.intermediate))

    @property
    def expert_params(self) -> int:
        """Weights of one expert (0 for dense models)."""
        return self._count(self.mlp_gemms(self.moe.expert_intermediate)) if self.moe else 0

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the LM head (once if tied)."""
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    @property
    def norm_params(self) -> int:
        """RMSNorm weights: two a layer and the final one."""
        return (2 * self.layers + 1) * self.hidden

    @property
    def router_params(self) -> int:
        """MoE routers' weights (0 for dense models)."""
        return self.moe_layers * self.hidden * self.moe.experts if self.moe else 0

    @property
    def total_params(self) -> int:
        """Every weight: what must sit in HBM."""
        experts = 0
        if self.moe:
            experts = self.moe_layers * (self.moe.experts + self.moe.shared_experts)
        return (
            self.layers * self.attention_params_per_layer
            + self.dense_layers * self.dense_mlp_params
            + experts * self.expert_params
            + self.router_params
            + self.embedding_params
            + self.norm_params
        )

    @property
    def active_params(self) -> int:
        """Weights one token touches (MoE: top-k and shared experts only)."""
        if not self.moe:
            return self.total_params
        inactive = self.moe_layers * (self.moe.experts - self.moe.top_k) * self.expert_params
        return self.total_params - inactive

    @property
    def weight_classes(self) -> dict[str, int]:
        """Parameters by tensor class: ``linear`` (at ``model.dtype``) and the classes of
        ``model.weights`` (the embedding, the LM head unless tied, norms, the MoE router)."""
        wide = {
            "embedding": self.vocab * self.hidden,
            "lm_head": self.embedding_params - self.vocab * self.hidden,
            "norms": self.norm_params,
            "router": self.router_params,
        }
        return {"linear": self.total_params - sum(wide.values()), **wide}

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights, each tensor class at its dtype (quantisation scales, a few
        bytes per output channel, are left out)."""
        widths = {name: self.class_bytes(name) for name in Weights.model_fields}
        widths["linear"] = self.dtype_bytes
        return sum(n * widths[name] for name, n in self.weight_classes.items())

    # --- KV cache -----------------------------------------------------------------------------

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """KV elements one token stores in one layer (K and V, or MLA's latent + rope key)."""
        if self.mla:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * self.kv_dim

    def kv_bytes_per_token(self, dtype_bytes: float | None = None) -> float:
        """KV bytes of one token over all layers, at the compute dtype unless given."""
        width = self.act_bytes if dtype_bytes is None else dtype_bytes
        return self.layers * self.kv_elements_per_token_per_layer * width

    @property
    def attention_qk_dim(self) -> int:
        """Per-head width of the QK^T product (MLA: nope + rope)."""
        if self.mla:
            return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
        return self.head_dim

    @property
    def attention_v_dim(self) -> int:
        """Per-head width of the value vectors."""
        return self.mla.v_head_dim if self.mla else self.head_dim

    @property
    def linear_flops_per_token(self) -> float:
        """GEMM FLOPs of one token through every layer and the LM head (2 per MAC)."""
        embeddings_in = self.vocab * self.hidden if not self.tie_embeddings else 0
        return 2.0 * (self.active_params - embeddings_in - (2 * self.layers + 1) * self.hidden)
