"""What the eviction cascade calls on the mode and on the prefetcher, as protocols (they sit
above it in ``sim.kv``: the cascade names them without importing them)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import simpy

from sim.memory.tiers import Tier


class ModeRules(Protocol):
    """A KV mode's rules (:class:`sim.kv.modes.base.Mode`) as other parts see them."""

    hbm_is_cache: bool
    can_swap: bool

    @property
    def home(self) -> Tier: ...

    def hbm_victims(self, victims: list[int]) -> bool: ...

    def left_home(self, blocks: np.ndarray) -> None: ...


class PrefetchHooks(Protocol):
    """The prefetcher (:class:`sim.kv.prefetch.Prefetcher`) as other parts see it."""

    active: bool
    spare: np.ndarray | None
    sessions: np.ndarray | None

    def forget(self, b: int) -> None: ...

    def used(self, blocks: np.ndarray | list[int]) -> None: ...

    def waits(self, blocks: list[int]) -> list[simpy.Event]: ...

    def admitted(self, rid: int, arrival_s: float) -> None: ...
