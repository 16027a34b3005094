"""The arrival feed: hands each request to an instance at its arrival time, one SimPy event
per distinct instant, except those a run of steps has handed over already (a run simulates
ahead of the clock and takes the requests delivered meanwhile itself: :meth:`deliver_before`).

A request reaches the scheduler its front-end latency after it was sent (``engine.
frontend_latency`` + ``frontend_token_latency`` x its prompt tokens: HTTP, chat template,
tokenization), in the order sent; its latencies count from the send, as a client's do."""

from __future__ import annotations

import heapq
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


def reach_times(sent_s: np.ndarray, frontend_s: np.ndarray | None) -> np.ndarray:
    """When requests sent at ``sent_s`` (sorted) reach the scheduler: each its front-end
    time later, none before the one sent ahead of it (the front end keeps their order)."""
    if frontend_s is None:
        return sent_s
    return np.maximum.accumulate(sent_s + frontend_s)


class ArrivalFeed:
    """Requests (sorted by arrival) handed to ``target`` in order, each its front-end time
    (``frontend_s``, none: 0) after it arrived."""

    def __init__(
        self, env: simpy.Environment, arrival_s: np.ndarray, target: Target,
        frontend_s: np.ndarray | None = None,
    ):  # fmt: skip
        self.env, self.arrival_s, self.target = env, arrival_s, target
        self.reach_s = reach_times(arrival_s, frontend_s)
        self.delivery_s = delivery_times(self.reach_s)
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
        """The SimPy process: one event per distinct instant a request reaches the scheduler."""
        times, starts = np.unique(self.reach_s, return_index=True)
        bounds = [*starts.tolist(), len(self.reach_s)]
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


class ClosedLoopFeed:
    """Requests sent by a closed-loop client of ``concurrency`` slots (``workload.
    max_concurrency``; vLLM's ``benchmark_serving --max-concurrency``): in order, each at its
    arrival time or when a slot frees, whichever is later. A slot frees when a request
    finishes or is rejected (:meth:`freed`, the instances' schedulers call it). A request's
    ``arrival_s`` becomes the moment it was sent, so its latencies count from there, as the
    client measures them; it reaches the scheduler its front-end time (``frontend_s``) later,
    not before the one sent ahead of it."""

    def __init__(
        self, env: simpy.Environment, arrival_s: np.ndarray, target: Target, concurrency: int,
        frontend_s: np.ndarray | None = None,
    ):  # fmt: skip
        self.env, self.arrival_s, self.target = env, arrival_s, target
        self.earliest_s = arrival_s.copy()  # the workload's times: not sent before them
        self.frontend_s = np.zeros(len(arrival_s)) if frontend_s is None else frontend_s
        self.slots = [0.0] * concurrency  # when each free slot freed (a heap)
        self.handed = 0
        self.reached_s = 0.0  # when the last request reached the scheduler
        self._wake: simpy.Event | None = None

    @property
    def done(self) -> bool:
        return self.handed == len(self.earliest_s)

    @property
    def _next_sent_s(self) -> float:
        """When the next request is sent (inf: none is left, or no slot is free yet)."""
        if self.done or not self.slots:
            return math.inf
        return max(float(self.earliest_s[self.handed]), self.slots[0])

    def _reach(self, sent: float) -> float:
        """When the next request, sent at ``sent``, reaches the scheduler."""
        if sent == math.inf:
            return sent
        return max(sent + float(self.frontend_s[self.handed]), self.reached_s)

    @property
    def next_arrival_s(self) -> float:
        """When the next request reaches the scheduler (inf: none is left, or no slot is free
        yet)."""
        return self._reach(self._next_sent_s)

    def freed(self, count: int, at: float | None) -> None:
        """``count`` requests left the engine at ``at`` (None: as they reached it)."""
        for _ in range(count):
            heapq.heappush(self.slots, self.reached_s if at is None else at)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _hand(self, before: float, inclusive: bool) -> int:
        """Send, in order, the requests that reach the scheduler before ``before`` (or at
        it); how many."""
        handed = 0
        while (at := self._reach(sent := self._next_sent_s)) < before or (
            inclusive and at == before
        ):
            rid = self.handed
            self.arrival_s[rid] = sent
            heapq.heappop(self.slots)
            self.reached_s = at
            self.handed += 1
            self.target.add(rid)  # a rejection frees its slot at once (freed)
            handed += 1
        return handed

    def process(self):
        """The SimPy process: sleeps until the next send or until a slot frees."""
        env = self.env
        while not self.done:
            at = self.next_arrival_s
            if at > env.now:
                self._wake = env.event()
                events = [self._wake] if at == math.inf else [self._wake, env.timeout(at - env.now)]
                yield env.any_of(events)
                self._wake = None
            elif self._hand(env.now, inclusive=True):
                self.target.wake()

    def deliver_before(self, t: float) -> int:
        """Send the requests due before ``t`` (a run of steps simulates ahead); how many."""
        return self._hand(t, inclusive=False)
