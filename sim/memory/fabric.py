"""The host side that instances share: the clock, each GPU's host links, the block table.

One SimPy environment drives every part; each GPU gets its host links (H2D and D2H, and
the host's SSD links; ``link.shared_by`` GPUs in a row share one set); the block table has
a column per block and a row per tier, so a block's copies in HBM, DRAM and SSD are one
entry. Whoever builds a cluster builds the fabric and hands its parts to the instances (none
creates a clock or a link itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import simpy

from sim.config.hardware import HardwareSpec
from sim.memory.blocks import BlockTable
from sim.memory.links import Link, Links

if TYPE_CHECKING:
    from sim.memory.tplinks import TpLinks


@dataclass
class Fabric:
    """The clock, the block table and the links of one host's GPUs."""

    hardware: HardwareSpec
    env: simpy.Environment = field(default_factory=simpy.Environment)
    table: BlockTable = field(default_factory=BlockTable)
    gpu_links: list[Links] = field(default_factory=list)
    nic: tuple[Link, Link] | None = None  # the host's NIC (in, out), in a cluster

    def links_for(self, gpu: int) -> Links:
        """GPU ``gpu``'s host links: link ``gpu // link.shared_by`` (made on first use, in
        order; GPUs behind one PCIe switch share its uplink)."""
        index = gpu // self.hardware.link.shared_by
        while len(self.gpu_links) <= index:
            self.gpu_links.append(Links.from_hardware(self.env, self.hardware))
        return self.gpu_links[index]

    def tp_links(self, gpus: range, share: float) -> TpLinks:
        """The host links of an instance spanning ``gpus``, each moving ``share`` of a
        transfer (its KV heads). The host DRAM the GPUs read and write caps their links
        together: a socket's ``dram.bandwidth`` (shared by ``dram.shared_by`` GPUs) over the
        distinct links the instance uses, which a split transfer keeps busy together."""
        from sim.memory.tplinks import SplitLink, TpLinks  # tensor parallelism only

        hw = self.hardware
        per_gpu = [self.links_for(g) for g in gpus]
        distinct = list(dict.fromkeys(id(links) for links in per_gpu))
        sockets = len({g // hw.dram.shared_by for g in gpus})
        cap = sockets * hw.dram.bandwidth / len(distinct)
        for links in {id(x): x for x in per_gpu}.values():
            for link in (links.h2d, links.d2h):
                link.bandwidth = min(link.bandwidth, cap)
        return TpLinks(
            h2d=SplitLink(self.env, "h2d", [x.h2d for x in per_gpu], share),
            d2h=SplitLink(self.env, "d2h", [x.d2h for x in per_gpu], share),
            ssd_read=per_gpu[0].ssd_read,
            ssd_write=per_gpu[0].ssd_write,
        )

    def all_links(self) -> list[Link]:
        """Every link of every GPU, and the NIC's."""
        own = [link for links in self.gpu_links for link in links.all()]
        return own + list(self.nic or ())
