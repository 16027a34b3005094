"""Length-aware LFU: like LFU, but keeps blocks that occur later in requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.base import param_table
from policies.lfu import LFU


class LengthAware(LFU):
    """LFU whose ties go to the block that occurs *earliest* in its request.

    After Mooncake (Qin et al., FAST'25, arXiv:2407.00079 §4.2, "LengthAwareCache"). Each
    key has a position hint: its block index in the request that last announced it through
    ``on_request`` (or ``set_position``); unknown keys have position 0. Hints outlive
    evictions (a request may evict a block it announced before reaching it), so they take
    memory per distinct key. Eviction order: smallest ``(count, position, last-access tick)``.
    """

    name = "length_aware"
    params = param_table()

    def __init__(self) -> None:
        super().__init__(aging=False)
        self._position: dict[int, int] = {}

    def set_position(self, key: int, position: int) -> None:
        """Record that ``key`` occurs at block index ``position`` of a request."""
        self._position[key] = position
        if key in self._heap:
            self._heap.set(key, (self._freq[key], position, self._heap.prio[key][2]))

    def on_request(self, keys: Sequence[int], now: float = 0.0) -> None:
        """Record each block's index in the request as its position hint."""
        for position, key in enumerate(keys):
            self.set_position(key, position)

    def _priority(self, key: int) -> tuple[Any, ...]:
        return (self._freq[key], self._position.get(key, 0), self._tick)

    # NOTE: no fused replay loop: position hints need the request structure.
    fast_replay = None  # type: ignore[assignment]
