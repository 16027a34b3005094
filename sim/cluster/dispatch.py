"""The router's side of a cluster: each arriving request goes to the instance a router picks
from snapshots of the instances (``policies.routing``), never from the instances themselves.

Load counts in the snapshots are refreshed at most every ``cluster.router.signal_interval``
(0: before every decision), as llm-d's scheduler sees load through periodic metric scrapes:
between refreshes a router does not see even its own decisions (it can herd). Which prefix
blocks an instance holds is read live, as KV events stream to Dynamo's and llm-d's indexers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from policies.routing.base import InstanceSnapshot, Router, RouteRequest
from sim.instance.instance import Instance
from sim.memory.blocks import HBM
from sim.workload.requests import Requests


def estimates(instance: Instance) -> tuple[float, tuple[float, float, float, float]]:
    """The cost estimates a router may use (:class:`InstanceSnapshot`): a prompt token's
    prefill time (a full token budget of prefill, by the cost model), and one block's time
    from each tier (HBM, DRAM, SSD, the pool) home at the links' bandwidths."""
    engine, links = instance.config.engine, instance.links
    budget = engine.max_batched_tokens
    step = instance.cost.step(np.array([budget]), np.array([0]), 1).total_s
    block = instance.kv.tiers[1].block_bytes
    dram = block / links.h2d.bandwidth if instance.kv.home.index == HBM else 0.0
    ssd = dram + block / links.ssd_read.bandwidth
    nic = instance.kv.remote.nic_in.bandwidth if instance.kv.remote is not None else np.inf
    return step / budget, (0.0, dram, ssd, dram + block / nic)


def snapshot(
    instance: Instance, index: int, costs: tuple[float, tuple] = (0.0, (0.0,) * 4)
) -> InstanceSnapshot:
    """What a router may know of ``instance`` now (counts, its prefix lookup, and the cost
    estimates ``costs`` of :func:`estimates`)."""
    s, kv = instance.scheduler, instance.kv
    bt = kv.bt
    queued = np.fromiter(s.waiting, dtype=np.int64, count=len(s.waiting))
    ids = np.concatenate((queued, s.running))
    to_compute = np.maximum(s.prompt[ids] - s.computed[ids], 0)
    to_produce = np.maximum(s.output[ids] - s.generated[ids], 0)
    hbm = kv.tiers[HBM]
    prefill = int(to_compute.sum())
    return InstanceSnapshot(
        index=index,
        waiting=len(queued) + s.loading,
        running=len(s.running),
        outstanding_tokens=prefill + int(to_produce.sum()),
        prefill_blocks=int((-(-to_compute // bt)).sum()),
        decode_blocks=int(kv.held[s.running].sum()),
        kv_used=int(hbm.resident),
        kv_capacity=max(int(hbm.capacity), 1),
        cached_blocks=len(kv.table.index),
        prefix_tiers=kv.prefix_tiers,
        prefill_tokens=prefill,
        prefill_s_per_token=costs[0],
        block_fetch_s=costs[1],
    )


class Dispatcher:
    """Hands each request the arrival feed delivers to the instance ``router`` picks."""

    def __init__(
        self, instances: Sequence[Instance], router: Router, requests: Requests,
        signal_interval: float,
    ):  # fmt: skip
        self.instances, self.router, self.requests = instances, router, requests
        self.signal_interval = signal_interval
        self.env = instances[0].env
        self.instance_of = np.full(len(requests), -1, dtype=np.int64)
        self._snapshots: list[InstanceSnapshot] = []
        self._refreshed = -math.inf
        self._woken: set[int] = set()
        self._bt = instances[0].kv.bt
        self._costs = [estimates(instance) for instance in instances]

    def pick(self, rid: int) -> int:
        """The instance (its position here) the router picks for ``rid``."""
        chosen = self.router.route(self._request(rid), self._current())
        if not 0 <= chosen < len(self.instances):
            raise RuntimeError(
                f"router {self.router.name or type(self.router).__name__!r} returned instance "
                f"{chosen!r} for request {rid}; expected 0..{len(self.instances) - 1}"
            )
        return chosen

    def add(self, rid: int) -> None:
        """Route ``rid`` and queue it there."""
        chosen = self.pick(rid)
        self.instance_of[rid] = chosen
        self.instances[chosen].add(rid)
        self._woken.add(chosen)

    def wake(self) -> None:
        """Wake the instances that got requests at this instant."""
        for i in sorted(self._woken):
            self.instances[i].wake()
        self._woken.clear()

    def _current(self) -> list[InstanceSnapshot]:
        now = self.env.now
        if not self._snapshots or now - self._refreshed >= self.signal_interval:
            costs = self._costs
            self._snapshots = [snapshot(inst, i, costs[i]) for i, inst in enumerate(self.instances)]
            self._refreshed = now
        return self._snapshots

    def _request(self, rid: int) -> RouteRequest:
        r = self.requests
        hashes = r.prefix_hashes[rid] if r.prefix_hashes is not None else None
        return RouteRequest(
            request_id=rid,
            prompt_tokens=int(r.prompt_tokens[rid]),
            session=int(r.session[rid]) if r.session is not None else -1,
            block_hashes=hashes if hashes is not None else np.zeros(0, dtype=np.uint64),
            block_tokens=self._bt,
        )
