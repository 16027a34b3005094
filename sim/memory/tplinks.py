"""An instance's host links under tensor parallelism: each transfer split over its GPUs.

Under tensor parallelism every GPU holds its own KV heads, so an offload, a swap or a
``dram_centric`` fetch of an instance moves each GPU's shard over that GPU's host link at
once: ``share`` of the bytes per GPU (``ceil(kv_heads / N) / kv_heads``), and the transfer
ends when the slowest GPU's shard has arrived. GPUs behind one link (``link.shared_by``)
put their shards on the same :class:`~sim.memory.links.Link`, where they share it fluidly.
The host's DRAM bandwidth caps the links together (:meth:`sim.memory.fabric.Fabric.tp_links`).
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from sim.memory.links import Link


@dataclass
class SplitLink:
    """One direction of an instance's host traffic, split over its GPUs' links.

    ``parts`` holds each GPU's link, in GPU order (a link appears once per GPU behind it).
    Byte counters sum the distinct links; ``busy_s`` is the busiest link's.
    """

    env: simpy.Environment
    name: str
    parts: list[Link]
    share: float

    @property
    def links(self) -> list[Link]:
        """The distinct physical links, in order."""
        return list({id(link): link for link in self.parts}.values())

    def transfer(
        self, nbytes: float, chunk_bytes: float | None = None, latencies: int = 1
    ) -> simpy.Event:
        """Move ``nbytes`` of whole KV: each GPU moves ``share`` of it (its heads, in pieces
        ``share`` of ``chunk_bytes``); the event fires when the last GPU's shard arrives."""
        piece = None if chunk_bytes is None else chunk_bytes * self.share
        events = [link.transfer(nbytes * self.share, piece, latencies) for link in self.parts]
        return simpy.AllOf(self.env, events)

    @property
    def bandwidth(self) -> float:
        """Bytes of whole KV per second the instance moves when nothing else does: each link
        carries ``share`` of the bytes once per GPU behind it, and the slowest link decides."""
        carried = {id(link): 0.0 for link in self.parts}
        for link in self.parts:
            carried[id(link)] += self.share
        return min(link.bandwidth / carried[id(link)] for link in self.links)

    @property
    def in_flight(self) -> int:
        """Transfers on the instance's links now."""
        return sum(link.in_flight for link in self.links)

    @property
    def bytes_submitted(self) -> float:
        """Bytes given to the instance's links (every GPU's shard)."""
        return sum(link.bytes_submitted for link in self.links)

    @property
    def bytes_delivered(self) -> float:
        """Bytes the instance's links delivered (every GPU's shard)."""
        return sum(link.bytes_delivered for link in self.links)

    @property
    def busy_s(self) -> float:
        """Busy time of the busiest link."""
        return max(link.busy_s for link in self.links)


@dataclass
class TpLinks:
    """The :class:`~sim.memory.links.Links` of a tensor-parallel instance: H2D and D2H split
    over its GPUs' links, the host's SSD links as they are."""

    h2d: SplitLink
    d2h: SplitLink
    ssd_read: Link
    ssd_write: Link

    def all(self) -> tuple[SplitLink | Link, ...]:
        """Every direction."""
        return (self.h2d, self.d2h, self.ssd_read, self.ssd_write)
