"""The router's side of a disaggregated cluster: at its arrival each request goes to the
decode instance the decode router picks; the decider says whether it prefills there too
or on the prefill instance the prefill router picks (:mod:`sim.cluster.handoff` then
moves its KV)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from policies.routing.base import Router
from sim.cluster.dispatch import Dispatcher
from sim.cluster.feed import ArrivalFeed
from sim.cluster.handoff import Handoffs
from sim.config.cluster import Disaggregation, PrefixThreshold
from sim.instance.instance import Instance
from sim.instance.scheduler import WAITING
from sim.workload.requests import Requests


class DisaggDispatcher:
    """Routes each arrival to a decode instance and, if the decider splits it, a prefill
    instance; ``instance_of`` is where each request decodes."""

    def __init__(
        self, instances: Sequence[Instance], roles: Sequence[str], routers: tuple[Router, Router],
        intervals: tuple[float, float], requests: Requests, spec: Disaggregation,
        handoffs: Handoffs,
    ):  # fmt: skip
        self.instances, self.requests, self.handoffs = instances, requests, handoffs
        self.prefill = [i for i, role in enumerate(roles) if role == "prefill"]
        self.decode = [i for i, role in enumerate(roles) if role == "decode"]
        pick = [self.prefill, self.decode]
        self._routers = [
            Dispatcher([instances[i] for i in pick[r]], routers[r], requests, intervals[r])
            for r in range(2)
        ]
        self.decider = spec.decider
        self.instance_of = np.full(len(requests), -1, dtype=np.int64)
        self._woken: set[int] = set()

    def add(self, rid: int) -> None:
        """Route ``rid``: its decode instance, and its prefill instance if split."""
        d = self.decode[self._routers[1].pick(rid)]
        self.instance_of[rid] = d
        self.instances[d].add(rid)
        self._woken.add(d)
        if self.instances[d].scheduler.status[rid] == WAITING and self._split(rid, d):
            p = self.prefill[self._routers[0].pick(rid)]
            if int(self.requests.prompt_tokens[rid]) + 1 <= self.instances[p].scheduler.max_len:
                self.handoffs.route(rid, p, d)  # (a prompt too long for p: d does it all)

    def wake(self) -> None:
        """Wake the decode instances that got requests at this instant."""
        for i in sorted(self._woken):
            self.instances[i].wake()
        self._woken.clear()

    def _split(self, rid: int, d: int) -> bool:
        """The decider: disaggregate ``rid``, whose decode instance is ``d``?"""
        decider = self.decider
        if not isinstance(decider, PrefixThreshold):
            return decider == "always"
        r, kv = self.requests, self.instances[d].kv
        prompt = int(r.prompt_tokens[rid])
        cached = 0
        if r.prefix_hashes is not None and kv.prefix:
            cached = min(len(kv.prefix_tiers(r.prefix_hashes[rid])) * kv.bt, prompt)
        return prompt - cached > decider.uncached_tokens


class PrefillArrivals:
    """What a prefill instance's step loop sees of arrivals: done once the feed has handed
    over every request and no routed handoff is still to join a prefill queue."""

    def __init__(self, feed: ArrivalFeed, handoffs: Handoffs):
        self.feed, self.handoffs = feed, handoffs

    @property
    def done(self) -> bool:
        return self.feed.done and self.handoffs.pending == 0

    @property
    def next_arrival_s(self) -> float:
        return self.feed.next_arrival_s

    def deliver_before(self, t: float) -> int:
        return self.feed.deliver_before(t)
