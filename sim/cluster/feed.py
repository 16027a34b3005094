"""The arrival feed: hands each request to an instance at its arrival time, one SimPy event
per distinct instant, except those a run of steps has handed over already (a run simulates
ahead of the clock and takes the requests delivered meanwhile itself: :meth:`deliver_before`)."""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import simpy


class Target(Protocol):
    """Who the feed hands requests to (an instance; later a router)."""

    def add(self, rid: int) -> None: ...

    def wake(self) -> None: ...


def delivery_times(arrival_s: np.ndarray) -> np.ndarray:
    """When SimPy delivers each request (arrivals sorted): the arrival process waits
    ``at - now`` after the previous instant, and the clock adds that delay, which does not
    always land exactly on ``at``."""
    times, counts = np.unique(arrival_s, return_counts=True)
    delivered, now = [], 0.0
    for at in times.tolist():
        now = now + (at - now)
        delivered.append(now)
    return np.repeat(np.array(delivered, dtype=np.float64), counts)


class ArrivalFeed:
    """Requests (sorted by arrival) handed to ``target`` in order."""

    def __init__(self, env: simpy.Environment, arrival_s: np.ndarray, target: Target):
        self.env, self.arrival_s, self.target = env, arrival_s, target
        self.delivery_s = delivery_times(arrival_s)
        self.handed = 0  # requests handed over (by the process or by a run)

    @property
    def done(self) -> bool:
        return self.handed == len(self.arrival_s)

    @property
    def next_arrival_s(self) -> float:
        """When SimPy delivers the next request not yet handed over (inf: none is left)."""
        i = self.handed
        return float(self.delivery_s[i]) if i < len(self.delivery_s) else math.inf

    def process(self):
        """The SimPy process: one event per distinct arrival instant."""
        times, starts = np.unique(self.arrival_s, return_index=True)
        bounds = [*starts.tolist(), len(self.arrival_s)]
        for i, at in enumerate(times.tolist()):
            yield self.env.timeout(at - self.env.now)
            first = max(bounds[i], self.handed)
            for rid in range(first, bounds[i + 1]):
                self.target.add(rid)
            self.handed = max(self.handed, bounds[i + 1])
            if first < bounds[i + 1]:
                self.target.wake()

    def deliver_before(self, t: float) -> int:
        """Hand over the requests SimPy delivers before ``t``; how many."""
        first = self.handed
        upto = max(int(np.searchsorted(self.delivery_s, t)), first)
        for rid in range(first, upto):
            self.target.add(rid)
        self.handed = upto
        return upto - first
