"""The policy interfaces: eviction, admission and prefetch.

A policy sees block ids (non-negative ints, called *keys*) and numpy arrays, never the
engine. The pool (a tier, or the replay loop in :mod:`policies.pool`) owns capacity and
residency; a policy only orders the keys it was told about and picks victims.

The call protocol for one access of ``key`` at time ``now`` in a demand-cached pool::

    hit:   policy.on_access(key, now)
    miss:  policy.on_miss(key, now)                    # optional hook, default no-op
           if the pool is full:
               for v in policy.victims(k, pinned):     # pure: nothing is forgotten yet
                   <pool drops v>; policy.on_evict(v)  # the policy forgets v here
           policy.on_insert(key, now)

**The victim rule.** ``victims()`` is pure: it changes no policy state (a policy may
memoise the plan it computed so that ``on_evict`` can apply it). It returns up to ``n``
distinct resident keys, best victim first, never a pinned key. The pool evicts them in
the order given (it may stop early) and calls ``on_evict(v)`` for each one, which is
where the policy forgets ``v`` (and where ARC and S3-FIFO remember it in a ghost list,
GreedyDual and LFU-DA raise their inflation value). A removal that is not an eviction
(a request frees its blocks, a block moves to another tier) is ``on_remove(v)``, which
never creates ghost entries. ``on_evict`` defaults to ``on_remove``. A pool that evicts
every victim it is given may call ``evict(n, pinned)``: ``victims`` then ``on_evict`` each
(a policy may do both in one pass).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

PinnedMask = np.ndarray | None
"""A numpy bool array indexed by key (keys past its end are unpinned), or None."""


def pinned_predicate(pinned: PinnedMask) -> Callable[[int], bool]:
    """A fast ``is_pinned(key)`` test for a pinned mask."""
    if pinned is None or len(pinned) == 0:
        return lambda key: False
    size = len(pinned)
    return lambda key: key < size and bool(pinned[key])


@dataclass(frozen=True)
class Param:
    """One user-settable policy parameter: its default, a check, and what it expects."""

    default: Any
    expected: str
    check: Callable[[Any], bool]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def fraction(default: float, *, closed: bool = False) -> Param:
    """A number in (0, 1), or in [0, 1] when ``closed``."""
    if closed:
        return Param(default, "a number in [0, 1]", lambda v: _is_number(v) and 0 <= v <= 1)
    return Param(default, "a number in (0, 1)", lambda v: _is_number(v) and 0 < v < 1)


def positive(default: float) -> Param:
    """A number > 0."""
    return Param(default, "a number > 0", lambda v: _is_number(v) and v > 0)


def non_negative(default: float) -> Param:
    """A number >= 0."""
    return Param(default, "a number >= 0", lambda v: _is_number(v) and v >= 0)


def positive_int(default: int | None) -> Param:
    """An integer >= 1."""
    return Param(default, "an integer >= 1", lambda v: _is_number(v) and v >= 1 and v == int(v))


def param_table(**params: Param) -> Mapping[str, Param]:
    """A read-only ``name -> Param`` table for a policy's ``params``."""
    return MappingProxyType(params)


def boolean(default: bool) -> Param:
    """true or false."""
    return Param(default, "true or false", lambda v: isinstance(v, bool))


