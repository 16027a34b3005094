"""Prefix-block hashes: deterministic 64-bit ids where equal hash at block i = equal prefix.

A sequence is a chain of segments (system prompt, document, a session's own tokens ...);
a segment's *chain hash* is ``combine(parent chain, segment key)``, so it identifies every
token up to the segment's end. Block i's hash is ``block_hash(owner, i)``, ``owner`` being
the chain hash of the segment that holds the block's last token: equal hashes at block i
mean the same chain of segments, hence the same prefix up to block i. This equals hashing
parent-by-parent (as vLLM does) in what it guarantees, but needs no sequential pass, so
millions of blocks hash in a few vectorised ``numpy.uint64`` operations (wrapping).
"""

from __future__ import annotations

import numpy as np

U64 = np.uint64
_K_MUL = U64(0x9E3779B97F4A7C15)
_K_XOR = U64(0xD6E8FEB86659FD93)
_K_POS = U64(0x2545F4914F6CDD1D)

# Namespaces, so that ids of different origins never meet by construction.
ROOT = U64(0x6B7673696D2D6B76)  # b"kvsim-kv"
TRACE = U64(1)
TRACE_UNIQUE = U64(2)
SYSTEM = U64(3)
SESSION = U64(4)
DOCUMENT = U64(5)
REQUEST = U64(6)
CONTEXT = U64(7)  # a customer's shared context (shared_context)


def as_u64(values: object) -> np.ndarray:
    """``values`` as a uint64 array (negative int64 wrap, as their two's complement)."""
    array = np.asarray(values)
    if array.dtype.kind == "i":
        return array.astype(np.int64).view(np.uint64)
    return array.astype(np.uint64)


def fmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective, well-mixed map of uint64 values."""
    x = x ^ (x >> U64(30))
    x = x * U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> U64(27))
    x = x * U64(0x94D049BB133111EB)
    return x ^ (x >> U64(31))


def combine(parent: object, value: object) -> np.ndarray:
    """The hash of ``value`` appended to ``parent`` (broadcasting; injective in each argument)."""
    p = np.atleast_1d(as_u64(parent))
    v = np.atleast_1d(as_u64(value))
    return fmix64(p * _K_MUL + fmix64(v ^ _K_XOR))


def chain(*keys: object) -> np.ndarray:
    """``combine(combine(ROOT, k0), k1) ...``: the chain hash of a sequence of segment keys."""
    out = np.atleast_1d(ROOT)
    for key in keys:
        out = combine(out, key)
    return out


def split(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """Per-row views ``flat[offsets[i]:offsets[i + 1]]``."""
    return [flat[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]


def offsets_of(counts: np.ndarray) -> np.ndarray:
    """Row offsets (length n + 1) of rows with ``counts`` items each."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def position_keys(n: int) -> np.ndarray:
    """Mixed keys of block positions 0 .. n-1 (distinct: fmix64 is a bijection)."""
    return fmix64(np.arange(n, dtype=np.uint64) ^ _K_POS)


