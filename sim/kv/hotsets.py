"""The sparse model's hot sets, kept from step to step: O(read set + redraws) a step.

The access process is the one :meth:`sim.kv.access.AccessModel.decode_blocks` states: each
step every middle block of a decoding sequence draws a fresh uniform score with probability
``drift``, and the sequence reads the ``k`` middle blocks of highest score. This class draws
and selects without visiting every middle block:

- **Redraws**: the redrawn blocks of all of a step's middles are a Bernoulli(``drift``)
  process over their concatenation; its gaps are geometric, so the positions are the cumsum
  of geometric draws (one draw a redraw), and each gets a fresh uniform score.
- **Selection**: each sequence keeps a *pool*, its middle blocks with score at least a
  threshold ``t`` of its own, chosen when the pool is built (a scan of the middle) so that it
  holds about ``k + 4 sqrt(k) + 8`` blocks. Whenever the pool holds at least ``k`` blocks,
  the top-k of the middle is the top-k of the pool. A block of one sequence only changes
  score when that sequence redraws it, so its pool follows its own redraws (a redrawn block
  joins or leaves by its new score) and the block entering the middle as the window slides;
  a block shared with another running request (``ref > 1``, or taken from another's
  prefix) may be redrawn by either, so every pool holding it in its middle keeps an entry
  for it, tested whenever any holder redraws it. A pool that falls below ``k`` (or grows
  far past its size) is rebuilt from a scan.

Within a step every redraw lands before any sequence selects (the batch attends at once); the
plain loop of :meth:`decode_blocks` let a sequence see a shared block's redraw by a later
sequence one step later. docs/model.md states the model.
"""

from __future__ import annotations

import math

import numpy as np

from sim.config.kv import SparseAccess
from sim.memory.blocks import BlockTable

NONE = -1


def _grown(arr: np.ndarray, size: int, fill: float | int | bool) -> np.ndarray:
    """``arr`` extended with ``fill`` to at least ``size`` (doubling)."""
    if len(arr) >= size:
        return arr
    out = np.full(max(size, 2 * len(arr), 64), fill, dtype=arr.dtype)
    out[: len(arr)] = arr
    return out


