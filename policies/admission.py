"""Admission policies: whether a missed key enters the pool at all."""

from __future__ import annotations

from collections import OrderedDict

from policies.base import AdmissionPolicy, non_negative, param_table, positive_int
from policies.gds import CostSource, cost_function


class AlwaysAdmit(AdmissionPolicy):
    """Admit every key (demand caching)."""

    name = "always"

    def admit(self, key: int, now: float = 0.0) -> bool:
        """Always True."""
        return True


class SecondHit(AdmissionPolicy):
    """Admit a key on its second miss; a bounded FIFO ghost list remembers first misses.

    ``ghost_size`` defaults to the pool capacity. A key admitted leaves the ghost list.
    """

    name = "second_hit"
    params = param_table(ghost_size=positive_int(None))

    def __init__(self, ghost_size: int | None = None, capacity: int | None = None) -> None:
        size = ghost_size if ghost_size is not None else capacity
        if size is None:
            raise ValueError("admission policy 'second_hit' needs ghost_size or capacity")
        self.ghost_size = size
        self._ghost: OrderedDict[int, None] = OrderedDict()

    def admit(self, key: int, now: float = 0.0) -> bool:
        """True if ``key`` is in the ghost list; else remember it and say no."""
        if key in self._ghost:
            del self._ghost[key]
            return True
        self._ghost[key] = None
        if len(self._ghost) > self.ghost_size:
            self._ghost.popitem(last=False)
        return False


class Threshold(AdmissionPolicy):
    """Admit a key iff its cost is at least ``min_cost`` (blocks have one size, so cost decides)."""

    name = "threshold"
    params = param_table(min_cost=non_negative(0.0))

    def __init__(self, min_cost: float = 0.0, cost: CostSource = None) -> None:
        self.min_cost = min_cost
        self._cost = cost_function(cost)

    def admit(self, key: int, now: float = 0.0) -> bool:
        """``cost(key) >= min_cost``."""
        return self._cost(key) >= self.min_cost
