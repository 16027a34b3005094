"""Which KV blocks decode attention reads: all of them, or a sparse hot set.

Sparse: attention-sink blocks, a recent window, and the top-k middle blocks by a latent heat
score. Each step a fraction ``drift`` of a sequence's middle blocks draw a fresh score
(``drift_kind: redraw``), or every middle score takes a Gaussian step of size ``drift``
(``walk``: attention shifts gradually, so the next hot set is partly predictable), so the
hot set drifts over time. Every draw comes from the run's seeded Generator.

A step's sparse decodes go through :meth:`AccessModel.decode_reads`. With ``drift_kind:
redraw`` it keeps each sequence's hot set from step to step (:mod:`sim.kv.hotsets`): the same
access process as :meth:`AccessModel.decode_blocks`, drawn in O(read set + redraws) a step
rather than a draw per middle block (docs/model.md). ``walk`` moves every middle score, so it
takes the plain loop.
"""

from __future__ import annotations

import math

import numpy as np

from sim.config.kv import FullAccess, SparseAccess
from sim.kv.hotsets import HotSets
from sim.memory.blocks import BlockTable


class AccessModel:
    """Picks the blocks a decode step of one sequence (or of a step's batch) reads."""

    def __init__(self, spec: FullAccess | SparseAccess, rng: np.random.Generator):
        self.spec = spec
        self.rng = rng
        self.sparse = isinstance(spec, SparseAccess)
        kept = isinstance(spec, SparseAccess) and spec.drift_kind == "redraw"
        self.hot = HotSets(spec, rng) if kept else None

    def initial_heat(self) -> float:
        """Latent score of a newly written block."""
        return float(self.rng.random()) if self.sparse else 0.0

    def initial_heats(self, k: int) -> np.ndarray:
        """Latent scores of ``k`` new blocks (the same draws as ``k`` :meth:`initial_heat`)."""
        return self.rng.random(k) if self.sparse else np.zeros(k)

    def topk(self, n: int) -> int:
        """How many middle blocks the top-k part reads for a sequence of ``n`` blocks."""
        spec = self.spec
        assert isinstance(spec, SparseAccess)
        if spec.topk_fraction is not None:
            return math.ceil(spec.topk_fraction * n)
        return spec.topk_blocks or 0

    def decode_blocks(self, blocks: np.ndarray, heat: np.ndarray) -> np.ndarray:
        """Ids (from ``blocks``, the sequence's blocks in order) that this decode step reads."""
        if not self.sparse or len(blocks) == 0:
            return blocks
        spec = self.spec
        assert isinstance(spec, SparseAccess)
        n = len(blocks)
        sink = min(spec.sink_blocks, n)
        window_start = max(sink, n - spec.window_blocks)
        middle = blocks[sink:window_start]
        k = self.topk(n)
        if k >= len(middle):
            return blocks
        if spec.drift > 0 and spec.drift_kind == "walk":
            heat[middle] += spec.drift * self.rng.standard_normal(len(middle))
        elif spec.drift > 0:
            redraw = middle[self.rng.random(len(middle)) < spec.drift]
            heat[redraw] = self.rng.random(len(redraw))
        hot = middle[np.argpartition(-heat[middle], k - 1)[:k]] if k else middle[:0]
        return np.concatenate((blocks[:sink], np.sort(hot), blocks[window_start:]))

    def decode_reads(
        self, rids: np.ndarray, lists: list[list[int]], table: BlockTable, arena: np.ndarray,
        offsets: np.ndarray, lengths: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """The blocks a step's decoding sequences read, one sequence after another in one
        array, and how many each reads. Sequence ``i`` holds ``arena[offsets[i]:]``'s first
        ``lengths[i]`` blocks; ``lists[i]`` is its block list (whose identity keeps its hot
        set)."""
        if self.hot is None:
            sets = [
                self.decode_blocks(arena[o : o + n], table.heat)
                for o, n in zip(offsets.tolist(), lengths.tolist(), strict=True)
            ]
            sizes = np.fromiter(map(len, sets), dtype=np.int64, count=len(sets))
            return (np.concatenate(sets) if sets else arena[:0]), sizes
        picked, start, k = self._picked(lengths)
        if not len(picked):
            return segments(arena, offsets, lengths), lengths.copy()
        sets, got = self.hot.select(
            rids[picked], [lists[i] for i in picked.tolist()], start[picked], k[picked], table,
            lengths[picked], arena, offsets[picked],
        )  # fmt: skip
        if len(picked) == len(lengths):
            return sets, got
        sizes = lengths.copy()
        sizes[picked] = got
        at = np.cumsum(sizes) - sizes  # where each sequence's reads go
        whole = np.ones(len(lengths), dtype=bool)
        whole[picked] = False
        out = np.empty(int(sizes.sum()), dtype=arena.dtype)
        out[spans(at[whole], lengths[whole])] = segments(arena, offsets[whole], lengths[whole])
        out[spans(at[picked], got)] = sets
        return out, sizes

    def _picked(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Of sequences of ``n`` blocks, those with a middle past k (the rest read every
        block, and draw none; a picked one's sink is ``sink_blocks``), each one's middle end
        and k."""
        spec = self.spec
        assert isinstance(spec, SparseAccess)
        sink = np.minimum(spec.sink_blocks, n)
        start = np.maximum(sink, n - spec.window_blocks)
        if spec.topk_fraction is not None:
            k = np.ceil(spec.topk_fraction * n).astype(np.int64)
        else:
            k = np.full(len(n), spec.topk_blocks or 0, dtype=np.int64)
        return np.flatnonzero(k < start - sink), start, k


def spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices ``starts[i]`` up to ``starts[i] + lengths[i]`` for each ``i``, in turn."""
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    return np.arange(total) + np.repeat(starts - ends + lengths, lengths)


def segments(arena: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``arena[starts[i]:starts[i] + lengths[i]]`` for each ``i``, one after another."""
    return arena[spans(starts, lengths)]