class HotSets:
    """Each decoding sequence's pool of candidate blocks and threshold, across steps."""

    def __init__(self, spec: SparseAccess, rng: np.random.Generator):
        self.spec, self.rng = spec, rng
        self.calls = 0
        # per request: its pool's token (NONE: none), the call it was last seen at, the
        # middle's end then, and its block list (a new list means a new pool)
        self.token = np.full(0, NONE, dtype=np.int64)
        self.seen = np.full(0, NONE, dtype=np.int64)
        self.start = np.zeros(0, dtype=np.int64)
        self.lists: dict[int, list[int]] = {}
        # per token: its threshold, and its row in the current call (NONE: not current)
        self.thr = np.zeros(0)
        self.row = np.full(0, NONE, dtype=np.int64)
        self.tokens = 0
        # per block: the token whose pool holds it as an unshared block, and shared marks
        self.cand_of = np.full(0, NONE, dtype=np.int64)
        self.shared = np.zeros(0, dtype=bool)
        # the pools' entries: unshared members (block, token), valid while ``cand_of`` says
        # so; every shared middle block (block, position, token, member)
        self.c_blk = np.zeros(0, dtype=np.int64)
        self.c_tok = np.zeros(0, dtype=np.int64)
        self.s_blk = np.zeros(0, dtype=np.int64)
        self.s_pos = np.zeros(0, dtype=np.int64)
        self.s_tok = np.zeros(0, dtype=np.int64)
        self.s_mem = np.zeros(0, dtype=bool)  # whether its score is at the threshold or above
        self.red_mark = np.zeros(0, dtype=bool)  # per block: redrawn shared, this call
        self.s_seen: dict[int, set[int]] = {}  # token -> its shared blocks
        self._current = np.zeros(0, dtype=np.int64)  # tokens with a row in this call

    def pool_size(self, k: int) -> int:
        """Blocks a fresh pool holds for ``k``: ``k`` and a margin for the step-to-step
        drift (the pool's size moves like a binomial count about it)."""
        return k + math.ceil(4 * math.sqrt(k)) + 8

    # --- one step ----------------------------------------------------------------------------

    def select(
        self, rids: np.ndarray, seqs: list[np.ndarray], lists: list[list[int]],
        start: np.ndarray, k: np.ndarray, table: BlockTable,
    ) -> list[np.ndarray]:  # fmt: skip
        """What each sequence (row) reads after this step's redraws: its sink, the sorted
        top-k of its middle, its window.

        ``seqs``: the rows' blocks (the middle is ``sink_blocks`` up to ``start``); ``lists``:
        their block lists (a pool lives as long as its list); every row has ``k < middle``.
        """
        self.calls += 1
        self._fit(table.capacity, int(rids.max()) + 1)
        flat = np.concatenate(seqs)  # the rows' ids in one array (a copy, no per-block work)
        base = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in seqs], out=base[1:])
        step = self._step = _Step(rids, seqs, flat, base, start, k)
        self._redraw(step, table.heat)
        fresh = self._stale(step, lists)
        self._mark_rows(step, fresh)
        for i in fresh:
            self._build(step, i, table)
        self._entering(step, fresh, table)
        blk, row = self._pools()
        counts = np.bincount(row, minlength=len(k))
        cap = 4 * (k + np.ceil(4 * np.sqrt(k)) + 8) + 64
        redo = np.flatnonzero((counts < k) | (counts > cap)).tolist()
        if redo:
            for i in redo:
                self._build(step, i, table)
            blk, row = self._pools()
        self.seen[rids], self.start[rids] = self.calls, start
        self.lists.update(zip(step.rows, lists, strict=True))
        self._current = self.token[rids]
        if self.calls % 1024 == 0:
            self._prune()
        return _read_sets(step, self.spec.sink_blocks, _top_k(blk, row, table.heat, k))

    def _prune(self) -> None:
        """Forget the lists and shared sets of requests not seen at this call."""
        seen = self.seen
        self.lists = {r: x for r, x in self.lists.items() if seen[r] == self.calls}
        row = self.row
        self.s_seen = {tok: x for tok, x in self.s_seen.items() if row[tok] != NONE}

    def _fit(self, blocks: int, requests: int) -> None:
        self.token = _grown(self.token, requests, NONE)
        self.seen = _grown(self.seen, requests, NONE)
        self.start = _grown(self.start, requests, 0)
        self.cand_of = _grown(self.cand_of, blocks, NONE)
        self.shared = _grown(self.shared, blocks, False)
        self.red_mark = _grown(self.red_mark, blocks, False)

    def _redraw(self, step: _Step, heat: np.ndarray) -> None:
        """Redraw each middle block with probability ``drift``: positions as geometric gaps
        over the concatenated middles, a fresh uniform score each."""
        p, a = self.spec.drift, self.spec.sink_blocks
        middles = step.start - a
        total = int(middles.sum())
        if p <= 0 or total == 0:
            return
        mean = total * p
        pos = np.cumsum(_geometric(self.rng, p, int(mean + 4 * math.sqrt(mean)) + 16)) - 1
        while pos[-1] < total:  # rare: more redraws than the margin
            more = np.cumsum(_geometric(self.rng, p, int(mean) + 16)) + pos[-1]
            pos = np.concatenate((pos, more))
        pos = pos[pos < total]
        bounds = np.zeros(len(middles) + 1, dtype=np.int64)
        np.cumsum(middles, out=bounds[1:])
        row = np.searchsorted(bounds, pos, side="right") - 1
        blocks = step.flat[pos + (step.base[row] + a - bounds[row])]
        scores = self.rng.random(len(blocks))
        heat[blocks] = scores  # a block redrawn twice keeps the last
        step.redrawn = (blocks, scores, row)

    def _stale(self, step: _Step, lists: list[list[int]]) -> list[int]:
        """Rows whose pool must be built: new, not seen at the last call, a new list, or a
        middle that moved by more than a block."""
        rids, known = step.rids, self.lists
        moved = step.start - self.start[rids]
        bad = (self.token[rids] == NONE) | (self.seen[rids] != self.calls - 1)
        bad |= (moved < 0) | (moved > 1)
        same = [known.get(r) is x for r, x in zip(step.rows, lists, strict=True)]
        bad |= ~np.array(same, dtype=bool)
        return np.flatnonzero(bad).tolist()

    def _mark_rows(self, step: _Step, fresh: list[int]) -> None:
        """Tokens of this call's rows map to their rows; every other token is dropped."""
        self.row[self._current] = NONE
        tok = self.token[step.rids]
        ok = tok != NONE
        ok[fresh] = False
        self.row[tok[ok]] = np.flatnonzero(ok)

    def _new_token(self, rid: int, row: int, thr: float) -> int:
        tok = self.tokens
        self.tokens += 1
        self.thr = _grown(self.thr, self.tokens, 0.0)
        self.row = _grown(self.row, self.tokens, NONE)
        self.thr[tok], self.row[tok] = thr, row
        old = self.token[rid]
        if old != NONE:
            self.row[old] = NONE
            self.s_seen.pop(int(old), None)
        self.token[rid] = tok
        return tok

    def _build(self, step: _Step, i: int, t: BlockTable) -> None:
        """A fresh pool for row ``i`` from a scan of its middle; tell the owners of blocks it
        took from them that those are shared now."""
        a, rid, seq = self.spec.sink_blocks, step.rows[i], step.seqs[i]
        mid = seq[a : step.start[i]]
        h = t.heat[mid]
        c = self.pool_size(int(step.k[i]))
        thr = -math.inf if len(mid) <= c else float(np.partition(h, len(mid) - c)[len(mid) - c])
        tok = self._new_token(rid, i, thr)
        own = (t.owner[mid] == rid) & (t.ref[mid] <= 1)
        self.shared[mid] = ~own
        mine = mid[own & (h >= thr)]
        self.cand_of[mine] = tok
        self.c_blk = np.concatenate((self.c_blk, mine))
        self.c_tok = np.concatenate((self.c_tok, np.full(len(mine), tok)))
        at = np.flatnonzero(~own)
        self.s_seen[tok] = set(mid[at].tolist())
        self._add_shared(mid[at], at + a, tok, h[at] >= thr)
        taken = seq[t.owner[seq] != rid]
        owners = t.owner[taken]
        for o in np.unique(owners[owners >= 0]).tolist():
            self._tell_owner(o, taken[owners == o], t)

    def _tell_owner(self, owner: int, blocks: np.ndarray, t: BlockTable) -> None:
        """``owner``'s ``blocks`` are held by another request too: its pool tests them."""
        if owner >= len(self.token) or self.token[owner] == NONE:
            return
        tok = int(self.token[owner])
        row = int(self.row[tok])
        if row == NONE:
            return  # not a row of this call: rebuilt when next seen
        self.shared[blocks] = True
        pos = t.position[blocks]  # the same in every list holding a block (a prefix)
        inside = (pos >= self.spec.sink_blocks) & (pos < self._step.start[row])
        known = self.s_seen[tok]  # (the rest join as the window slides past them)
        new = [i for i, b in enumerate(blocks[inside].tolist()) if b not in known]
        if not new:
            return
        ids, pos = blocks[inside][new], pos[inside][new]
        known.update(ids.tolist())
        self.cand_of[ids[self.cand_of[ids] == tok]] = NONE
        self._add_shared(ids, pos, tok, t.heat[ids] >= self.thr[tok])

    def _add_shared(
        self, blocks: np.ndarray, positions: np.ndarray, tok: int, member: np.ndarray
    ) -> None:
        """Shared middle blocks of pool ``tok`` (``member``: scoring at its threshold)."""
        self.s_blk = np.concatenate((self.s_blk, blocks))
        self.s_pos = np.concatenate((self.s_pos, positions))
        self.s_tok = np.concatenate((self.s_tok, np.full(len(blocks), tok)))
        self.s_mem = np.concatenate((self.s_mem, member))

    def _entering(self, step: _Step, fresh: list[int], t: BlockTable) -> None:
        """Blocks that entered a kept pool's middle (the window slid) or were redrawn in it."""
        slid = step.start - self.start[step.rids] == 1
        slid[fresh] = False
        rows = np.flatnonzero(slid)
        if len(rows):
            at = step.start[rows] - 1  # the block that entered: the middle's last
            enter, rids = step.flat[step.base[rows] + at], step.rids[rows]
            own = (t.owner[enter] == rids) & (t.ref[enter] <= 1)
            self.shared[enter] = ~own
            for j in np.flatnonzero(~own).tolist():
                tok, b = int(self.token[rids[j]]), int(enter[j])
                if b not in self.s_seen[tok]:
                    self.s_seen[tok].add(b)
                    member = t.heat[enter[j : j + 1]] >= self.thr[tok]
                    self._add_shared(enter[j : j + 1], at[j : j + 1], tok, member)
            self._join(enter[own], self.token[rids[own]], t.heat)
        red, scores, rows = step.redrawn
        if len(red):
            shared = self.shared[red]
            self._redrawn_unshared(step, red[~shared], scores[~shared], rows[~shared])
            self._redrawn_shared(red[shared], t.heat)

    def _redrawn_unshared(
        self, step: _Step, red: np.ndarray, scores: np.ndarray, rows: np.ndarray
    ) -> None:
        """Unshared redrawn blocks (of rows ``rows``: their owners) leave their row's pool
        below its threshold, join it above."""
        tok = self.token[step.rids][rows]
        thr = self.thr[tok]
        member = self.cand_of[red] == tok
        self.cand_of[red[member & (scores < thr)]] = NONE
        join = ~member & (scores >= thr)
        red, tok = red[join], tok[join]
        self.cand_of[red] = tok
        self.c_blk = np.concatenate((self.c_blk, red))
        self.c_tok = np.concatenate((self.c_tok, tok))

    def _redrawn_shared(self, red: np.ndarray, heat: np.ndarray) -> None:
        """Every pool holding a redrawn shared block tests its new score."""
        if not len(red):
            return
        self.red_mark[red] = True
        hit = np.flatnonzero(self.red_mark[self.s_blk])
        self.red_mark[red] = False
        self.s_mem[hit] = heat[self.s_blk[hit]] >= self.thr[self.s_tok[hit]]

    def _join(self, blocks: np.ndarray, toks: np.ndarray, heat: np.ndarray) -> None:
        """Unshared ``blocks`` of pools ``toks`` join them if their score makes it."""
        if not len(blocks):
            return
        add = (heat[blocks] >= self.thr[toks]) & (self.cand_of[blocks] != toks)
        blocks, toks = blocks[add], toks[add]
        self.cand_of[blocks] = toks
        self.c_blk = np.concatenate((self.c_blk, blocks))
        self.c_tok = np.concatenate((self.c_tok, toks))

    def _pools(self) -> tuple[np.ndarray, np.ndarray]:
        """Every current pool's blocks (ids, rows); entries of old pools leave (shared ones
        now and then)."""
        blk, tok = self.c_blk, self.c_tok
        c_row = self.row[tok]
        live = (self.cand_of[blk] == tok) & (c_row != NONE)
        self.c_blk, self.c_tok, c_row = blk[live], tok[live], c_row[live]
        if self.calls % 32 == 0:
            keep = self.row[self.s_tok] != NONE
            self.s_blk, self.s_pos = self.s_blk[keep], self.s_pos[keep]
            self.s_tok, self.s_mem = self.s_tok[keep], self.s_mem[keep]
        at = np.flatnonzero(self.s_mem)
        s_row = self.row[self.s_tok[at]]
        ok = s_row != NONE
        blk = np.concatenate((self.c_blk, self.s_blk[at[ok]]))
        return blk, np.concatenate((c_row, s_row[ok]))


