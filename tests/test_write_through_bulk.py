"""Offload write-through in bulk (``OffloadMode._write_through_bulk``) equals the loop that
registers and copies one block at a time, which is kept as the reference: the same requests,
timeline and summary for every online eviction policy, with DRAM and SSD both full (each copy
down evicts, and SSD's victims are dropped)."""

from __future__ import annotations

import pytest

from sim.kv.modes.offload import OffloadMode
from sim.memory.tiers import Tier
from sim.run import simulate
from tests.conftest import make_config
from tests.test_bit_identity import _multi_turn

POLICIES = ["s3fifo", "lru", "fifo", "arc", "lfu", "sieve", "gds", "length_aware"]


def config(policy: str):
    return make_config(
        "kv.mode=offload", f"kv.eviction={policy}", "engine.kv_pool_blocks=600",
        "kv.dram_capacity=96MiB", "kv.ssd_capacity=160MiB",
        workload=_multi_turn(20),
    )  # fmt: skip


@pytest.mark.parametrize("policy", POLICIES)
def test_bulk_write_through_equals_the_loop(monkeypatch, policy):
    evicted, ssd = [], []
    real, real_evict = Tier.add_evicting, Tier.evict

    def counting(self, blocks, now):
        out = real(self, blocks, now)
        evicted.extend(v for v in out if v >= 0)
        return out

    def ssd_evict(self, n, pinned=None):
        out = real_evict(self, n, pinned)
        if self.name == "ssd":
            ssd.extend(out)
        return out

    monkeypatch.setattr(Tier, "add_evicting", counting)
    monkeypatch.setattr(Tier, "evict", ssd_evict)
    bulk = simulate(config(policy))
    assert len(evicted) > 100 and len(ssd) > 100  # DRAM and SSD were full: both evicted
    monkeypatch.setattr(OffloadMode, "_write_through_bulk", lambda *args: False)
    loop = simulate(config(policy))
    assert bulk.summary["ssd_hit_rate"] == loop.summary["ssd_hit_rate"]
    assert loop.requests.equals(bulk.requests)
    assert loop.timeline.equals(bulk.timeline)
    for summary in (bulk.summary, loop.summary):
        summary.pop("wall_time_s", None)
    assert loop.summary == bulk.summary
