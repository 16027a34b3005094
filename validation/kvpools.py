"""The mini-engine's paged KV memory: a fixed device pool, a host pool, real copies between.

Modes (``kv.mode``, as the simulator names them, ``sim/kv/manager.py``):

- ``hbm``: every block lives in the device pool (PagedAttention); no host pool.
- ``dram_centric``: a block's home is the host pool, which the scheduler allocates from;
  the device pool caches blocks (LRU). Before a step, the context blocks its sequences
  read that are not cached are copied in (one gathered copy of whole blocks, all layers);
  after it, the KV of the step's new tokens is written through to the host (one gathered
  copy of those token slots).
- ``offload`` moves prefix-cached blocks: :class:`validation.prefixpools.PrefixPools`
  (a subclass) runs it, and ``hbm`` with a prefix cache; without prefix caching, ``offload``
  moves nothing and runs as ``hbm``.

On a GPU the host pool is pinned and copies run on a side stream; on the CPU both pools
are host memory and a copy is a memcpy between them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from sim.config.model import ModelSpec
from sim.errors import KvsimError
from validation.torchmodel import TORCH_DTYPES

MODES = ("hbm", "offload", "dram_centric")


class KvPools:
    """Block allocation in the home tier, device residency, and the copies between pools."""

    def __init__(self, model: ModelSpec, block_tokens: int, device_blocks: int, host_blocks: int,
                 mode: str, device: str = "cpu"):  # fmt: skip
        if mode not in MODES:
            raise KvsimError(f"kv.mode {mode!r}: expected one of {', '.join(MODES)}")
        shape = (model.layers, 2, device_blocks, block_tokens, model.kv_heads, model.head_dim)
        dtype = TORCH_DTYPES[model.dtype]
        self.mode, self.block_tokens = mode, block_tokens
        self.device = torch.zeros(shape, dtype=dtype, device=device)
        self.host = None
        if mode != "hbm":
            pin = device != "cpu"
            self.host = torch.zeros(
                (*shape[:2], host_blocks, *shape[3:]), dtype=dtype, pin_memory=pin
            )
        self.block_bytes = self.device[:, :, 0].numel() * self.device.element_size()
        home_blocks = host_blocks if mode == "dram_centric" else device_blocks
        self.free = list(range(home_blocks - 1, -1, -1))  # pop() hands out low ids first
        self.capacity = home_blocks
        self.tables: dict[int, list[int]] = {}
        self.cached: OrderedDict[int, int] = OrderedDict()  # home block -> device slot (LRU)
        self.free_slots = list(range(device_blocks - 1, -1, -1))
        self.h2d_bytes = 0
        self.d2h_bytes = 0
        self.stream = torch.cuda.Stream() if self.device.is_cuda else None

    # --- allocation in the home tier (what the scheduler sees) --------------------------------

    @property
    def available(self) -> int:
        """Free blocks in the home tier."""
        return len(self.free)

    def held(self, rid: int) -> int:
        """Blocks request ``rid`` holds."""
        return len(self.tables.get(rid, ()))

    def need(self, rid: int, tokens: int) -> int:
        """More blocks ``rid`` needs to hold ``tokens`` tokens."""
        return max(-(-tokens // self.block_tokens) - self.held(rid), 0)

    def allocate(self, rid: int, tokens: int) -> None:
        """Grow ``rid``'s table to hold ``tokens`` tokens."""
        table = self.tables.setdefault(rid, [])
        for _ in range(self.need(rid, tokens)):
            table.append(self.free.pop())

    # --- prefix hits: none without a prefix cache (PrefixPools has one) -----------------------

    def match(self, rid: int) -> list[tuple[int, int]]:
        """Cached prefix blocks of ``rid``: none here."""
        return []

    def admission_cost(self, rid: int, hits: list[tuple[int, int]], tokens: int) -> int:
        """Home-tier blocks admitting ``rid`` with ``tokens`` computed takes."""
        return self.need(rid, tokens)

    def take(self, rid: int, hits: list[tuple[int, int]]) -> int:
        """Reference the hit blocks; returns how many must be loaded first (none here)."""
        return 0

    def loaded(self, rid: int) -> None:
        """``rid``'s load finished: nothing was loading here."""

    def register(self, rid: int, computed: int) -> None:
        """Make ``rid``'s completed blocks findable: nothing to do without a prefix cache."""

    def preempt(self, rid: int, tokens: int, computed: int) -> None:
        """``rid`` is preempted by recompute: without a prefix cache, :meth:`release`."""
        self.release(rid)

    def finish(self, rid: int) -> None:
        """``rid`` is done: :meth:`release`."""
        self.release(rid)

    def release(self, rid: int) -> None:
        """Free ``rid``'s blocks (and their device copies)."""
        for block in reversed(self.tables.pop(rid, [])):
            slot = self.cached.pop(block, None)
            if slot is not None:
                self.free_slots.append(slot)
            self.free.append(block)

    # --- device residency around a step -------------------------------------------------------

    def device_tables(self, ids: list[int], context: list[int]) -> list[list[int]]:
        """Device block tables of the step's sequences, fetching what ``dram_centric`` lacks."""
        if self.mode != "dram_centric":
            return [self.tables[rid] for rid in ids]
        needed = {b for rid in ids for b in self.tables[rid]}
        fetch_src, fetch_dst = [], []
        for rid, ctx in zip(ids, context, strict=True):
            for j, block in enumerate(self.tables[rid]):
                if block in self.cached:
                    self.cached.move_to_end(block)
                    continue
                slot = self._slot(needed)
                self.cached[block] = slot
                if j * self.block_tokens < ctx:  # holds KV already: fetch it
                    fetch_src.append(block)
                    fetch_dst.append(slot)
        if fetch_src:
            self._copy(self.device, torch.tensor(fetch_dst), self.host, torch.tensor(fetch_src))
            self.h2d_bytes += len(fetch_src) * self.block_bytes
        return [[self.cached[b] for b in self.tables[rid]] for rid in ids]

    def write_through(self, ids: list[int], context: list[int], new: list[int]) -> None:
        """``dram_centric``: copy the KV of the step's new tokens back to their home blocks."""
        if self.mode != "dram_centric":
            return
        bt = self.block_tokens
        home, cached = [], []
        for rid, c, n in zip(ids, context, new, strict=True):
            table = self.tables[rid]
            for p in range(c, c + n):
                home.append(table[p // bt] * bt + p % bt)
                cached.append(self.cached[table[p // bt]] * bt + p % bt)
        self._copy_tokens(torch.tensor(home), torch.tensor(cached))
        self.d2h_bytes += len(home) * self.block_bytes // bt

    def _slot(self, needed: set[int]) -> int:
        """A free device slot, evicting the least recently used block this step does not read."""
        if self.free_slots:
            return self.free_slots.pop()
        victim = next((b for b in self.cached if b not in needed), None)
        if victim is None:
            raise KvsimError(
                f"dram_centric: one step reads more blocks than the device pool holds "
                f"({self.device.shape[2]}); expected engine.kv_pool_blocks at least the "
                "blocks of the largest step"
            )
        return self.cached.pop(victim)

    def _on_side_stream(self, copy: Callable[[], None]) -> None:
        """Run ``copy()`` on the side stream (GPU), ordered after and before the kernels."""
        if self.stream is None:
            copy()
            return
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)  # the blocks were written by earlier kernels
        with torch.cuda.stream(self.stream):
            copy()
        current.wait_stream(self.stream)  # later kernels read or overwrite these slots

    def _copy(
        self, dst: torch.Tensor, dst_idx: torch.Tensor, src: torch.Tensor, src_idx: torch.Tensor
    ) -> None:
        """One gathered copy of whole blocks (all layers) between pools."""

        def copy() -> None:
            moved = src[:, :, src_idx.to(src.device)].to(dst.device, non_blocking=True)
            dst[:, :, dst_idx.to(dst.device)] = moved

        self._on_side_stream(copy)

    def _copy_tokens(self, home_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """One gathered copy of token slots (all layers) from the device pool to the host."""
        host = self.host
        assert host is not None

        def copy() -> None:
            moved = self.device.flatten(2, 3)[:, :, device_slots.to(self.device.device)]
            host.flatten(2, 3)[:, :, home_slots] = moved.to("cpu", non_blocking=True)

        self._on_side_stream(copy)
