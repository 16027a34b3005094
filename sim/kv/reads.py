"""What a step's attention reads: each sequence's blocks (or the sparse model's hot set)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from sim.kv.access import AccessModel
from sim.memory.blocks import BlockTable


class ReadsObserver(Protocol):
    """Who wants to see a step's reads (the heat log, ``sim.observe.heatlog``)."""

    def due(self, now: float) -> bool:
        """Whether the step starting at ``now`` is to be seen."""
        ...

    def record(self, now: float, reads: list[np.ndarray], where: np.ndarray) -> None:
        """One step's reads (one id array per sequence); ``where``: the tier residency."""
        ...


class Holdings:
    """Every request's blocks in order (``blocks``), their count (``held``), and a numpy
    mirror of each list that grows with it (for read sets without a copy per step).

    NOTE: a request's block list is only ever extended or replaced (a prefix taken, a
    release), never edited in place; a replaced list gets a fresh mirror.
    """

    def __init__(self, requests: int):
        self.blocks: list[list[int]] = [[] for _ in range(requests)]
        self.held = np.zeros(requests, dtype=np.int64)
        self.mirrors: dict[int, list] = {}  # rid -> [its block list, length mirrored, array]

    def forget(self, rid: int) -> None:
        """``rid`` holds nothing any more."""
        self.mirrors.pop(rid, None)
        self.blocks[rid] = []
        self.held[rid] = 0

    def first(self, rid: int, n: int) -> np.ndarray:
        """``blocks[rid][:n]`` as an int64 array: a view of the mirror, current or updated."""
        mirror = self.mirrors.get(rid)
        if mirror is not None and mirror[0] is self.blocks[rid] and mirror[1] == len(mirror[0]):
            return mirror[2][: min(n, mirror[1])]
        return self._update(rid, n)

    def _update(self, rid: int, n: int) -> np.ndarray:
        blocks = self.blocks[rid]
        mirror = self.mirrors.get(rid)
        if mirror is None or mirror[0] is not blocks:
            buf = np.empty(max(2 * len(blocks), 16), dtype=np.int64)
            buf[: len(blocks)] = blocks
            mirror = self.mirrors[rid] = [blocks, len(blocks), buf]
        _, filled, buf = mirror
        if filled < len(blocks):
            if len(blocks) > len(buf):
                grown = np.empty(2 * len(blocks), dtype=np.int64)
                grown[:filled] = buf[:filled]
                buf = mirror[2] = grown
            buf[filled : len(blocks)] = blocks[filled:]
            mirror[1] = len(blocks)
        return buf[: min(n, len(blocks))]


def is_decode(new: np.ndarray, context: np.ndarray, prompt: np.ndarray) -> np.ndarray:
    """Which sequences of a step decode: one new token, past their prompt (the rule the
    step's reads, its timeline row and its planners share)."""
    return (new == 1) & (context >= prompt)


def read_sets(
    holdings: Holdings, access: AccessModel, table: BlockTable, prompt: np.ndarray,
    block_tokens: int, ids: np.ndarray, context: np.ndarray, new: np.ndarray,
) -> tuple[list[np.ndarray], np.ndarray]:  # fmt: skip
    """Blocks each sequence's attention reads, and the tokens it attends (sparse shrinks it)."""
    attended = context.copy()
    reads, mirrors, lists = [], holdings.mirrors, holdings.blocks
    for rid, n in zip(ids.tolist(), (-(-context // block_tokens)).tolist(), strict=True):
        mirror = mirrors.get(rid)  # inline: Holdings.first's current case, per sequence
        if mirror is not None and mirror[0] is lists[rid] and mirror[1] == len(mirror[0]):
            reads.append(mirror[2][: min(n, mirror[1])])
        else:
            reads.append(holdings.first(rid, n))
    if not access.sparse:
        return reads, attended
    decode = np.flatnonzero(is_decode(new, context, prompt[ids])).tolist()
    if decode:  # all of the step's sparse decodes in one batch, in batch order
        rids = ids[decode].tolist()
        lists = [holdings.blocks[r] for r in rids]
        picked = access.decode_sets(rids, [reads[i] for i in decode], lists, table)
        for i, blocks in zip(decode, picked, strict=True):
            reads[i] = blocks
        sizes = np.array([len(b) for b in picked], dtype=context.dtype) * block_tokens
        attended[decode] = np.minimum(context[decode], sizes)
    return reads, attended


def union(reads: list[np.ndarray], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct block ids of all reads, and their mark over ``size`` ids."""
    mark = np.zeros(size, dtype=bool)
    if reads:
        mark[np.concatenate(reads)] = True
    return np.flatnonzero(mark), mark
