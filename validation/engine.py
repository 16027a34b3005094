"""A real (small) serving engine in torch: paged KV, continuous batching, timed steps.

It serves a request table (``sim.workload``, the simulator's own) with a Llama-style
decoder of random weights (``validation.torchmodel``), the simulator's batching rules
(``validation.batching``) and real pools and copies (``validation.kvpools``), and logs every
step: its batch, tokens, bytes moved and measured time (``validation.timing.clock``: CUDA
wall time on a GPU, thread CPU time on the CPU). ``kvsim validate`` puts these steps next
to the simulator's. Arrivals follow the wall clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from sim.config.run import RunConfig
from sim.errors import KvsimError
from sim.workload.requests import Requests
from validation.batching import Batcher, Step, check_engine
from validation.kvpools import KvPools
from validation.prefixpools import PrefixPools
from validation.timing import clock
from validation.torchmodel import (
    Weights,
    attend,
    linear,
    random_weights,
    rms_norm,
    rope_tables,
    split_qkv,
    step_layout,
    swiglu,
)

MAX_HOST_POOL_BYTES = 8 * 2**30  # an offload host pool (kv.dram_capacity) is allocated whole


@dataclass
class EngineRun:
    """What a run measured: one row per step, and each request's tokens (and logits)."""

    steps: pd.DataFrame
    total_s: float
    tokens: dict[int, list[int]]
    logits: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    preemptions: int = 0


