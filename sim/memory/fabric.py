"""The host side that instances share: the clock, each GPU's host links, the block table.

One SimPy environment drives every part; each GPU gets its own host links (H2D and D2H,
and the host's SSD links); the block table has a column per block and a row per tier, so a
block's copies in HBM, DRAM and SSD are one entry. Whoever builds a cluster builds the
fabric and hands its parts to the instances (none creates a clock or a link itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy

from sim.config.hardware import HardwareSpec
from sim.memory.blocks import BlockTable
from sim.memory.links import Link, Links


@dataclass
class Fabric:
    """The clock, the block table and the links of one host's GPUs."""

    hardware: HardwareSpec
    env: simpy.Environment = field(default_factory=simpy.Environment)
    table: BlockTable = field(default_factory=BlockTable)
    gpu_links: list[Links] = field(default_factory=list)
    nic: tuple[Link, Link] | None = None  # the host's NIC (in, out), in a cluster

    def links_for(self, gpu: int) -> Links:
        """GPU ``gpu``'s host links (made on first use, in order of the GPUs)."""
        while len(self.gpu_links) <= gpu:
            self.gpu_links.append(Links.from_hardware(self.env, self.hardware))
        return self.gpu_links[gpu]

    def all_links(self) -> list[Link]:
        """Every link of every GPU, and the NIC's."""
        own = [link for links in self.gpu_links for link in links.all()]
        return own + list(self.nic or ())
