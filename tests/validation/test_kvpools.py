"""KV pools: block accounting, and dram_centric copies that move the right bytes and values."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sim.config.model import ModelSpec  # noqa: E402
from sim.errors import KvsimError  # noqa: E402
from validation.kvpools import KvPools  # noqa: E402

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