def block_hash(owner: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The hash of block ``index`` of a prefix identified by ``owner`` (a chain hash).

    ``owner ^ position_keys[index]``: distinct for distinct owners at one position and for
    distinct positions under one owner; anything else equal only by 64-bit chance.
    """
    keys = position_keys(int(index.max()) + 1) if index.size else np.zeros(0, np.uint64)
    return owner ^ keys[index]


def _block_rows(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a flat list of blocks: each block's row and its index within the row."""
    offsets = offsets_of(counts)
    rows = np.repeat(np.arange(len(counts)), counts)
    return rows, np.arange(offsets[-1]) - offsets[rows]


def segment_hashes(
    seg_row: np.ndarray,
    seg_tokens: np.ndarray,
    seg_chain: np.ndarray,
    num_blocks: np.ndarray,
    block_tokens: int,
) -> np.ndarray:
    """Hashes of blocks ``0 .. num_blocks[r] - 1`` of each row, rows made of segments.

    Args:
        seg_row: the row of each segment, non-decreasing; every row has >= 1 segment.
        seg_tokens: tokens in each segment (>= 0).
        seg_chain: chain hash identifying the sequence up to the end of each segment.
        num_blocks: full blocks to hash per row (within the row's tokens).
        block_tokens: tokens per block.

    Returns:
        The flat uint64 hashes, row after row (``offsets_of(num_blocks)`` splits them).
    """
    row_tokens = np.bincount(seg_row, weights=seg_tokens, minlength=len(num_blocks))
    row_start = (np.cumsum(row_tokens) - row_tokens).astype(np.int64)
    seg_end = np.cumsum(seg_tokens)
    rows, index = _block_rows(num_blocks)
    last_token = row_start[rows] + (index + 1) * block_tokens - 1
    owner = np.searchsorted(seg_end, last_token, side="right")
    return block_hash(seg_chain[owner], index)


def trace_block_hashes(
    ids: np.ndarray,
    id_offsets: np.ndarray,
    prompt_tokens: np.ndarray,
    ratio: int,
    row_key: np.ndarray,
    block_tokens: int,
) -> np.ndarray:
    """Simulator-block hashes from a trace's coarser prefix-block ids.

    Trace block j (``ratio`` simulator blocks) splits into sub-blocks k = 0..ratio-1 with
    hash ``block_hash(chain(TRACE, id_j), k)``: the trace id already names the whole prefix
    up to its block, so (id_j, k) names the prefix up to the sub-block. Only full simulator
    blocks get a hash (a trailing partial trace block yields its full sub-blocks). Blocks
    past a row's last id are unique to the row (``row_key``).

    Returns:
        Flat uint64 hashes, ``prompt_tokens // block_tokens`` per row.
    """
    counts = np.asarray(prompt_tokens, dtype=np.int64) // block_tokens
    num_ids = np.diff(id_offsets)
    if np.any(counts > num_ids * ratio):
        return _trace_hashes_with_tails(ids, id_offsets, counts, ratio, row_key)
    # NOTE: one (trace block x sub-block) matrix, masked to the full sub-blocks, is already
    # in row-major block order: no per-block repeat/arange over millions of blocks.
    owner = chain(TRACE, ids)
    id_row = np.repeat(np.arange(len(counts)), num_ids)
    id_index = np.arange(len(ids)) - id_offsets[id_row]
    full = np.clip(counts[id_row] - id_index * ratio, 0, ratio)
    matrix = owner[:, None] ^ position_keys(ratio)[None, :]
    return matrix[np.arange(ratio)[None, :] < full[:, None]]


def _trace_hashes_with_tails(
    ids: np.ndarray, id_offsets: np.ndarray, counts: np.ndarray, ratio: int, row_key: np.ndarray
) -> np.ndarray:
    """The general case of :func:`trace_block_hashes`: some rows have blocks without ids."""
    rows, index = _block_rows(counts)
    trace_block = index // ratio
    known = trace_block < np.diff(id_offsets)[rows]
    out = np.empty(len(rows), dtype=np.uint64)
    where = id_offsets[rows[known]] + trace_block[known]
    out[known] = block_hash(chain(TRACE, ids[where]), index[known] % ratio)
    unknown = ~known
    out[unknown] = block_hash(chain(TRACE_UNIQUE, row_key[rows[unknown]]), index[unknown])
    return out


def sequence_hashes(
    seg_row: np.ndarray,
    seg_tokens: np.ndarray,
    seg_chain: np.ndarray,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    block_tokens: int,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Prefix and output block hashes of rows whose segments cover prompt + output tokens.

    Returns:
        (prefix_hashes, output_hashes): per row, the prompt's full blocks, then the blocks
        that fill up during generation.
    """
    prompt_blocks = prompt_tokens // block_tokens
    total_blocks = (prompt_tokens + output_tokens) // block_tokens
    flat = segment_hashes(seg_row, seg_tokens, seg_chain, total_blocks, block_tokens)
    offsets = offsets_of(total_blocks)
    bounds = offsets[:-1] + prompt_blocks
    edges = np.empty(2 * len(prompt_tokens) + 1, dtype=np.int64)
    edges[0:-1:2], edges[1:-1:2], edges[-1] = offsets[:-1], bounds, offsets[-1]
    pieces = split(flat, edges)
    return pieces[0::2], pieces[1::2]


def shared_then_own(
    shared_chain: np.ndarray, shared_tokens: np.ndarray, session: np.ndarray, prompt: np.ndarray,
    output: np.ndarray, block_tokens: int,
) -> tuple[list[np.ndarray], list[np.ndarray]]:  # fmt: skip
    """Block hashes of requests that are [a shared prefix][their session's own tokens]: the
    prefix (``shared_tokens`` long, hashed from ``shared_chain``) is found by every request
    with the same chain, the rest only by the session's later turns."""
    n = len(prompt)
    session_chain = combine(combine(shared_chain, SESSION), session)
    seg_row = np.repeat(np.arange(n), 2)
    seg_tokens = np.column_stack([shared_tokens, prompt + output - shared_tokens]).ravel()
    seg_chain = np.column_stack([shared_chain, session_chain]).ravel()
    return sequence_hashes(seg_row, seg_tokens, seg_chain, prompt, output, block_tokens)
