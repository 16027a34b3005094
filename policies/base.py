"""The policy interfaces: eviction, admission and (reserved) prefetch.

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
never creates ghost entries. ``on_evict`` defaults to ``on_remove``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

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


class PrefetchPolicy(Protocol):
    """Reserved: proposes blocks to bring up to a faster tier (implemented with the engine).

    ``waiting`` holds the block keys of each queued request in queue order, ``next_batch``
    those of the requests in the next step, and ``heat`` a per-key heat array (or None).
    The result is ``(key, priority)`` pairs, highest priority first.
    """

    def propose(
        self,
        waiting: Sequence[np.ndarray],
        next_batch: Sequence[np.ndarray],
        heat: np.ndarray | None,
        now: float,
    ) -> list[tuple[int, float]]:
        """Keys to prefetch with their priorities."""
        ...