def synchronize(device: str) -> None:
    """Wait for the device (a no-op on the CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def host_blocks(config: RunConfig, requests: Requests) -> int:
    """Host pool size: ``offload``: the DRAM tier's blocks; else every request's blocks at once."""
    if config.kv.mode == "offload":
        capacity = config.kv.dram_capacity
        if capacity is None:
            capacity = config.hardware.dram.capacity
        if capacity > MAX_HOST_POOL_BYTES:
            raise KvsimError(
                f"kv.dram_capacity: the mini-engine allocates the offload host pool whole; "
                f"{capacity / 2**30:.3g} GiB is more than {MAX_HOST_POOL_BYTES // 2**30} GiB "
                "(set kv.dram_capacity)"
            )
        return int(capacity // config.tier_block_bytes("dram"))
    bt = config.engine.block_tokens
    total = -(-(requests.prompt_tokens + requests.output_tokens) // bt)
    return int(max(total.sum(), config.engine.kv_pool_blocks or 1) + 1)


def prompt_tokens(config: RunConfig, requests: Requests) -> list[list[int]]:
    """Each request's prompt tokens, seeded; a hashed block's tokens follow from its hash.

    Prefix hashes chain, so requests sharing a block's hash share every token up to it: a
    prefix hit then reuses KV of exactly the tokens the request has.
    """
    rng = np.random.default_rng(config.seed)
    vocab, bt = config.model.vocab, config.engine.block_tokens
    hashes = requests.prefix_hashes
    out = []
    for rid, p in enumerate(requests.prompt_tokens.tolist()):
        tokens = rng.integers(0, vocab, p).tolist()
        for j, h in enumerate(hashes[rid][: p // bt].tolist() if hashes is not None else []):
            block = np.random.default_rng([config.seed, h]).integers(0, vocab, bt)
            tokens[j * bt : (j + 1) * bt] = block.tolist()
        out.append(tokens)
    return out


def make_pools(config: RunConfig, requests: Requests, device: str) -> KvPools:
    """The pools of ``kv.mode``: with a prefix cache when prefix caching has hashes to use."""
    args = (config.model, config.engine.block_tokens)
    pools = (config.engine.kv_pool_blocks or 0, host_blocks(config, requests))
    if config.kv.prefix_caching and config.kv.mode in ("hbm", "offload"):
        hashes = requests.prefix_hashes or [np.zeros(0, dtype=np.uint64)] * len(requests)
        if requests.output_hashes is not None:  # blocks filled while generating count too
            hashes = [np.concatenate(pair) for pair in zip(hashes, requests.output_hashes,
                                                            strict=True)]  # fmt: skip
        prompt = requests.prompt_tokens.astype(int).tolist()
        output = requests.output_tokens.astype(int).tolist()
        return PrefixPools(*args, pools, config.kv.mode, (list(hashes), prompt, output), device)
    return KvPools(*args, *pools, config.kv.mode, device)


class MiniEngine:
    """Serve ``requests`` under ``config`` (model, engine and ``kv.mode``) with real kernels."""

    def __init__(self, config: RunConfig, requests: Requests, device: str = "cpu",
                 weights: Weights | None = None, record_logits: bool = False):  # fmt: skip
        check_engine(config)
        if config.engine.kv_pool_blocks is None:
            raise KvsimError(
                "engine.kv_pool_blocks: the mini-engine needs a fixed device pool size"
            )
        self.config, self.model, self.device = config, config.model, device
        self.weights = weights or random_weights(config.model, config.seed, device)
        self.requests = requests
        self.record_logits = record_logits
        self.sequences = prompt_tokens(config, requests)
        self.kv = make_pools(config, requests, device)
        prompt = requests.prompt_tokens.astype(int).tolist()
        self.batcher = Batcher(config, prompt, requests.output_tokens.astype(int).tolist(), self.kv)
        self.logits: dict[int, list[torch.Tensor]] = {}
        longest = int((requests.prompt_tokens + requests.output_tokens).max())
        self.cos, self.sin = rope_tables(torch.arange(longest, device=device), self.model.head_dim)

    def forward(self, step: Step) -> None:
        """One step's forward pass over the batch; appends a sampled token to each sampler."""
        m, w, bt = self.model, self.weights, self.config.engine.block_tokens
        tables = self.kv.device_tables(step.ids, step.context)
        tokens, positions = [], []
        for rid, c, n in zip(step.ids, step.context, step.new, strict=True):
            tokens += self.sequences[rid][c : c + n]
            positions += range(c, c + n)
        layout = step_layout(step.new, step.context, tables, bt, self.device)
        where = torch.tensor(positions, device=self.device)
        cos, sin = self.cos[where], self.sin[where]
        x = w.embedding[torch.tensor(tokens, device=self.device)]
        for i, layer in enumerate(w.layers):
            q, k, v = split_qkv(linear(rms_norm(x, layer.attn_norm), layer.wqkv), m, cos, sin)
            x = x + linear(attend(q, k, v, self.kv.device, i, layout).flatten(1), layer.wo)
            x = x + linear(swiglu(linear(rms_norm(x, layer.mlp_norm), layer.w_up)), layer.w_down)
        last = np.cumsum(step.new) - 1
        samplers = [i for i, s in enumerate(step.samples) if s]
        if samplers:
            rows = torch.tensor(last[samplers], device=self.device)
            logits = linear(rms_norm(x[rows], w.final_norm), w.lm_head)
            chosen = logits.argmax(dim=-1).tolist()
            for j, i in enumerate(samplers):
                rid = step.ids[i]
                self.sequences[rid].append(chosen[j])
                if self.record_logits:
                    self.logits.setdefault(rid, []).append(logits[j].cpu())
        self.kv.write_through(step.ids, step.context, step.new)
        synchronize(self.device)

    def run(self) -> EngineRun:
        """Serve every request; arrivals follow the request table's times in wall-clock."""
        arrival = self.requests.arrival_s
        b, kv, rows = self.batcher, self.kv, []
        now_s = clock(self.device)  # CPU: this thread's CPU time (validation.timing)
        arrived, start, wall_start = 0, now_s(), time.perf_counter()
        h2d, d2h = 0, 0  # bytes moved before this row: a load-only pass has no row of its own
        with torch.inference_mode():
            while arrived < len(arrival) or b.has_work:
                now = time.perf_counter() - wall_start  # arrivals follow the wall clock
                while arrived < len(arrival) and arrival[arrived] <= now:
                    b.add(arrived)
                    arrived += 1
                if not b.has_work:
                    time.sleep(max(arrival[arrived] - now, 0.0))
                    continue
                t0 = now_s()
                step = b.schedule()
                if not step.ids:  # only preemptions or loads: the simulator records no step
                    stuck = not (step.preempted or b.running or b.loading)
                    if stuck and arrived == len(arrival):
                        raise KvsimError(
                            f"the mini-engine made no progress: requests {list(b.waiting)[:8]} "
                            f"wait for {kv.capacity - kv.available} blocks that waiting "
                            "requests hold (the simulator stops with the same error)"
                        )
                    continue
                self.forward(step)
                b.complete(step)
                rows.append(self._row(step, t0 - start, now_s() - t0, h2d, d2h))
                h2d, d2h = kv.h2d_bytes, kv.d2h_bytes
        total = now_s() - start
        tokens = {rid: seq[len(seq) - int(self.requests.output_tokens[rid]) :]
                  for rid, seq in enumerate(self.sequences) if rid in b.finished}  # fmt: skip
        return EngineRun(pd.DataFrame(rows), total, tokens, self.logits, sum(b.preemptions))

    def _row(self, step: Step, at: float, seconds: float, h2d: int, d2h: int) -> dict:
        decode = [n == 1 and c >= self.batcher.prompt[r] for r, c, n in
                  zip(step.ids, step.context, step.new, strict=True)]  # fmt: skip
        prefill = sum(n for n, d in zip(step.new, decode, strict=True) if not d)
        return {
            "time_s": at,
            "step_s": seconds,
            "batch_size": len(step.ids),
            "step_tokens": sum(step.new),
            "prefill_tokens": prefill,
            "decode_tokens": sum(step.new) - prefill,
            "sampled": sum(step.samples),
            "preempted": len(step.preempted),
            "h2d_bytes": self.kv.h2d_bytes - h2d,
            "d2h_bytes": self.kv.d2h_bytes - d2h,
            "new_tokens": list(step.new),
            "context": list(step.context),
        }
