"""A Llama-style decoder in torch with random weights, and attention over a paged KV pool.

The mini-engine (``validation.engine``) runs it; the microbenchmarks time the very same
operator functions (:func:`rms_norm`, :func:`apply_rope`, :func:`swiglu`, :func:`linear`,
:func:`paged_attention`), so what is calibrated is what the engine executes.

KV pool layout: ``[layers, 2 (K, V), blocks, block_tokens, kv_heads, head_dim]``; one block
across all layers is ``pool[:, :, b]``, so moving a block between pools is one indexed copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sim.config.model import ModelSpec
from sim.errors import KvsimError

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ROPE_THETA = 10000.0
NORM_EPS = 1e-5


@dataclass
class Layer:
    """One decoder layer's weights (``out x in``, as ``F.linear`` takes them)."""

    attn_norm: torch.Tensor
    wqkv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_up: torch.Tensor  # gate and up, stacked: (2 * intermediate) x hidden
    w_down: torch.Tensor


@dataclass
class Weights:
    """A whole model's weights."""

    embedding: torch.Tensor
    layers: list[Layer]
    final_norm: torch.Tensor
    lm_head: torch.Tensor


def check_model(model: ModelSpec) -> None:
    """Refuse what the mini-engine does not implement (MoE, MLA, ungated MLP, dtypes)."""
    problems = []
    if model.moe or model.mla:
        problems.append("MoE and MLA layers")
    if not model.gated_mlp:
        problems.append("ungated MLPs")
    if model.dtype not in TORCH_DTYPES:
        problems.append(f"dtype {model.dtype}")
    if model.sliding_window:
        problems.append("sliding-window attention")
    if problems:
        raise KvsimError(
            f"model {model.name!r}: the torch mini-engine does not implement "
            f"{', '.join(problems)}; expected a dense Llama-style model (fp32, bf16 or fp16)"
        )


def random_weights(model: ModelSpec, seed: int, device: str = "cpu") -> Weights:
    """Weights drawn with std 1/sqrt(fan_in) (activations stay O(1)); seeded."""
    check_model(model)
    gen = torch.Generator().manual_seed(seed)
    dtype = TORCH_DTYPES[model.dtype]

    def mat(rows: int, cols: int) -> torch.Tensor:
        w = torch.randn(rows, cols, generator=gen) / cols**0.5
        return w.to(device=device, dtype=dtype)

    def ones() -> torch.Tensor:
        return torch.ones(model.hidden, device=device, dtype=dtype)

    h, q, kv, i = model.hidden, model.q_dim, model.kv_dim, model.intermediate
    layers = [
        Layer(ones(), mat(q + 2 * kv, h), mat(h, q), ones(), mat(2 * i, h), mat(h, i))
        for _ in range(model.layers)
    ]
    embedding = torch.randn(model.vocab, h, generator=gen).to(device=device, dtype=dtype)
    return Weights(embedding, layers, ones(), mat(model.vocab, h))


# --- operators (timed one by one by the microbenchmarks) -------------------------------------


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T``: one GEMM."""
    return F.linear(x, w)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the last dimension."""
    return F.rms_norm(x, (x.shape[-1],), weight, NORM_EPS)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up, from the stacked up-projection output."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_tables(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position (``[T, head_dim / 2]``)."""
    inv = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, device=positions.device) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inv[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``[T, heads, head_dim]``) by position, half-split convention."""
    a, b = x.chunk(2, dim=-1)
    c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return torch.cat((a * c - b * s, a * s + b * c), dim=-1)


def split_qkv(
    qkv: torch.Tensor, model: ModelSpec, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries and keys rotated, values as they are (the "rope" kernel of the cost model)."""
    q_dim, kv_dim = model.q_dim, model.kv_dim
    q = apply_rope(qkv[:, :q_dim].unflatten(1, (model.heads, model.head_dim)), cos, sin)
    k = apply_rope(qkv[:, q_dim : q_dim + kv_dim].unflatten(1, (model.kv_heads, -1)), cos, sin)
    return q, k, qkv[:, q_dim + kv_dim :].unflatten(1, (model.kv_heads, -1))


@dataclass(frozen=True)
class SeqGroup:
    """Sequences whose attention is one kernel call (all prefill-like, or all decodes).

    ``rows[i]``: indices of sequence i's new tokens in the flat token dimension;
    ``tables``: block tables padded with block 0 (``[B, max_blocks]``); ``context``: tokens
    already in KV before this step; ``new``: tokens added this step.
    """

    rows: torch.Tensor  # [B, max_new], padded with 0
    tables: torch.Tensor  # [B, max_blocks]
    context: torch.Tensor  # [B]
    new: torch.Tensor  # [B]


def attention_mask(group: SeqGroup, block_tokens: int) -> torch.Tensor:
    """``[B, 1, max_new, max_keys]``: causal over context + new tokens; padding sees key 0."""
    max_new = group.rows.shape[1]
    keys = torch.arange(group.tables.shape[1] * block_tokens)
    query = torch.arange(max_new)
    limit = group.context[:, None] + query[None, :]  # last key each query may see
    allowed = keys[None, None, :] <= limit[:, :, None]
    padded = query[None, :] >= group.new[:, None]
    allowed = allowed & ~padded[:, :, None]
    allowed[:, :, 0] |= padded  # padded query rows attend to key 0 (no NaN), then dropped
    return allowed[:, None]


