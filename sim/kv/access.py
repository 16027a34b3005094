"""Which KV blocks decode attention reads: all of them, or a sparse hot set.

Sparse: attention-sink blocks, a recent window, and the top-k middle blocks by a latent heat
score. Each step a fraction ``drift`` of a sequence's middle blocks draw a fresh score
(``drift_kind: redraw``), or every middle score takes a Gaussian step of size ``drift``
(``walk``: attention shifts gradually, so the next hot set is partly predictable), so the
hot set drifts over time. Every draw comes from the run's seeded Generator.

A step's sparse decodes go through :meth:`AccessModel.decode_blocks_many`: the same results,
heat and draws as :meth:`AccessModel.decode_blocks` one sequence after another, in a few
numpy calls over all of them.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np

from sim.config.kv import FullAccess, SparseAccess


class AccessModel:
    """Picks the blocks a decode step of one sequence (or of a step's batch) reads."""

    def __init__(self, spec: FullAccess | SparseAccess, rng: np.random.Generator):
        self.spec = spec
        self.rng = rng
        self.sparse = isinstance(spec, SparseAccess)

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

    def decode_blocks_many(self, seqs: list[np.ndarray], heat: np.ndarray) -> list[np.ndarray]:
        """:meth:`decode_blocks` of each of a step's sequences, in order, in a few numpy calls.

        The same read sets, ``heat`` and generator state as the plain loop: the redraw draws
        of all sequences come from one buffer, a later sequence sees an earlier one's new
        score of a shared block, and each top-k is the same set. ``drift_kind: walk`` (its
        normals take a variable number of draws) and bit generators other than PCG64 keep
        the loop.
        """
        spec = self.spec
        if not self.sparse or (spec.drift > 0 and not self._batch_draws()):
            return [self.decode_blocks(b, heat) for b in seqs]
        assert isinstance(spec, SparseAccess)
        n = np.array([len(b) for b in seqs], dtype=np.int64)
        sink = np.minimum(spec.sink_blocks, n)
        start = np.maximum(sink, n - spec.window_blocks)
        if spec.topk_fraction is not None:
            k = np.ceil(spec.topk_fraction * n).astype(np.int64)
        else:
            k = np.full(len(n), spec.topk_blocks or 0, dtype=np.int64)
        picked = np.flatnonzero(k < start - sink)  # the rest read every block, and draw none
        out = list(seqs)
        if not len(picked):
            return out
        # a picked sequence has a middle: its sink and window are spec.sink/window_blocks
        start, k = start[picked], k[picked]
        a, rows, starts = spec.sink_blocks, [seqs[i] for i in picked.tolist()], start.tolist()
        mid = np.concatenate([s[a:b] for s, b in zip(rows, starts, strict=True)])
        hot = self._hot_rows(mid, start - a, k, heat)
        if k.min() == k.max():  # one k: each read set a row of one array
            edges = np.concatenate(
                [p for s, b in zip(rows, starts, strict=True) for p in (s[:a], s[b:])]
            )
            edges = edges.reshape(len(rows), -1)
            sets = list(np.concatenate((edges[:, :a], hot, edges[:, a:]), axis=1))
        else:
            sets = [
                np.concatenate((s[:a], h[:n], s[b:]))
                for s, h, n, b in zip(rows, hot, k.tolist(), starts, strict=True)
            ]
        for i, blocks in zip(picked.tolist(), sets, strict=True):
            out[i] = blocks
        return out

    def _batch_draws(self) -> bool:
        """Whether a step's redraw draws can come from one buffer (then rewound exactly)."""
        # random() takes exactly one 64-bit output of PCG64, and PCG64 can advance
        drift_kind = self.spec.drift_kind  # type: ignore[union-attr]
        return drift_kind == "redraw" and isinstance(self.rng.bit_generator, np.random.PCG64)

    def _hot_rows(
        self, mid: np.ndarray, lengths: np.ndarray, k: np.ndarray, heat: np.ndarray
    ) -> np.ndarray:
        """Redraw (as the loop would) and pick the top-k ids of each middle of ``mid``.

        ``mid`` holds the middles, ``lengths`` each; row i of the result starts with middle
        i's set. A threshold keeps a little more than ``k`` of each middle (scores are
        uniform in [0, 1)) for :func:`_top_rows`.
        """
        bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        seen = self._scores_seen(mid, bounds, heat)
        threshold = np.where(k > 0, 1.0 - (k + 4 * np.sqrt(k) + 8) / lengths, np.inf)
        kept = np.flatnonzero(seen >= np.repeat(threshold, lengths))
        return _top_rows(mid, seen, kept, bounds, k)

    def _scores_seen(self, mid: np.ndarray, bounds: np.ndarray, heat: np.ndarray) -> np.ndarray:
        """Each element's score when its sequence takes its top-k; ``heat`` ends as the loop's.

        Middle by middle (``bounds`` in ``mid``), as the loop: its new scores go into
        ``heat``, then it reads its scores, so a middle sees an earlier one's redraws of a
        block they share and not a later one's. The draws come from one buffer of doubles
        standing for the loop's (per middle, a test each, then a score per redraw); the
        generator ends as after the loop. A middle takes three numpy calls: its redrawn
        blocks (their count places its scores), their writes, and its read. (Writing and
        reading all middles at once, then mending the reads of blocks a later middle
        rewrote, measured slower: finding those takes more passes over all the elements.)
        """
        drift = self.spec.drift  # type: ignore[union-attr]
        if not drift > 0:
            return heat.take(mid)
        bitgen = self.rng.bit_generator
        saved = bitgen.state
        buf = self.rng.random(_first_draws(len(mid), drift))
        hit, seen, pos = buf < drift, np.empty(len(mid), dtype=heat.dtype), 0
        for a, b in pairwise(bounds.tolist()):
            end = pos + b - a  # this middle's tests end; its scores follow
            if end > len(buf):
                buf, hit = self._draw_on(buf, hit, end, drift)
            middle = mid[a:b]
            redraw = middle[hit[pos:end]]
            pos = end + len(redraw)
            if pos > len(buf):
                buf, hit = self._draw_on(buf, hit, pos, drift)
            heat[redraw] = buf[end:pos]
            # "wrap": ids as heat[middle] reads them, unchecked ("raise" copies via a buffer)
            heat.take(middle, out=seen[a:b], mode="wrap")
        _rewind(bitgen, saved, pos)
        return seen

    def _draw_on(
        self, buf: np.ndarray, hit: np.ndarray, size: int, drift: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """``buf`` and ``hit`` with the draws after ``buf``'s, to ``size`` and a margin (the
        generator is rewound to the draws used, so how many more it draws changes nothing)."""
        more = self.rng.random(size - len(buf) + len(buf) // 4 + 64)
        return np.concatenate((buf, more)), np.concatenate((hit, more < drift))


def _first_draws(tests: int, drift: float) -> int:
    """Doubles drawn at first for ``tests`` tests: enough but for a rare step (then more)."""
    return tests + int(1.1 * drift * tests) + 64


def _rewind(bitgen: np.random.BitGenerator, saved: dict, used: int) -> None:
    """Put ``bitgen`` where ``used`` doubles after ``saved`` leave it (keeping a half word)."""
    bitgen.state = saved
    bitgen.advance(used)  # type: ignore[attr-defined]
    if saved["has_uint32"]:  # advance drops the buffered half word; random() keeps it
        state = bitgen.state
        state["has_uint32"], state["uinteger"] = saved["has_uint32"], saved["uinteger"]
        bitgen.state = state


def _top_rows(
    mid: np.ndarray,
    seen: np.ndarray,
    kept: np.ndarray,
    bounds: np.ndarray,
    k: np.ndarray,
) -> np.ndarray:
    """Row i starts with the sorted ids of the ``k[i]`` highest-``seen`` of middle i.

    The middles are ``bounds`` in ``mid``. The same sets as ``argpartition`` per middle,
    given ``kept``: the elements at or above their middle's threshold. When a middle's k-th
    highest kept score is above the next one, its set is among its kept elements; otherwise
    (the threshold kept fewer than k, or a tie at the k-th score) the middle takes the
    per-middle path.
    """
    counts = np.diff(np.searchsorted(kept, bounds))
    kth, below = _kth_scores(seen[kept], counts, k)
    ok = kth > below  # minus infinity where a middle kept fewer than k
    chosen = kept[seen[kept] >= np.repeat(np.where(ok, kth, np.inf), counts)]
    rows = _sorted_rows(mid[chosen], np.where(ok, k, 0), int(k.max()))
    for i in np.flatnonzero(~ok).tolist():
        rows[i, : k[i]] = _top_set(
            mid[bounds[i] : bounds[i + 1]], seen[bounds[i] : bounds[i + 1]], k[i]
        )
    return rows


def _kth_scores(
    values: np.ndarray, counts: np.ndarray, k: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each segment's ``k``-th highest of ``values`` (``counts`` each, in order), and the next.

    One row-wise sort of a grid, a row per segment padded with minus infinity, finds them;
    the k-th is infinity where ``k`` is 0, and minus infinity where a segment has fewer.
    """
    width = int(counts.max()) + 1
    grid = np.full((len(k), width), -np.inf)
    base = np.arange(len(k)) * width - (np.cumsum(counts) - counts)
    grid.ravel()[np.repeat(base, counts) + np.arange(len(values))] = values
    grid.sort(axis=1)  # a vectorised sort of short rows beats a partition
    rows, at = np.arange(len(k)), np.clip(width - k, 1, width - 1)
    fits = counts >= k
    kth = np.where(k > 0, np.where(fits, grid[rows, at], -np.inf), np.inf)
    return kth, np.where(fits, grid[rows, at - 1], -np.inf)


def _sorted_rows(ids: np.ndarray, counts: np.ndarray, width: int) -> np.ndarray:
    """``ids`` (``counts`` per segment, in order) as rows sorted ascending, padded."""
    rows = np.full((len(counts), width), np.iinfo(ids.dtype).max, dtype=ids.dtype)
    base = np.arange(len(counts)) * width - (np.cumsum(counts) - counts)
    rows.ravel()[np.repeat(base, counts) + np.arange(len(ids))] = ids
    rows.sort(axis=1)
    return rows


def _top_set(middle: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Sorted ids of ``middle`` with the ``k`` highest ``scores``, as :meth:`decode_blocks`."""
    hot = middle[np.argpartition(-scores, k - 1)[:k]] if k else middle[:0]
    return np.sort(hot)