def _geometric(rng: np.random.Generator, p: float, n: int) -> np.ndarray:
    """``rng.geometric(p, n)``, the same draws at half the cost: below 1/3 numpy inverts
    a standard exponential per draw, ``ceil(-E / log1p(-p))``; done here in one pass."""
    if p >= 1 / 3:  # numpy searches instead
        return rng.geometric(p, n)
    return np.ceil(rng.standard_exponential(n) / -math.log1p(-p)).astype(np.int64)


class _Step:
    """One call's rows: request ids, blocks (each, and all in one array from ``base``),
    middle ends and k."""

    def __init__(
        self, rids: np.ndarray, seqs: list[np.ndarray], flat: np.ndarray, base: np.ndarray,
        start: np.ndarray, k: np.ndarray,
    ):  # fmt: skip
        self.rids, self.rows, self.seqs = rids, rids.tolist(), seqs
        self.flat, self.base, self.start, self.k = flat, base, start, k
        empty = np.zeros(0, dtype=np.int64)
        self.redrawn = (empty, np.zeros(0), empty)  # blocks, their new scores, their rows


def _read_sets(step: _Step, a: int, hot: list[np.ndarray] | np.ndarray) -> list[np.ndarray]:
    """Each row's sink, its hot set and its window (rows of one array when k is one)."""
    if isinstance(hot, np.ndarray):  # one k: one gather builds every read set
        w = int(step.base[1] - step.base[0] - step.start[0])
        sink = step.flat[step.base[:-1, None] + np.arange(a)]
        window = step.flat[(step.base[:-1] + step.start)[:, None] + np.arange(w)]
        return list(np.concatenate((sink, hot, window), axis=1))
    return [
        np.concatenate((s[:a], h, s[b:]))
        for s, h, b in zip(step.seqs, hot, step.start.tolist(), strict=True)
    ]


