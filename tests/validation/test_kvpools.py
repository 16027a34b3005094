"""KV pools: block accounting, and dram_centric and offload copies of the right bytes and values."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sim.config.model import ModelSpec  # noqa: E402
from sim.errors import KvsimError  # noqa: E402
from validation.kvpools import KvPools  # noqa: E402
from validation.prefixpools import PrefixPools  # noqa: E402

pytestmark = pytest.mark.torch
TINY = ModelSpec(name="tiny", layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32,
                 intermediate=128, vocab=64, dtype="fp32")  # fmt: skip
BT = 8
PER_TOKEN = 2 * 2 * 1 * 32 * 4  # layers x (K, V) x kv_heads x head_dim x 4 B
BLOCK = BT * PER_TOKEN


def write(pools: KvPools, table: list[int], start: int, values: torch.Tensor) -> None:
    """Put ``values`` (``[layers, 2, n, kv_heads, hd]``) as the KV of tokens start.. of a table."""
    slots = [table[p // BT] * BT + p % BT for p in range(start, start + values.shape[2])]
    pools.device.flatten(2, 3)[:, :, slots] = values


def read(pools: KvPools, table: list[int], n: int) -> torch.Tensor:
    """The device KV of the first ``n`` tokens of a device table."""
    return pools.device.flatten(2, 3)[:, :, [table[p // BT] * BT + p % BT for p in range(n)]]


def test_block_accounting_by_hand():
    pools = KvPools(TINY, BT, device_blocks=5, host_blocks=0, mode="hbm")
    assert pools.block_bytes == BLOCK and pools.available == 5
    assert pools.need(0, 17) == 3  # ceil(17 / 8)
    pools.allocate(0, 17)
    assert pools.held(0) == 3 and pools.available == 2 and pools.need(0, 24) == 0
    pools.release(0)
    assert pools.available == 5 and pools.held(0) == 0


def test_dram_centric_evicts_then_fetches_the_same_values():
    gen = torch.Generator().manual_seed(0)
    pools = KvPools(TINY, BT, device_blocks=3, host_blocks=10, mode="dram_centric")
    kv = torch.randn(2, 2, 16, 1, 32, generator=gen)
    pools.allocate(0, 16)  # two blocks
    (table,) = pools.device_tables([0], [0])
    write(pools, table, 0, kv)
    pools.write_through([0], [0], [16])
    assert pools.d2h_bytes == 16 * PER_TOKEN and pools.h2d_bytes == 0
    pools.allocate(1, 24)  # three blocks: request 0's two are evicted (no copy: written through)
    pools.device_tables([1], [0])
    assert pools.h2d_bytes == 0
    (table,) = pools.device_tables([0], [16])  # back: both blocks fetched in one copy
    assert pools.h2d_bytes == 2 * BLOCK
    assert torch.equal(read(pools, table, 16), kv)


def test_a_step_larger_than_the_device_pool_is_refused():
    pools = KvPools(TINY, BT, device_blocks=2, host_blocks=10, mode="dram_centric")
    pools.allocate(0, 24)
    with pytest.raises(KvsimError, match="more blocks than the device pool holds"):
        pools.device_tables([0], [0])


def prefix_pools(device_blocks: int, host_blocks: int, hashes: list[list[int]]) -> PrefixPools:
    """Offload pools over requests whose prompt blocks carry ``hashes`` (prompts of 8 blocks)."""
    arrays = [np.array(h, dtype=np.uint64) for h in hashes]
    prompt, output = [8 * BT] * len(hashes), [1] * len(hashes)
    prefix = (arrays, prompt, output)
    return PrefixPools(TINY, BT, (device_blocks, host_blocks), "offload", prefix)


def test_offload_writes_through_evicts_and_loads_back_the_same_values():
    gen = torch.Generator().manual_seed(0)
    pools = prefix_pools(3, 4, [[11, 12], [11, 12], [21, 22]])
    pools.allocate(0, 2 * BT)
    (table,) = pools.device_tables([0], [0])
    kv = torch.randn(2, 2, 2 * BT, 1, 32, generator=gen)
    write(pools, table, 0, kv)
    pools.register(0, 2 * BT)  # both blocks findable and written through to the host
    assert pools.d2h_bytes == 2 * BLOCK and len(pools.host_slot) == 2
    pools.release(0)  # cached, not freed: 3 blocks still available (1 free + 2 evictable)
    assert pools.available == 3 and len(pools.hbm_lru) == 2
    pools.allocate(2, 3 * BT)  # needs all 3 slots: both cached blocks leave the device pool
    assert not pools.hbm_lru and len(pools.host_slot) == 2 and pools.d2h_bytes == 2 * BLOCK
    pools.release(2)  # never registered: freed
    hits = pools.match(1)
    assert [tier for _, tier in hits] == [1, 1]  # both only in the host pool
    assert pools.admission_cost(1, hits, 2 * BT + 1) == 3  # 2 to load + 1 new
    assert pools.take(1, hits) == 2 and pools.h2d_bytes == 2 * BLOCK
    (table,) = pools.device_tables([1], [2 * BT])
    assert torch.equal(read(pools, table, 2 * BT), kv)


def test_a_full_host_pool_drops_its_oldest_copy():
    pools = prefix_pools(4, 1, [[11], [21], [31]])
    for rid in (0, 1):
        pools.allocate(rid, BT)
        pools.register(rid, BT)
        pools.release(rid)
    # one host slot: request 1's block pushed request 0's copy out; 0's stays on the device
    assert [pools.hash_of[b] for b in pools.host_slot] == [21]
    assert [tier for _, tier in pools.match(0)] == [0]  # still cached in the device pool
