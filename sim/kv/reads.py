"""What a step's attention reads: each sequence's blocks (or the sparse model's hot set)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from sim.kv.access import AccessModel, segments
from sim.memory.blocks import BlockTable


class ReadsObserver(Protocol):
    """Who wants to see a step's reads (the heat log, ``sim.observe.heatlog``)."""

    def due(self, now: float) -> bool:
        """Whether the step starting at ``now`` is to be seen."""
        ...

    def record(self, now: float, reads: np.ndarray, where: np.ndarray) -> None:
        """One step's reads (every sequence's, in one array); ``where``: the tier residency."""
        ...


class Holdings:
    """Every request's blocks in order (``blocks``), their count (``held``), and a numpy
    mirror of each list that grows with it (for read sets without a copy per step).

    The mirrors are regions of one array, ``arena`` (request ``rid``'s from
    ``offset[rid]``), so a step's sequences are one array without a copy: region
    ``offset[rid]`` holds ``blocks[rid]`` up to the length mirrored. A grown or replaced
    mirror takes a new region; a full arena is rebuilt from the live mirrors (views taken
    before keep the old array, whose contents do not change).

    NOTE: a request's block list is only ever extended or replaced (a prefix taken, a
    release), never edited in place; a replaced list gets a fresh mirror.
    """

    def __init__(self, requests: int):
        self.blocks: list[list[int]] = [[] for _ in range(requests)]
        self.held = np.zeros(requests, dtype=np.int64)
        self.mirrors: dict[int, list] = {}  # rid -> [its block list, length mirrored, array]
        self.arena = np.zeros(1 << 16, dtype=np.int64)
        self.used = 0
        self.offset = np.zeros(requests, dtype=np.int64)
        # per request: the length mirrored (-1: none) and the mirrored list's id() (the
        # mirror keeps that list alive, so no other list has its id meanwhile)
        self.mirrored = np.full(requests, -1, dtype=np.int64)
        self.list_id = np.zeros(requests, dtype=np.uint64)

    def forget(self, rid: int) -> None:
        """``rid`` holds nothing any more."""
        self.mirrors.pop(rid, None)
        self.mirrored[rid] = -1
        self.blocks[rid] = []
        self.held[rid] = 0

    def current(self, ids: np.ndarray) -> np.ndarray:
        """Each of ``ids``' block count, its mirror brought up to date: the blocks of
        ``ids[i]`` are then ``arena[offset[ids[i]]:]``'s start."""
        lists = list(map(self.blocks.__getitem__, ids.tolist()))
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        same = np.fromiter(map(id, lists), dtype=np.uint64, count=len(lists)) == self.list_id[ids]
        for i in np.flatnonzero(~same | (lengths != self.mirrored[ids])).tolist():
            self._update(int(ids[i]))
        return lengths

    def _update(self, rid: int) -> None:
        """Mirror ``rid``'s list: the blocks added since, or a fresh region for a new list."""
        blocks = self.blocks[rid]
        mirror = self.mirrors.get(rid)
        if mirror is None or mirror[0] is not blocks:
            self.mirrors.pop(rid, None)
            mirror = self.mirrors[rid] = [blocks, 0, self._region(rid, max(2 * len(blocks), 16))]
        _, filled, buf = mirror
        if filled < len(blocks):
            if len(blocks) > len(buf):
                grown = self._region(rid, 2 * len(blocks))
                grown[:filled] = mirror[2][:filled]  # (moved, if the arena was rebuilt)
                buf = mirror[2] = grown
            buf[filled : len(blocks)] = blocks[filled:]
            mirror[1] = len(blocks)
        self.mirrored[rid], self.list_id[rid] = len(blocks), id(blocks)

    def _region(self, rid: int, size: int) -> np.ndarray:
        """A fresh region of ``size`` ids for ``rid``'s mirror (the arena rebuilt when full)."""
        if self.used + size > len(self.arena):
            self._rebuild(size)
        at = self.offset[rid] = self.used
        self.used += size
        return self.arena[at : at + size]

    def _rebuild(self, room: int) -> None:
        """A new arena holding the live mirrors, with at least ``room`` free."""
        live = sum(len(m[2]) for m in self.mirrors.values())
        arena = np.zeros(max(2 * (live + room), len(self.arena)), dtype=np.int64)
        used = 0
        for rid, mirror in self.mirrors.items():
            size, filled = len(mirror[2]), mirror[1]
            arena[used : used + filled] = mirror[2][:filled]
            mirror[2] = arena[used : used + size]
            self.offset[rid] = used
            used += size
        self.arena, self.used = arena, used


SORT_BELOW = 8  # union() sorts reads fewer than 1/SORT_BELOW of the ids (numpy sorts 10k ids
# in about the time it scans 60k marks)


def is_decode(new: np.ndarray, context: np.ndarray, prompt: np.ndarray) -> np.ndarray:
    """Which sequences of a step decode: one new token, past their prompt (the rule the
    step's reads, its timeline row and its planners share)."""
    return (new == 1) & (context >= prompt)


def read_sets(
    holdings: Holdings, access: AccessModel, table: BlockTable, prompt: np.ndarray,
    block_tokens: int, ids: np.ndarray, context: np.ndarray, new: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Every block the step's attention reads, in one array (a block once for each sequence
    that reads it; sequences in no set order), and the tokens each sequence attends (sparse
    shrinks it)."""
    n = np.minimum(-(-context // block_tokens), holdings.current(ids))
    arena, offsets = holdings.arena, holdings.offset[ids]
    if not access.sparse:
        return segments(arena, offsets, n), context.copy()
    decode = is_decode(new, context, prompt[ids])
    if not decode.any():
        return segments(arena, offsets, n), context.copy()
    at, rest = np.flatnonzero(decode), np.flatnonzero(~decode)
    lists = list(map(holdings.blocks.__getitem__, ids[at].tolist()))
    picked, sizes = access.decode_reads(ids[at], lists, table, arena, offsets[at], n[at])
    attended = context.copy()
    attended[at] = np.minimum(context[at], sizes * block_tokens)
    return np.concatenate((segments(arena, offsets[rest], n[rest]), picked)), attended


def union(reads: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct block ids of a step's reads, and their mark over ``size`` ids."""
    mark = np.zeros(size, dtype=bool)
    mark[reads] = True
    if len(reads) * SORT_BELOW > size:  # many reads: one scan of the mark
        return np.flatnonzero(mark), mark
    ids = np.sort(reads)  # few (a sparse step's): sorting them beats scanning every id
    keep = np.empty(len(ids), dtype=bool)
    keep[:1] = True
    np.not_equal(ids[1:], ids[:-1], out=keep[1:])
    return ids[keep], mark