def paged_attention(
    q: torch.Tensor, pool: torch.Tensor, layer: int, group: SeqGroup, mask: torch.Tensor
) -> torch.Tensor:
    """Attention of the group's new tokens over KV gathered from the pool by block table.

    Args:
        q: queries of every token of the step, ``[T, heads, head_dim]``.
        pool: the device KV pool (layout in the module docstring).
        layer: which layer's KV.
        group: the sequences and their block tables.
        mask: :func:`attention_mask` of the group.

    Returns:
        ``[B, max_new, heads, head_dim]`` (padding rows are garbage).
    """
    b = group.tables.shape[0]
    kv = pool[layer][:, group.tables]  # [2, B, blocks, block_tokens, kv_heads, hd]
    keys = kv[0].reshape(b, -1, *kv.shape[-2:]).transpose(1, 2)
    values = kv[1].reshape(b, -1, *kv.shape[-2:]).transpose(1, 2)
    queries = q[group.rows].transpose(1, 2)  # [B, heads, max_new, hd]
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2)


@dataclass(frozen=True)
class StepLayout:
    """Where a step's tokens go: KV slots, and the attention groups with their masks."""

    slots: torch.Tensor  # [T] flat slot (block * block_tokens + offset) of each new token
    groups: tuple[tuple[SeqGroup, torch.Tensor, torch.Tensor, torch.Tensor], ...]
    # per group: (group, mask, valid [B, max_new] bool, destination rows [valid.sum()])


def _group(
    ids: list[int], starts: list[int], new: list[int], context: list[int],
    tables: list[list[int]], block_tokens: int,
) -> tuple[SeqGroup, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    max_new = max(new[i] for i in ids)
    max_blocks = max(-(-(context[i] + new[i]) // block_tokens) for i in ids)
    offsets = torch.arange(max_new)
    first = torch.tensor([starts[i] for i in ids])
    n = torch.tensor([new[i] for i in ids])
    valid = offsets[None, :] < n[:, None]
    rows = torch.where(valid, first[:, None] + offsets[None, :], 0)
    padded = [
        tables[i][:max_blocks] + [0] * (max_blocks - len(tables[i][:max_blocks])) for i in ids
    ]
    group = SeqGroup(rows, torch.tensor(padded), torch.tensor([context[i] for i in ids]), n)
    return group, attention_mask(group, block_tokens), valid, rows[valid]


def step_layout(
    new: list[int], context: list[int], tables: list[list[int]], block_tokens: int,
    device: str = "cpu",
) -> StepLayout:  # fmt: skip
    """Slots and attention groups of a step: prefill-like (> 1 new token) and decodes apart.

    Args:
        new: tokens each sequence adds this step.
        context: tokens each already has in KV.
        tables: each sequence's block table (device block ids, covering context + new).
        block_tokens: tokens per block.
        device: where the index tensors and masks go (built on the CPU, moved once).
    """
    starts = [0]
    slots = []
    for n, c, table in zip(new, context, tables, strict=True):
        starts.append(starts[-1] + n)
        positions = range(c, c + n)
        slots += [table[p // block_tokens] * block_tokens + p % block_tokens for p in positions]
    groups = []
    for kernel in (lambda n: n > 1, lambda n: n == 1):
        ids = [i for i, n in enumerate(new) if kernel(n)]
        if ids:
            group, mask, valid, rows = _group(ids, starts, new, context, tables, block_tokens)
            if device != "cpu":
                group = SeqGroup(
                    *(t.to(device) for t in (group.rows, group.tables, group.context, group.new))
                )
                mask, valid, rows = mask.to(device), valid.to(device), rows.to(device)
            groups.append((group, mask, valid, rows))
    return StepLayout(torch.tensor(slots, device=device), tuple(groups))


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: torch.Tensor, layer: int,
    layout: StepLayout,
) -> torch.Tensor:  # fmt: skip
    """One layer's attention for a step: write the new K/V into the pool, then each group."""
    flat = pool[layer].flatten(1, 2)  # [2, blocks * block_tokens, kv_heads, hd]
    flat[0, layout.slots] = k
    flat[1, layout.slots] = v
    out = torch.empty_like(q)
    for group, mask, valid, rows in layout.groups:
        out[rows] = paged_attention(q, pool, layer, group, mask)[valid]
    return out


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Reference: causal SDPA of one whole sequence (``[T, heads, hd]``, K/V ``[T, kv, hd]``)."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        is_causal=True, enable_gqa=True,
    )  # fmt: skip
    return out[0].transpose(0, 1)


def dense_forward(model: ModelSpec, w: Weights, tokens: torch.Tensor) -> torch.Tensor:
    """Reference forward of one whole sequence without any KV cache: logits ``[T, vocab]``."""
    x = w.embedding[tokens]
    cos, sin = rope_tables(torch.arange(len(tokens)), model.head_dim)
    for layer in w.layers:
        q, k, v = split_qkv(linear(rms_norm(x, layer.attn_norm), layer.wqkv), model, cos, sin)
        x = x + linear(dense_attention(q, k, v).flatten(1), layer.wo)
        x = x + linear(swiglu(linear(rms_norm(x, layer.mlp_norm), layer.w_up)), layer.w_down)
    return linear(rms_norm(x, w.final_norm), w.lm_head)
