"""What a router sees, and the router interface.

A router picks an engine instance for each arriving request. Like an eviction policy it
never sees the engine: the cluster hands it a :class:`RouteRequest` and one
:class:`InstanceSnapshot` per instance, plain ints and numpy arrays built per decision.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from policies.base import Param

TIERS = ("hbm", "dram", "ssd", "pool")
"""Tier indices of :attr:`InstanceSnapshot.prefix_tiers`: 0 HBM, 1 DRAM, 2 SSD, 3 the
cluster-wide pool."""

PrefixLookup = Callable[[np.ndarray], np.ndarray]
"""``lookup(hashes) -> tiers``: for a request's prefix block hashes (uint64, in prefix
order), the tier index (0..3, int8) of each *leading* block the instance holds; the array
ends at the first block it does not hold, as a prefix match does."""


def _holds_nothing(hashes: np.ndarray) -> np.ndarray:
    return np.zeros(0, dtype=np.int8)


def lookup_from_mapping(tiers: Mapping[int, int]) -> PrefixLookup:
    """A :data:`PrefixLookup` over a ``block hash -> tier index`` mapping."""

    def lookup(hashes: np.ndarray) -> np.ndarray:
        out: list[int] = []
        for key in hashes.tolist():
            tier = tiers.get(key)
            if tier is None:
                break
            out.append(tier)
        return np.asarray(out, dtype=np.int8)

    return lookup


@dataclass(frozen=True)
class RouteRequest:
    """The request being routed.

    Attributes:
        request_id: the request's id.
        prompt_tokens: its prompt length in tokens.
        session: its session (conversation) id, or -1 for none.
        block_hashes: its prompt's full-block prefix hashes (uint64, in prefix order).
        block_tokens: tokens per block.
    """

    request_id: int
    prompt_tokens: int
    session: int = -1
    block_hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    block_tokens: int = 16

    @property
    def blocks(self) -> int:
        """Blocks the prompt takes, a partial last block included."""
        return -(-self.prompt_tokens // self.block_tokens)


@dataclass(frozen=True)
class InstanceSnapshot:
    """One instance as the router sees it at the decision (counts, never the engine).

    Attributes:
        index: the instance's index in the cluster (what ``route`` returns).
        waiting: requests queued, not yet admitted.
        running: requests admitted (prefilling or decoding).
        outstanding_tokens: over its waiting and running requests, the prompt tokens still
            to compute (cached prefix excluded) plus the output tokens still to produce.
        prefill_blocks: blocks of prompt still to compute over those requests (ceil of the
            tokens over ``block_tokens`` per request).
        decode_blocks: KV blocks held by its running requests.
        kv_used: HBM KV blocks in use (running requests' and cached ones).
        kv_capacity: HBM KV blocks in all (> 0).
        cached_blocks: prefix blocks its prefix cache holds, in every tier.
        prefix_tiers: which leading blocks of a prefix it holds, in which tier
            (:data:`PrefixLookup`; the cluster binds it to the instance's prefix index).
        prefill_tokens: prompt tokens still to compute over its waiting and running
            requests (cached prefix excluded).
        prefill_s_per_token: the cost model's estimate of a prompt token's prefill time
            (a full token budget of prefill, divided by its tokens); 0 where not given.
        block_fetch_s: seconds to bring one block of a cached prefix from each tier of
            :data:`TIERS` (hbm, dram, ssd, pool) to where attention reads it, at the links'
            bandwidths, alone on them; zeros where not given.
    """

    index: int
    waiting: int = 0
    running: int = 0
    outstanding_tokens: int = 0
    prefill_blocks: int = 0
    decode_blocks: int = 0
    kv_used: int = 0
    kv_capacity: int = 1
    cached_blocks: int = 0
    prefix_tiers: PrefixLookup = _holds_nothing
    prefill_tokens: int = 0
    prefill_s_per_token: float = 0.0
    block_fetch_s: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    @property
    def requests(self) -> int:
        """Waiting plus running requests."""
        return self.waiting + self.running


class Router(ABC):
    """Picks an instance for each request from per-instance snapshots.

    Subclasses set ``name`` and ``params`` (validated by the registry, as for eviction
    policies) and draw every random number from ``self.rng``. Ties go to the lowest index
    unless a router says otherwise. A router may keep state between calls (a counter, a
    session table); the cluster calls ``route`` once per request, in arrival order.
    """

    name: ClassVar[str] = ""
    params: ClassVar[Mapping[str, Param]] = MappingProxyType({})

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        # NOTE: a fixed seed, not fresh entropy, so that a run without one is reproducible
        self.rng = rng if rng is not None else np.random.default_rng(0)

    @abstractmethod
    def route(self, request: RouteRequest, instances: Sequence[InstanceSnapshot]) -> int:
        """The chosen instance's ``index`` (``instances`` is non-empty)."""


def choice(default: str, options: Sequence[str]) -> Param:
    """One of ``options`` (a string)."""
    allowed = tuple(options)
    return Param(default, "one of " + ", ".join(allowed), lambda v: v in allowed)


def _is_credits(value: Any) -> bool:
    if not isinstance(value, Mapping) or not set(value) <= set(TIERS):
        return False
    return all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1
        for v in value.values()
    )


def credits_param(default: Mapping[str, float]) -> Param:
    """A ``tier -> credit`` mapping (tiers among hbm, dram, ssd, pool; credits in [0, 1])."""
    expected = "a mapping of hbm, dram, ssd, pool to numbers in [0, 1]"
    return Param(MappingProxyType(dict(default)), expected, _is_credits)
