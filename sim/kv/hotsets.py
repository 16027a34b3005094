"""The sparse model's hot sets, kept from step to step: O(read set + redraws) a step.

The access process is the one :meth:`sim.kv.access.AccessModel.decode_blocks` states: each
step every middle block of a decoding sequence draws a fresh uniform score with probability
``drift``, and the sequence reads the ``k`` middle blocks of highest score. This class draws
and selects without visiting every middle block:

- **Redraws**: the redrawn blocks of all of a step's middles are a Bernoulli(``drift``)
  process over their concatenation; its gaps are geometric, so the positions are the cumsum
  of geometric draws (one draw a redraw), and each gets a fresh uniform score.
- **Selection**: each sequence keeps a *pool* with a threshold ``t`` of its own, chosen when
  the pool is built (a scan of the middle) so that about ``c = k + 4 sqrt(k) + 8`` middle
  blocks score ``t`` or more. The pool is a row of fixed width (:class:`_Rows`) that holds
  every middle block scoring at least ``t`` (its *members*), and may hold others that did
  once (stale entries: harmless, they only take room). If at least ``k`` of the row score
  ``t`` or more, the top-k of the middle is the top-k of the row (every block outside it
  scores below ``t``): so the step's top-k is one gather of its rows, one sort along
  them, and the check that each row's k-th score is at least its ``t`` (a row failing it
  is rebuilt from a scan). A block only changes score when it is redrawn, so a row stays a
  superset of its members if every block that comes to score ``t`` or more joins it: a
  redrawn block joins the row of the sequence that redrew it by its new score, the block
  entering the middle as the window slides joins by its score, and a block shared with
  another running request (``ref > 1``, or taken from another's prefix), which either may
  redraw, has an entry per holding pool, tested by its final score whenever any holder
  redraws it. A block joins a row once (the row marks the middle positions it holds).
  A row that fills is compacted (its stale entries leave); one still full after that is
  rebuilt at the next step.

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
        # middle's end then, and its block list (a new list means a new pool): the list,
        # kept alive here so that its id() names it, and that id
        self.token = np.full(0, NONE, dtype=np.int64)
        self.seen = np.full(0, NONE, dtype=np.int64)
        self.start = np.zeros(0, dtype=np.int64)
        self.lists: dict[int, list[int]] = {}
        self.list_id = np.zeros(0, dtype=np.uint64)
        # per token: its row in the current call and its slot in ``pools`` (NONE: none)
        self.row = np.full(0, NONE, dtype=np.int64)
        self.slot = np.full(0, NONE, dtype=np.int64)
        self.tokens = 0
        self.pools = _Rows()
        # every shared middle block of every pool: (block, position, token)
        self.s_blk = np.zeros(0, dtype=np.int64)
        self.s_pos = np.zeros(0, dtype=np.int64)
        self.s_tok = np.zeros(0, dtype=np.int64)
        self.red_mark = np.zeros(0, dtype=bool)  # per block: redrawn, this call
        self.s_seen: dict[int, set[int]] = {}  # token -> its shared blocks
        self._current = np.zeros(0, dtype=np.int64)  # tokens with a row in this call

    def pool_size(self, k: int) -> int:
        """Blocks a fresh pool holds for ``k``: ``k`` and a margin for the step-to-step
        drift (the pool's size moves like a binomial count about it)."""
        return k + math.ceil(4 * math.sqrt(k)) + 8

    # --- one step ----------------------------------------------------------------------------

    def select(
        self, rids: np.ndarray, lists: list[list[int]], start: np.ndarray, k: np.ndarray,
        table: BlockTable, lengths: np.ndarray, flat: np.ndarray, base: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """What each sequence (row) reads after this step's redraws: its sink, the sorted
        top-k of its middle, its window; every row's in one array, and each row's count.

        Row ``i``'s blocks are ``flat[base[i]:]``'s first ``lengths[i]`` (the middle is
        ``sink_blocks`` up to ``start``); ``lists``: their block lists (a pool lives as long
        as its list); every row has ``k < middle``.
        """
        self.calls += 1
        self._fit(table.capacity, int(rids.max()) + 1)
        self.pools.fit(int(start.max()))
        step = self._step = _Step(rids, flat, base, lengths, start, k)
        self._redraw(step, table.heat)
        fresh = self._stale(step, lists)
        self._mark_rows(step, fresh)
        for i in fresh:
            self._build(step, i, table)
        self._entering(step, fresh, table)
        self.pools.flush()
        hot, full = self._hot(step, table)
        self.seen[rids], self.start[rids] = self.calls, start
        self.seen[rids[full]] = NONE  # rows too full to compact: rebuilt at the next call
        for i in fresh:
            self.lists[step.rows[i]] = lists[i]
        self._current = self.token[rids]
        if self.calls % 32 == 0:
            self._forget_shared()
        if self.calls % 1024 == 0:
            self._prune()
        return _read_sets(step, self.spec.sink_blocks, hot)

    def _hot(self, step: _Step, t: BlockTable) -> tuple[list[np.ndarray] | np.ndarray, np.ndarray]:
        """Each row's top-k (rows short of ``k`` members rebuilt first), and the rows still
        too full after compaction."""
        slots = self.slot[self.token[step.rids]]
        ps, h = self.pools.gather(slots, t.heat)
        kth = _kth(h, step.k)
        short = np.flatnonzero(kth < self.pools.thr[slots]).tolist()
        if short:  # fewer than k score the threshold: a scan
            for i in short:
                self._build(step, i, t)
            slots = self.slot[self.token[step.rids]]
            ps, h = self.pools.gather(slots, t.heat)
            kth = _kth(h, step.k)
        hot = _chosen(ps, h, kth, step.k, self.pools.fill[slots])
        return hot, self.pools.compact(slots, ps, h, t.position)

    def _forget_shared(self) -> None:
        """Drop the shared entries of pools not current."""
        keep = self.row[self.s_tok] != NONE
        self.s_blk, self.s_pos, self.s_tok = self.s_blk[keep], self.s_pos[keep], self.s_tok[keep]

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
        self.list_id = _grown(self.list_id, requests, 0)
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
        row = np.repeat(np.arange(len(middles)), np.diff(np.searchsorted(pos, bounds)))
        pos += a - bounds[row]  # the position in its row's blocks
        blocks = step.flat[pos + step.base[row]]
        scores = self.rng.random(len(blocks))
        heat[blocks] = scores  # a block redrawn twice keeps the last
        step.redrawn = (blocks, scores, row, pos)

    def _stale(self, step: _Step, lists: list[list[int]]) -> list[int]:
        """Rows whose pool must be built: new, not seen at the last call, a new list (by
        id: every list of a row seen at the last call is alive in ``self.lists``), or a
        middle that moved by more than a block."""
        rids = step.rids
        moved = step.start - self.start[rids]
        bad = (self.token[rids] == NONE) | (self.seen[rids] != self.calls - 1)
        bad |= (moved < 0) | (moved > 1)
        ids = np.fromiter(map(id, lists), dtype=np.uint64, count=len(lists))
        bad |= ids != self.list_id[rids]
        self.list_id[rids] = ids
        return np.flatnonzero(bad).tolist()

    def _mark_rows(self, step: _Step, fresh: list[int]) -> None:
        """Tokens of this call's rows map to their rows; every other token is dropped (its
        slot freed)."""
        current = self._current
        self.row[current] = NONE
        tok = self.token[step.rids]
        ok = tok != NONE
        ok[fresh] = False
        self.row[tok[ok]] = np.flatnonzero(ok)
        dead = current[(self.row[current] == NONE) & (self.slot[current] != NONE)]
        self.pools.free.extend(self.slot[dead].tolist())
        self.slot[dead] = NONE

    def _new_token(self, rid: int, row: int) -> int:
        tok = self.tokens
        self.tokens += 1
        self.row = _grown(self.row, self.tokens, NONE)
        self.slot = _grown(self.slot, self.tokens, NONE)
        old = self.token[rid]
        if old != NONE:
            self.row[old] = NONE
            self.s_seen.pop(int(old), None)
            if self.slot[old] != NONE:
                self.pools.free.append(int(self.slot[old]))
                self.slot[old] = NONE
        self.row[tok], self.slot[tok] = row, self.pools.take()
        self.token[rid] = tok
        return tok

    def _build(self, step: _Step, i: int, t: BlockTable) -> None:
        """A fresh pool for row ``i`` from a scan of its middle; tell the owners of blocks it
        took from them that those are shared now."""
        a, rid, seq = self.spec.sink_blocks, step.rows[i], step.seq(i)
        mid = seq[a : step.start[i]]
        h = t.heat[mid]
        c = self.pool_size(int(step.k[i]))
        thr = -math.inf if len(mid) <= c else float(np.partition(h, len(mid) - c)[len(mid) - c])
        tok = self._new_token(rid, i)
        at = np.flatnonzero(h >= thr)
        self.pools.set(int(self.slot[tok]), mid[at], at + a, thr, c, self.spec.drift)
        own = (t.owner[mid] == rid) & (t.ref[mid] <= 1)
        at = np.flatnonzero(~own)
        self.s_seen[tok] = set(mid[at].tolist())
        self._add_shared(mid[at], at + a, tok)
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
        pos = t.position[blocks]  # the same in every list holding a block (a prefix)
        inside = (pos >= self.spec.sink_blocks) & (pos < self._step.start[row])
        known = self.s_seen[tok]  # (the rest join as the window slides past them)
        new = [i for i, b in enumerate(blocks[inside].tolist()) if b not in known]
        if new:
            ids = blocks[inside][new]
            known.update(ids.tolist())
            self._add_shared(ids, pos[inside][new], tok)

    def _add_shared(self, blocks: np.ndarray, positions: np.ndarray, tok: int) -> None:
        """Shared middle blocks of pool ``tok``."""
        self.s_blk = np.concatenate((self.s_blk, blocks))
        self.s_pos = np.concatenate((self.s_pos, positions))
        self.s_tok = np.concatenate((self.s_tok, np.full(len(blocks), tok)))

    def _entering(self, step: _Step, fresh: list[int], t: BlockTable) -> None:
        """Blocks that entered a kept pool's middle (the window slid) or were redrawn in it
        join its row if they score its threshold."""
        pools = self.pools
        slots = self.slot[self.token[step.rids]]
        thr = pools.thr[slots]
        slid = step.start - self.start[step.rids] == 1
        slid[fresh] = False
        rows = np.flatnonzero(slid)
        if len(rows):
            at = step.start[rows] - 1  # the block that entered: the middle's last
            enter, rids = step.flat[step.base[rows] + at], step.rids[rows]
            own = (t.owner[enter] == rids) & (t.ref[enter] <= 1)
            for j in np.flatnonzero(~own).tolist():
                tok, b = int(self.token[rids[j]]), int(enter[j])
                if b not in self.s_seen[tok]:
                    self.s_seen[tok].add(b)
                    self._add_shared(enter[j : j + 1], at[j : j + 1], tok)
            pools.join(slots[rows], at, enter, t.heat[enter] >= thr[rows])
        red, scores, rows, pos = step.redrawn
        if len(red):  # each redraw by its own score for its row, then every holder's
            pools.join(slots[rows], pos, red, scores >= thr[rows])
            self._redrawn_shared(red, t.heat)

    def _redrawn_shared(self, red: np.ndarray, heat: np.ndarray) -> None:
        """Every pool holding a redrawn shared block tests its final score."""
        self.red_mark[red] = True
        hit = np.flatnonzero(self.red_mark[self.s_blk])
        self.red_mark[red] = False
        tok = self.s_tok[hit]
        live = self.row[tok] != NONE
        if not live.all():
            hit, tok = hit[live], tok[live]
        if len(hit):
            blk, slots = self.s_blk[hit], self.slot[tok]
            self.pools.join(slots, self.s_pos[hit], blk, heat[blk] >= self.pools.thr[slots])


class _Rows:
    """The pools as rows of one fixed width, one a slot: block ids (``blk``: the first
    ``fill`` of a row in use, the rest holes), threshold, the size it was built for, and
    the middle positions it holds (``held``, so that a block joins a row once)."""

    def __init__(self) -> None:
        self.blk = np.zeros((0, 0), dtype=np.int64)
        self.held = np.zeros((0, 0), dtype=bool)
        self.fill = np.zeros(0, dtype=np.int64)
        self.thr = np.zeros(0)
        self.size = np.zeros(0, dtype=np.int64)
        self.limit = np.zeros(0, dtype=np.int64)  # compacted past this fill
        self.free: list[int] = []
        self._joins: list[tuple[np.ndarray, np.ndarray]] = []  # (slots, blocks) to append
        self._holes = np.zeros((0, 0), dtype=bool)

    def fit(self, positions: int) -> None:
        """Room in ``held`` for positions below ``positions``."""
        slots, have = self.held.shape
        if positions > have:
            held = np.zeros((slots, max(positions, 2 * have, 64)), dtype=bool)
            held[:, :have] = self.held
            self.held = held

    def _widen(self, width: int) -> None:
        slots, have = self.blk.shape
        if width > have:
            blk = np.zeros((slots, max(width, have + have // 2)), dtype=np.int64)
            blk[:, :have] = self.blk
            self.blk = blk

    def take(self) -> int:
        """A free slot (more rows when none is)."""
        if not self.free:
            have, more = len(self.fill), max(len(self.fill), 16)
            self.blk = np.concatenate((self.blk, np.zeros((more, self.blk.shape[1]), np.int64)))
            self.held = np.concatenate((self.held, np.zeros((more, self.held.shape[1]), bool)))
            self.fill = np.concatenate((self.fill, np.zeros(more, dtype=np.int64)))
            self.thr = np.concatenate((self.thr, np.zeros(more)))
            self.size = np.concatenate((self.size, np.zeros(more, dtype=np.int64)))
            self.limit = np.concatenate((self.limit, np.zeros(more, dtype=np.int64)))
            self.free = list(range(have + more - 1, have - 1, -1))
        return self.free.pop()

    def set(
        self, slot: int, blocks: np.ndarray, positions: np.ndarray, thr: float, size: int,
        drift: float,
    ) -> None:  # fmt: skip
        """Row ``slot`` holds ``blocks`` (at ``positions``) and nothing else; it is compacted
        when it may pass ``2 size + 16`` at the next step (``drift``: its joins' rate)."""
        margin = math.ceil(drift * size + 4 * math.sqrt(drift * size)) + 2
        self.limit[slot] = 2 * size + 16 - margin
        self._widen(max(len(blocks), 2 * size + 16))
        self.held[slot] = False
        self.held[slot, positions] = True
        self.blk[slot, : len(blocks)] = blocks
        self.fill[slot], self.thr[slot], self.size[slot] = len(blocks), thr, size

    def join(
        self, slots: np.ndarray, positions: np.ndarray, blocks: np.ndarray, score: np.ndarray
    ) -> None:
        """``blocks`` (at ``positions`` of rows ``slots``) that score their row's threshold
        (``score``) and are not in it join it (appended at :meth:`flush`)."""
        at = np.flatnonzero(score)
        slots, positions = slots[at], positions[at]
        new = ~self.held[slots, positions]
        slots, positions = slots[new], positions[new]
        self.held[slots, positions] = True
        self._joins.append((slots, blocks[at[new]]))

    def flush(self) -> None:
        """Append the joins to their rows (wider rows if one overflows)."""
        slots = np.concatenate([s for s, _ in self._joins]) if self._joins else self.fill[:0]
        blocks = np.concatenate([b for _, b in self._joins]) if self._joins else slots
        self._joins = []
        if not len(slots):
            return
        order = np.argsort(
            slots.astype(np.int16) if len(self.fill) < 2**15 else slots, kind="stable"
        )
        slots, blocks = slots[order], blocks[order]
        count = np.bincount(slots, minlength=len(self.fill))
        end = self.fill + count
        self._widen(int(end.max()))
        first = np.cumsum(count) - count
        self.blk[slots, self.fill[slots] + (np.arange(len(slots)) - first[slots])] = blocks
        self.fill = end

    def gather(self, slots: np.ndarray, heat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``slots``' blocks and their scores (holes: -inf), as wide as the fullest."""
        fill = self.fill[slots]
        width = int(fill.max())
        ps = self.blk[slots, :width]
        h = heat.take(ps)
        if len(self._holes) <= width:  # row n: the holes of a row filled to n
            self._holes = np.arange(self.blk.shape[1]) >= np.arange(self.blk.shape[1] + 1)[:, None]
        np.copyto(h, -np.inf, where=self._holes[fill, :width])
        return ps, h

    def compact(
        self, slots: np.ndarray, ps: np.ndarray, h: np.ndarray, position: np.ndarray
    ) -> np.ndarray:
        """Drop the stale entries of rows (``slots``, blocks ``ps``, scores ``h``) past
        their limit, and of those half way there with them; the rows (indices into
        ``slots``) still past it after."""
        fill, limit = self.fill[slots], self.limit[slots]
        if not (fill > limit).any():
            return fill[:0]
        size = self.size[slots]
        rows = np.flatnonzero(fill > np.minimum(limit, (size + limit) // 2))
        mine, sub = slots[rows], ps[rows]
        filled = np.arange(ps.shape[1]) < fill[rows, None]
        scored = h[rows] >= self.thr[mine, None]
        keep = filled & scored
        at, col = np.nonzero(filled & ~scored)
        self.held[mine[at], position[sub[at, col]]] = False
        order = np.argsort(~keep, axis=1, kind="stable")
        self.blk[mine, : ps.shape[1]] = np.take_along_axis(sub, order, axis=1)
        self.fill[mine] = kept = keep.sum(axis=1)
        return rows[kept > limit[rows]]


def _geometric(rng: np.random.Generator, p: float, n: int) -> np.ndarray:
    """``rng.geometric(p, n)``, the same draws at half the cost: below 1/3 numpy inverts
    a standard exponential per draw, ``ceil(-E / log1p(-p))``; done here in one pass."""
    if p >= 1 / 3:  # numpy searches instead
        return rng.geometric(p, n)
    return np.ceil(rng.standard_exponential(n) / -math.log1p(-p)).astype(np.int64)


class _Step:
    """One call's rows: request ids, blocks (row ``i``'s are ``flat[base[i]:]``'s first
    ``lengths[i]``), middle ends and k."""

    def __init__(
        self, rids: np.ndarray, flat: np.ndarray, base: np.ndarray, lengths: np.ndarray,
        start: np.ndarray, k: np.ndarray,
    ):  # fmt: skip
        self.rids, self.rows = rids, rids.tolist()
        self.flat, self.base, self.lengths, self.start, self.k = flat, base, lengths, start, k
        empty = np.zeros(0, dtype=np.int64)
        # blocks, their new scores, their rows, their positions in the rows
        self.redrawn = (empty, np.zeros(0), empty, empty)

    def seq(self, i: int) -> np.ndarray:
        """Row ``i``'s blocks."""
        at = int(self.base[i])
        return self.flat[at : at + int(self.lengths[i])]


def _read_sets(
    step: _Step, a: int, hot: list[np.ndarray] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's sink, its hot set and its window, in one array, and each row's count."""
    if isinstance(hot, np.ndarray):  # one k: one gather builds every read set
        w = int(step.lengths[0] - step.start[0])  # every row's window is full (k < middle)
        sink = step.flat[step.base[:, None] + np.arange(a)]
        window = step.flat[(step.base + step.start)[:, None] + np.arange(w)]
        sets = np.concatenate((sink, hot, window), axis=1)
        return sets.ravel(), np.full(len(sets), sets.shape[1], dtype=np.int64)
    rows = [
        np.concatenate((s[:a], h, s[b:]))
        for s, h, b in zip(map(step.seq, range(len(hot))), hot, step.start.tolist(), strict=True)
    ]
    return np.concatenate(rows), np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))


def _kth(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Each row's ``k``-th highest score (``inf`` where ``k`` is 0): a sort along the rows
    (numpy's vectorised sort outruns its partition here)."""
    rows, width = h.shape
    ordered = np.sort(h, axis=1)
    if k.min() == k.max():
        return ordered[:, width - int(k[0])] if k[0] else np.full(rows, np.inf)
    return np.where(k > 0, ordered[np.arange(rows), np.maximum(width - k, 0)], np.inf)


def _chosen(
    ps: np.ndarray, h: np.ndarray, kth: np.ndarray, k: np.ndarray, fill: np.ndarray
) -> list[np.ndarray] | np.ndarray:
    """Per row, the sorted ids of its ``k`` highest-scoring blocks (``ps``, scores ``h``,
    k-th ``kth``). One k and no tie at the k-th score: rows of one array."""
    rows = len(k)
    one = int(k[0]) if k.min() == k.max() else None
    if one == 0:
        return np.zeros((rows, 0), dtype=ps.dtype)
    chosen = h >= kth[:, None]
    ids = ps.ravel().compress(chosen.ravel())
    if one is not None and len(ids) == rows * one:  # each row took k: no tie at the k-th
        return np.sort(ids.reshape(rows, one), axis=1)
    got = chosen.sum(axis=1)
    out = np.split(ids, np.cumsum(got)[:-1])
    for i in np.flatnonzero(got != k).tolist():  # a tie at the k-th score: as argpartition
        mine, n = ps[i, : fill[i]], int(k[i])
        out[i] = mine[np.argpartition(-h[i, : fill[i]], n - 1)[:n]] if n else mine[:0]
    return [np.sort(x) for x in out]