class EvictionPolicy(ABC):
    """Orders resident keys and picks victims; see the module docstring for the protocol.

    Subclasses set ``name`` and ``params`` (user-settable parameters, validated by the
    registry) and may take the context arguments ``capacity``, ``rng``, ``future`` and
    ``cost`` in their constructor; the registry passes those it has.
    """

    name: ClassVar[str] = ""
    params: ClassVar[Mapping[str, Param]] = MappingProxyType({})
    # NOTE: True when an access puts a key where a fresh insert would (LRU): a pool may then
    # forget a key while it is in use (``on_remove``) and re-insert it when the use ends,
    # instead of keeping it in the order and pinning it at every ``victims()`` call.
    access_is_insert: ClassVar[bool] = False
    # NOTE: True when the policy defines ``on_hold(key)`` (a resident key is in use again: take
    # it out of the order, keep its history) and ``on_release(key, now)`` (the use ended: put it
    # back, the use counted as an access); ``on_remove`` also forgets a held key. A pool then
    # holds keys this way instead of pinning them at every ``victims()`` call, which is slow
    # for a policy that walks and re-queues each pinned key (S3-FIFO).
    hold_hooks: ClassVar[bool] = False

    @abstractmethod
    def on_insert(self, key: int, now: float = 0.0) -> None:
        """``key`` became resident (a miss was inserted)."""

    @abstractmethod
    def on_access(self, key: int, now: float = 0.0) -> None:
        """A resident ``key`` was accessed (a hit)."""

    @abstractmethod
    def on_remove(self, key: int) -> None:
        """Forget a resident ``key`` that left the pool without being evicted."""

    def on_evict(self, key: int) -> None:
        """Forget ``key``: the pool evicted it, as the last ``victims()`` call proposed."""
        self.on_remove(key)

    def on_remove_many(self, keys: Sequence[int]) -> None:
        """:meth:`on_remove` each of ``keys``, in order (a policy may do it in one go)."""
        for key in keys:
            self.on_remove(key)

    def on_evict_many(self, keys: Sequence[int]) -> None:
        """:meth:`on_evict` each of ``keys``, in order (a policy may do it in one go)."""
        for key in keys:
            self.on_evict(key)

    def evict(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """Up to ``n`` victims, forgotten: :meth:`victims`, then :meth:`on_evict` each.

        A pool that evicts every victim it is given calls this; a policy that plans on
        shadows may override it to take its steps on its own queues, in one pass.
        """
        victims = self.victims(n, pinned)
        self.on_evict_many(victims)
        return victims

    def insert_evicting(
        self, keys: Sequence[int], free: int, now: float = 0.0, pinned: PinnedMask = None,
        stop: Container[int] = (),
    ) -> tuple[int, list[int]]:  # fmt: skip
        """:meth:`on_insert` each of ``keys`` (new ones), in order, into a pool with ``free``
        free slots: once none is free, each insert first evicts one victim (:meth:`evict`,
        ``pinned`` as given). The pool must have a victim for each (an evictable key, or
        room: each insert adds one). Stops after the insert whose victim is in ``stop``.

        Returns (how many of ``keys`` went in, their victims in order): the first ``free``
        evicted none, each later one exactly one. A policy may do it in one pass.
        """
        victims: list[int] = []
        done = 0
        for key in keys:
            if free > 0:
                free -= 1
                self.on_insert(key, now)
                done += 1
                continue
            (victim,) = self.evict(1, pinned)
            victims.append(victim)
            self.on_insert(key, now)
            done += 1
            if victim in stop:
                break
        return done, victims

    def on_miss(self, key: int, now: float = 0.0) -> None:  # noqa: B027  # optional hook
        """A lookup of ``key`` missed; called before ``victims()`` makes room for it."""

    def on_request(self, keys: Sequence[int], now: float = 0.0) -> None:  # noqa: B027
        """The ordered blocks of one request, told before they are accessed (optional hook)."""

    @abstractmethod
    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """Up to ``n`` distinct resident, unpinned keys, best victim first; changes no state."""


class AdmissionPolicy(ABC):
    """Decides whether a missed key enters the pool at all."""

    name: ClassVar[str] = ""
    params: ClassVar[Mapping[str, Param]] = MappingProxyType({})

    @abstractmethod
    def admit(self, key: int, now: float = 0.0) -> bool:
        """True if ``key`` should be inserted; may update the policy's own memory."""


@dataclass(frozen=True)
class PrefetchView:
    """What the scheduler knows before a step, as ids and arrays (never the engine).

    Attributes:
        now: simulated time, seconds.
        waiting: per queued request (queue order, first ``depth`` of them), its cached
            prefix blocks that are not in HBM, in prefix order.
        batch: per sequence decoding in the next step, the blocks its top-k part picks from.
        topk: per ``batch`` entry, how many of those blocks attention reads.
        heat: per-block heat score of the access model (indexed by key), or None.
    """

    now: float
    waiting: Sequence[np.ndarray] = ()
    batch: Sequence[np.ndarray] = ()
    topk: Sequence[int] = ()
    heat: np.ndarray | None = None


class PrefetchPolicy(ABC):
    """Proposes blocks to bring up to HBM ahead of use; the engine moves them if room allows.

    ``propose`` returns ``(key, priority)`` pairs; the engine fetches them highest priority
    first, within the policy's byte budget (``max_bytes_per_step``, 0 = no limit) and the HBM
    room that no running request pins. The session hooks serve policies that keep or
    pre-stage a conversation's blocks between its turns (``protected``).
    """

    name: ClassVar[str] = ""
    params: ClassVar[Mapping[str, Param]] = MappingProxyType({})
    max_bytes_per_step: float = 0.0
    lookahead: int = 0  # waiting requests whose blocks ``view.waiting`` should list
    wants_batch: ClassVar[bool] = False  # fill ``view.batch``/``topk`` (costs a pass per step)
    wants_sessions: ClassVar[bool] = False  # call the session hooks

    @abstractmethod
    def propose(self, view: PrefetchView) -> list[tuple[int, float]]:
        """Keys to bring up before the next step, with their priorities."""

    def on_turn_end(self, session: int, keys: np.ndarray, now: float) -> None:  # noqa: B027
        """A session's turn finished; ``keys`` are its cached blocks (optional hook)."""

    def on_turn_start(self, session: int, now: float) -> None:  # noqa: B027
        """A session's next turn arrived at ``now`` (optional hook)."""

    def protected(self, now: float) -> np.ndarray:
        """Keys that eviction should spare while other victims exist (default: none)."""
        return np.zeros(0, dtype=np.int64)
