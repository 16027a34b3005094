"""Prefetch policies: which blocks to bring up to HBM before a step needs them.

- ``none``: on demand; a step fetches what it reads (the engine's default).
- ``queue_lookahead``: while requests wait, stage their cached prefix blocks found in DRAM or
  SSD, queue head first (AttentionStore's scheduler-aware prefetch; Mooncake's prefix loads).
- ``heat``: for the sequences decoding next, the top-k blocks by an EMA of the access model's
  heat score (Omni Cache token heat; InfiniGen speculates the same set from attention scores).
- ``next_turn``: after a conversation's turn ends, spare its blocks from eviction and
  re-stage them shortly before its next turn is expected, from the think times observed so far
  (AttentionStore keeps sessions' KV the same way).

A policy sees keys and numpy arrays only (:class:`policies.base.PrefetchView`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from policies.base import (
    PrefetchPolicy,
    PrefetchView,
    fraction,
    non_negative,
    param_table,
    positive,
    positive_int,
)

BUDGET = non_negative(0.0)  # max_bytes_per_step: bytes a step may start fetching, 0 = no limit


class NoPrefetch(PrefetchPolicy):
    """On demand: nothing is fetched before a step reads it."""

    name = "none"

    def propose(self, view: PrefetchView) -> list[tuple[int, float]]:
        """Nothing."""
        return []


class QueueLookahead(PrefetchPolicy):
    """Stage the lower-tier prefix blocks of the first ``depth`` waiting requests, head first."""

    name = "queue_lookahead"
    params = param_table(depth=positive_int(4), max_bytes_per_step=BUDGET)

    def __init__(self, depth: int = 4, max_bytes_per_step: float = 0.0):
        self.lookahead = int(depth)
        self.max_bytes_per_step = float(max_bytes_per_step)

    def propose(self, view: PrefetchView) -> list[tuple[int, float]]:
        """Queue order, then prefix order (an earlier block is needed first)."""
        out: list[tuple[int, float]] = []
        for i, keys in enumerate(view.waiting[: self.lookahead]):
            out.extend((int(k), float(-i)) for k in keys)
        return out


class HeatPredictive(PrefetchPolicy):
    """Per decoding sequence, its top-k blocks by heat EMA and a ``margin`` of runners-up: the
    set the next decode step should read (``alpha`` = 1: the current score, no smoothing)."""

    name = "heat"
    params = param_table(
        alpha=fraction(1.0, closed=True), margin=non_negative(0.25), max_bytes_per_step=BUDGET
    )
    wants_batch = True

    def __init__(self, alpha: float = 1.0, margin: float = 0.25, max_bytes_per_step: float = 0.0):
        if alpha <= 0:
            raise ValueError("heat prefetch: alpha must be > 0 (0 would never learn)")
        self.alpha = float(alpha)
        self.margin = float(margin)
        self.max_bytes_per_step = float(max_bytes_per_step)
        self._ema = np.zeros(0)
        self._seen = np.zeros(0, dtype=np.int64)  # call number that last updated each key
        self._calls = 0

    def _update(self, keys: np.ndarray, heat: np.ndarray) -> np.ndarray:
        """EMA of each key's heat; a key not updated in the previous call starts afresh."""
        if len(heat) > len(self._ema):
            grow = len(heat) - len(self._ema)
            self._ema = np.concatenate((self._ema, np.zeros(grow)))
            self._seen = np.concatenate((self._seen, np.full(grow, -2, dtype=np.int64)))
        fresh = self._seen[keys] < self._calls - 1  # NOTE: keys are recycled ids
        old = np.where(fresh, heat[keys], self._ema[keys])
        self._ema[keys] = self.alpha * heat[keys] + (1 - self.alpha) * old
        self._seen[keys] = self._calls
        return self._ema[keys]

    def propose(self, view: PrefetchView) -> list[tuple[int, float]]:
        """Per sequence, its top ``k x (1 + margin)`` keys by EMA (those just below the cut
        may enter the next top-k), priority = the EMA."""
        self._calls += 1
        if view.heat is None:
            return []
        out: list[tuple[int, float]] = []
        for keys, k in zip(view.batch, view.topk, strict=True):
            if len(keys) == 0 or k <= 0:
                continue
            ema = self._update(keys, view.heat)
            top = np.argsort(-ema, kind="stable")[: k + math.ceil(self.margin * k)]
            out.extend(zip(keys[top].tolist(), ema[top].tolist(), strict=True))
        return out


@dataclass
class _Ended:
    at: float
    keys: np.ndarray
    staged: bool = False


class NextTurn(PrefetchPolicy):
    """Keep a finished turn's blocks, and re-stage them before the expected next turn.

    The next turn is expected ``think`` seconds after a turn ends, where ``think`` is the mean
    gap observed so far between a turn's end and its session's next arrival
    (``initial_think_s`` until one is seen). Blocks are spared from eviction until
    ``keep_factor x think`` after the end, and staged back (once) at ``(1 - lead) x think``.
    """

    name = "next_turn"
    params = param_table(
        initial_think_s=positive(30.0),
        keep_factor=positive(2.0),
        lead=fraction(0.5, closed=True),
        max_bytes_per_step=BUDGET,
    )
    wants_sessions = True

    def __init__(
        self, initial_think_s: float = 30.0, keep_factor: float = 2.0, lead: float = 0.5,
        max_bytes_per_step: float = 0.0,
    ):  # fmt: skip
        self.initial_think_s = float(initial_think_s)
        self.keep_factor = float(keep_factor)
        self.lead = float(lead)
        self.max_bytes_per_step = float(max_bytes_per_step)
        self._ended: dict[int, _Ended] = {}
        self._gaps = 0.0
        self._count = 0

    @property
    def think_s(self) -> float:
        """Expected gap between a turn's end and the session's next turn."""
        return self._gaps / self._count if self._count else self.initial_think_s

    def on_turn_end(self, session: int, keys: np.ndarray, now: float) -> None:
        """Remember the session's blocks and when its turn ended."""
        self._ended[session] = _Ended(now, np.asarray(keys, dtype=np.int64))

    def on_turn_start(self, session: int, now: float) -> None:
        """Learn the gap; the session no longer needs keeping."""
        ended = self._ended.pop(session, None)
        if ended is not None and now >= ended.at:
            self._gaps += now - ended.at
            self._count += 1

    def _expire(self, now: float) -> None:
        limit = self.keep_factor * self.think_s
        for session in [s for s, e in self._ended.items() if now - e.at > limit]:
            del self._ended[session]

    def protected(self, now: float) -> np.ndarray:
        """Blocks of every session still expected back."""
        self._expire(now)
        if not self._ended:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([e.keys for e in self._ended.values()])

    def propose(self, view: PrefetchView) -> list[tuple[int, float]]:
        """Blocks of sessions within ``lead x think`` of their expected turn, soonest first."""
        self._expire(view.now)
        think = self.think_s
        out: list[tuple[int, float]] = []
        for e in self._ended.values():
            due = e.at + think
            if not e.staged and view.now >= due - self.lead * think:
                e.staged = True  # once per turn: what eviction takes later stays taken
                out.extend((int(k), -due) for k in e.keys)
        return out


PREFETCHERS: tuple[type[PrefetchPolicy], ...] = (
    NoPrefetch,
    QueueLookahead,
    HeatPredictive,
    NextTurn,
)
