"""Handoffs through the cluster's KV pool (``disaggregation.transfer.via: pool``, as
Mooncake): each piece of a request's KV (the whole, or one layer's) is written out of its
prefill instance's NIC into the pool, then read out of the pool into its decode
instance's NIC, each leg crossing the NIC and the pool's aggregate link at once (as
:class:`sim.kv.remote.RemoteKv` moves every pool byte).

A two-stage pipeline: piece i's write starts when the piece is computed and write i - 1
has ended; its read starts when its write has landed and read i - 1 has ended. The write
carries only what the pool lacks: the request's full prompt blocks (from the first its
decode instance did not have) that are neither in the pool nor on their way in, and the
partial last block, which moves but is not kept (no hash: nothing can share it). The full
blocks it wrote land in the pool, found by every instance under their prefix hash, once
the last piece's write has ended. The read carries all the KV the decode instance
receives; blocks another write is still carrying (the prefill instance's write-through,
another request's handoff) are read once that write has landed. A block the pool evicts
before the read still reaches the decode instance: the read moves its bytes regardless
(Mooncake's reader holds a lease on what it reads).
"""

from __future__ import annotations

from collections.abc import Sequence

import simpy

from sim.instance.instance import Instance
from sim.kv.remote import RemoteKv


class PoolLegs:
    """The write and read legs of every pool handoff."""

    def __init__(self, instances: Sequence[Instance]):
        remotes = [i.kv.remote for i in instances]
        assert all(r is not None for r in remotes), "via: pool needs cluster.kv_pool"
        self.remotes: list[RemoteKv] = remotes  # type: ignore[assignment]
        self.instances, self.env = instances, instances[0].env

    def pipeline(self, rid: int, p: int, d: int, tokens: int, size: float, ready: list[float]):
        """Move ``rid``'s ``size`` bytes (``tokens`` tokens) from instance ``p`` to ``d``
        through the pool, in ``len(ready)`` pieces, piece i computed at ``ready[i]``."""
        env, src, pieces = self.env, self.remotes[p], len(ready)
        written, done, waits = self._claim(rid, p, tokens, size)
        landed = [env.event() for _ in ready]
        reads = env.process(self._reads(self.remotes[d], size / pieces, landed, waits))
        for event, t in zip(landed, ready, strict=True):
            if t > env.now:
                yield env.timeout(t - env.now)
            yield src.move(written / pieces, src.nic_out)
            event.succeed()
        done.succeed()  # the full blocks written land in the pool
        yield reads

    def _reads(
        self, dst: RemoteKv, piece: float, landed: list[simpy.Event], waits: list[simpy.Event]
    ):
        """Piece i's read: once its write has landed (and the writes of blocks others were
        carrying, before the first) and read i - 1 has ended."""
        if waits:
            yield simpy.AllOf(self.env, waits)
        for event in landed:
            yield event
            yield dst.move(piece, dst.nic_in)

    def _claim(
        self, rid: int, p: int, tokens: int, size: float
    ) -> tuple[float, simpy.Event, list[simpy.Event]]:
        """The bytes ``rid``'s write carries, the event on which its new full blocks land,
        and the writes others are still doing of its blocks."""
        kv, remote = self.instances[p].kv, self.remotes[p]
        index, store = kv.index, remote.store
        first = (int(index.prompt[rid]) - 1 - tokens) // kv.bt  # the decode side lacks these
        hashes: list[int] = []
        if index.hashes is not None:
            hashes = index.hashes[rid][first : index.lookup_blocks(rid)].tolist()
        waits = store.in_flight(hashes)
        new = store.missing(hashes)
        done = self.env.event()
        remote.claim(new, done)
        kept = (len(hashes) - len(new)) * kv.bt  # tokens the pool holds or is receiving
        written = size * (tokens - kept) / tokens if tokens else 0.0
        return written, done, waits
