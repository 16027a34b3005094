"""Offload write-through in bulk (``OffloadMode._write_through_bulk``) equals the loop that
registers and copies one block at a time, which is kept as the reference: the same requests,
timeline and summary for every online eviction policy, with DRAM and SSD both full (each copy
down evicts, and SSD's victims are dropped), and with no SSD (DRAM's victims are dropped)."""

from __future__ import annotations

import pytest

from sim.kv.modes.offload import OffloadMode
from sim.memory.tiers import Tier
from sim.run import simulate
from tests.conftest import make_config
from tests.test_bit_identity import _multi_turn

POLICIES = ["s3fifo", "lru", "fifo", "arc", "lfu", "sieve", "gds", "length_aware"]


pytestmark = pytest.mark.skip(
    reason="the bulk write-through is off: test_bulk_paths found a run where it differs (issue 29)"
)


def config(policy: str, ssd: str):
    return make_config(
        "kv.mode=offload", f"kv.eviction={policy}", "engine.kv_pool_blocks=600",
        "kv.dram_capacity=96MiB", f"kv.ssd_capacity={ssd}",
        workload=_multi_turn(20),
    )  # fmt: skip


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("ssd", ["160MiB", "0"])
def test_bulk_write_through_equals_the_loop(monkeypatch, policy, ssd):
    """With an SSD DRAM's victims go down (and SSD's are dropped); without one they are
    dropped at once (GDS, which prices that loss, keeps the loop)."""
    evicted, ssd_victims = [], []
    real, real_evict = Tier.add_evicting, Tier.evict

    def counting(self, blocks, now):
        out = real(self, blocks, now)
        evicted.extend(v for v in out if v >= 0)
        return out

    def ssd_evict(self, n, pinned=None):
        out = real_evict(self, n, pinned)
        if self.name == "ssd":
            ssd_victims.extend(out)
        return out

    monkeypatch.setattr(Tier, "add_evicting", counting)
    monkeypatch.setattr(Tier, "evict", ssd_evict)
    bulk = simulate(config(policy, ssd))
    if ssd == "0" and policy == "gds":
        assert evicted == []  # the loop
    else:
        assert len(evicted) > 100  # DRAM was full: the bulk path evicted
        assert ssd == "0" or len(ssd_victims) > 100  # and SSD, where there is one
    monkeypatch.setattr(OffloadMode, "_write_through_bulk", lambda *args: False)
    loop = simulate(config(policy, ssd))
    assert bulk.summary["ssd_hit_rate"] == loop.summary["ssd_hit_rate"]
    assert loop.requests.equals(bulk.requests)
    assert loop.timeline.equals(bulk.timeline)
    for summary in (bulk.summary, loop.summary):
        summary.pop("wall_time_s", None)
    assert loop.summary == bulk.summary