def _top_k(
    blk: np.ndarray, row: np.ndarray, heat: np.ndarray, k: np.ndarray
) -> list[np.ndarray] | np.ndarray:
    """Per row, the sorted ids of its ``k`` highest-scoring blocks among ``blk`` (rows
    ``row``); every row has at least ``k``. One k and no tie: rows of one array."""
    rows = len(k)
    order = np.argsort(row.astype(np.int16) if rows < 2**15 else row, kind="stable")  # radix
    blk, row = blk[order], row[order]
    h = heat[blk]
    counts = np.bincount(row, minlength=rows)
    width = int(counts.max())
    first = np.cumsum(counts) - counts
    grid = np.full(rows * width, -np.inf)
    grid[row * width + (np.arange(len(blk)) - first[row])] = h
    grid = grid.reshape(rows, width)
    one = int(k[0]) if k.min() == k.max() else None
    if one == 0:
        return np.zeros((rows, 0), dtype=blk.dtype)
    if one is not None:
        kth = np.partition(grid, width - one, axis=1)[:, width - one]
    else:
        grid.sort(axis=1)
        kth = np.where(k > 0, grid[np.arange(rows), np.maximum(width - k, 0)], np.inf)
    chosen = h >= kth[row]
    ids = blk[chosen]
    if one is not None and len(ids) == rows * one:  # each row took k: no tie at the k-th
        return np.sort(ids.reshape(rows, one), axis=1)
    got = np.bincount(row[chosen], minlength=rows)
    out = np.split(ids, np.cumsum(got)[:-1])
    for i in np.flatnonzero(got != k).tolist():  # a tie at the k-th score: as argpartition
        mine = blk[first[i] : first[i] + counts[i]]
        out[i] = mine[np.argpartition(-heat[mine], k[i] - 1)[: k[i]]] if k[i] else mine[:0]
    return [np.sort(x) for x in out]
