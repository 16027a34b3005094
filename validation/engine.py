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

HOST_BLOCKS_FACTOR = 4  # host pool = this many times the blocks the workload could ever hold


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
    """Host pool size: room for every request's whole sequence at once."""
    bt = config.engine.block_tokens
    total = -(-(requests.prompt_tokens + requests.output_tokens) // bt)
    return int(max(total.sum(), config.engine.kv_pool_blocks or 1) + 1)


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
        rng = np.random.default_rng(config.seed)
        self.sequences = [
            rng.integers(0, self.model.vocab, int(p)).tolist() for p in requests.prompt_tokens
        ]
        self.kv = KvPools(
            self.model, config.engine.block_tokens, config.engine.kv_pool_blocks,
            host_blocks(config, requests), config.kv.mode, device,
        )  # fmt: skip
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
                h2d, d2h = kv.h2d_bytes, kv.d2h_bytes
                step = b.schedule()
                if not step.ids:  # only preemptions: the simulator records no step either
                    continue
                self.forward(step)
                b.complete(step)
                rows.append(self._row(step, t0 - start, now_s() - t0, h2d, d2h))
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
