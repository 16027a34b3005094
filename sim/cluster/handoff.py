"""Prefill/decode handoffs: a disaggregated request's KV, sent from its prefill instance's
NIC to its decode instance's (or written to the cluster's KV pool and read back from it:
:mod:`sim.cluster.pool_handoff`), whole after the prefill or layer by layer during it.

The order (as NVIDIA Dynamo's disaggregated serving and vLLM's KV connectors do it): the
decode instance admits the request first, reserving blocks for its prompt but the last
token (:meth:`sim.instance.scheduler.Scheduler._admit_handoff`), which calls :meth:`fill`;
only then does the request join its prefill instance's queue, as a request of one output
token. The prefill instance keeps its blocks until the transfer has landed, then releases
them (cached by its own ``kv`` settings, or dropped); the decode instance's request leaves
"loading" then, computes its last prompt token and samples its first token.

With ``layerwise`` the prefill's last step computes its layers one after the other, each
``compute / layers`` long; layer l's KV (the bytes over ``layers``) leaves once layer l is
done and the previous layer's transfer has ended, each paying the NIC's latency. Without,
all bytes leave when the prefill step ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
import simpy

from sim.cluster.pool_handoff import PoolLegs
from sim.config.cluster import Transfer
from sim.instance.instance import Instance
from sim.instance.scheduler import Batch, Scheduler
from sim.memory.links import Link


class Handoffs:
    """Every disaggregated request's pair of instances, and its transfer's bytes and times."""

    def __init__(
        self, instances: Sequence[Instance], nics: Sequence[tuple[Link, Link]],
        transfer: Transfer, requests: int, prefill: Sequence[int],
    ):  # fmt: skip
        self.instances, self.nics, self.layerwise = instances, nics, transfer.layerwise
        self.pool = PoolLegs(instances) if transfer.via == "pool" else None
        self.env = instances[0].env
        self.prefill_of = np.full(requests, -1, dtype=np.int64)
        self.decode_of = np.full(requests, -1, dtype=np.int64)
        self.bytes = np.zeros(requests)  # the KV the decode instance receives
        self.tokens = np.zeros(requests, dtype=np.int64)  # its tokens
        self.sent_s = np.full(requests, np.nan)  # the first byte left
        self.arrived_s = np.full(requests, np.nan)  # the last byte landed
        self.prefilled_s = np.full(requests, np.nan)  # the prefill step ended
        self.landed_s = np.full(requests, np.nan)  # both: the decode side may go on
        self.pending = 0  # routed handoffs not yet in a prefill queue
        self.feed_done = lambda: False  # the arrival feed has handed over every request
        self._landed: dict[int, simpy.Event] = {}
        for instance in instances:
            instance.scheduler.fill = self.fill
            instance.scheduler.prefilled = self.prefilled
        for i in prefill if self.layerwise else ():
            instances[i].on_compute = partial(self._compute_started, instances[i].scheduler)

    @property
    def in_flight(self) -> int:
        """Transfers whose decode side still waits."""
        return len(self._landed)

    @property
    def network_bytes(self) -> float:
        """Bytes sent NIC to NIC (none through the pool: those are the pool's traffic)."""
        return 0.0 if self.pool is not None else float(self.bytes.sum())

    def route(self, rid: int, prefill: int, decode: int) -> None:
        """``rid`` prefills on ``prefill`` and decodes on ``decode`` (queued there next)."""
        self.prefill_of[rid], self.decode_of[rid] = prefill, decode
        self.instances[decode].scheduler.receiving[rid] = True
        self.pending += 1

    def fill(self, rid: int, tokens: int) -> simpy.Event:
        """The decode instance reserved room for ``tokens`` tokens of ``rid``'s KV: queue its
        prefill; the event fires when the KV has landed."""
        p = self.instances[self.prefill_of[rid]]
        config = p.config
        # the bytes every GPU of the prefill instance sends together: each GPU its shard
        # (kv_share of the KV; N shards hold more than the KV when KV heads are replicated),
        # over its own NIC (an instance's NIC is N GPUs' NICs: sim/cluster/cluster.py)
        whole = tokens * config.model.kv_bytes_per_token(config.kv_dtype_bytes)
        self.bytes[rid] = whole * p.plan.kv_share * p.plan.gpus
        self.tokens[rid] = tokens
        s = p.scheduler
        s.output[rid] = 1  # prefill only: its one sample is the prefill's last step
        s.sending[rid] = True
        p.add(rid)
        p.wake()
        self.pending -= 1
        if self.pending == 0 and self.feed_done():
            for instance in self.instances:  # idle prefill instances may end now
                instance.wake()
        landed = self._landed[rid] = self.env.event()
        return landed

    def prefilled(self, rid: int, now: float) -> None:
        """``rid``'s prefill step ended on its prefill instance (its KV is all computed)."""
        self.prefilled_s[rid] = now
        if not self.layerwise:
            self.sent_s[rid] = now
            self.env.process(self._pieces(rid, [now]))
        elif not np.isnan(self.arrived_s[rid]):
            self._land(rid)

    def _compute_started(self, s: Scheduler, batch: Batch, compute: float) -> None:
        """A prefill instance's step (scheduler ``s``) starts computing: the layerwise
        transfers of the prefills it ends."""
        ids = batch.ids[batch.samples]
        for rid in ids[s.sending[ids]].tolist():
            self.sent_s[rid] = self.env.now
            self.env.process(self._layers(rid, compute))

    def _layers(self, rid: int, compute: float):
        """Layer l's KV leaves when layer l is done (and layer l - 1's has gone)."""
        layers = self.instances[self.prefill_of[rid]].config.model.layers
        start, per_layer = self.env.now, compute / layers
        return self._pieces(rid, [start + (layer + 1) * per_layer for layer in range(layers)])

    def _pieces(self, rid: int, ready: list[float]):
        """``rid``'s KV in ``len(ready)`` equal pieces, piece i computed at ``ready[i]``:
        NIC to NIC, each once computed and the previous one has landed; or through the pool
        (:class:`PoolLegs`)."""
        p, d, size = int(self.prefill_of[rid]), int(self.decode_of[rid]), self.bytes[rid]
        if self.pool is not None:
            yield from self.pool.pipeline(rid, p, d, int(self.tokens[rid]), size, ready)
        else:
            for t in ready:
                wait = t - self.env.now
                if wait > 0:
                    yield self.env.timeout(wait)
                yield self._move(rid, size / len(ready))
        self._arrived(rid)

    def _move(self, rid: int, size: float) -> simpy.Event:
        """``size`` bytes out of the prefill NIC and into the decode NIC at once."""
        out = self.nics[self.prefill_of[rid]][1]
        into = self.nics[self.decode_of[rid]][0]
        return simpy.AllOf(self.env, [out.transfer(size), into.transfer(size)])

    def _arrived(self, rid: int) -> None:
        self.arrived_s[rid] = self.env.now
        if not np.isnan(self.prefilled_s[rid]):
            self._land(rid)

    def _land(self, rid: int) -> None:
        """The KV is on the decode instance and the prefill is over: the prefill instance
        lets its blocks go; the decode instance's request goes on."""
        self.landed_s[rid] = self.env.now
        self.instances[self.prefill_of[rid]].kv.finish(rid)
        self._landed.pop(rid).succeed()
