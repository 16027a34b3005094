"""Iteration-level continuous batching, as vLLM's v1 scheduler does it.

Each step: running requests first (in admission order), each given the tokens it still
needs (one for a decode, a chunk for a prefill) until the token budget is spent; when the
KV pool cannot hold the new tokens, the newest running requests are preempted by
recompute; then, if nothing was preempted, waiting requests are admitted FCFS while the
budget, ``max_num_seqs`` and free blocks allow.

Token accounting: a request's sequence holds ``prompt + generated`` tokens; ``computed`` of
them are in KV. A step computes ``n`` more; when ``computed`` reaches the sequence length
the step samples a new token. A request is done after ``output_tokens`` samples.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from sim.config.run import EngineConfig
from sim.memory import BlockPool
from sim.workload.requests import Requests

WAITING, RUNNING, FINISHED, REJECTED = 1, 2, 3, 4


@dataclass(frozen=True)
class Batch:
    """What one engine step computes: per scheduled request, its new tokens and context.

    ``samples`` marks the sequences whose step ends their known tokens: they sample a token.
    """

    ids: np.ndarray
    new_tokens: np.ndarray
    context: np.ndarray
    samples: np.ndarray
    preempted: np.ndarray

    @property
    def num_sampled(self) -> int:
        """Sequences that produce a token this step."""
        return int(self.samples.sum())

    @property
    def num_tokens(self) -> int:
        """Tokens computed this step."""
        return int(self.new_tokens.sum())


class Scheduler:
    """Owns the waiting queue, the running set and every request's progress (numpy arrays)."""

    def __init__(self, engine: EngineConfig, requests: Requests, pool: BlockPool):
        self.engine = engine
        self.pool = pool
        n = len(requests)
        self.prompt = requests.prompt_tokens.astype(np.int64)
        self.output = requests.output_tokens.astype(np.int64)
        self.computed = np.zeros(n, dtype=np.int64)
        self.generated = np.zeros(n, dtype=np.int64)
        self.held = np.zeros(n, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.status = np.zeros(n, dtype=np.int8)
        self.scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.reject_reason: dict[int, str] = {}
        self.blocks: list[list[np.ndarray]] = [[] for _ in range(n)]
        self.waiting: deque[int] = deque()
        self.running = np.zeros(0, dtype=np.int64)
        self.max_len = self._max_sequence_tokens()

    # --- arrivals ---------------------------------------------------------------------------

    def _max_sequence_tokens(self) -> int:
        """Longest sequence (prompt + output) the engine can ever hold."""
        limits = [self.pool.num_blocks * self.engine.block_tokens + 1]
        if self.engine.max_model_len:
            limits.append(self.engine.max_model_len)
        if not self.engine.chunked_prefill:
            limits.append(self.engine.max_batched_tokens)
        return min(limits)

    def add(self, rid: int) -> bool:
        """A request arrives: queue it, or reject it if it can never run."""
        length = int(self.prompt[rid] + self.output[rid])
        if length > self.max_len:
            self.status[rid] = REJECTED
            self.reject_reason[rid] = self._reason(length)
            return False
        self.status[rid] = WAITING
        self.waiting.append(rid)
        return True

    def _reason(self, length: int) -> str:
        e = self.engine
        if e.max_model_len and length > e.max_model_len:
            return "exceeds_max_model_len"
        if not e.chunked_prefill and length > e.max_batched_tokens:
            return "exceeds_max_batched_tokens_without_chunked_prefill"
        return "exceeds_kv_pool"

    @property
    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.waiting) or len(self.running) > 0

    # --- one step ---------------------------------------------------------------------------

    def _blocks_for(self, tokens: np.ndarray | int) -> np.ndarray:
        return -(-np.asarray(tokens) // self.engine.block_tokens)

    def _schedule_running(self, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tokens for each running request in order, preempting from the tail if needed."""
        ids = self.running
        remaining = self.prompt[ids] + self.generated[ids] - self.computed[ids]
        before = np.cumsum(remaining) - remaining
        n = np.clip(budget - before, 0, remaining)
        need = np.maximum(self._blocks_for(self.computed[ids] + n) - self.held[ids], 0)
        # keep the longest prefix whose needs fit in the free blocks plus what the
        # requests behind it would release if preempted (vLLM preempts from the tail)
        need_upto = np.concatenate(([0], np.cumsum(need)))
        held_after = np.concatenate((np.cumsum(self.held[ids][::-1])[::-1], [0]))
        fits = need_upto <= self.pool.num_free + held_after
        keep = int(np.flatnonzero(fits)[-1])
        preempted = ids[keep:]
        for rid in preempted[::-1]:
            self._preempt(int(rid))
        self.running = ids[:keep]
        self._allocate(ids[:keep], need[:keep])
        return ids[:keep], n[:keep], preempted

    def _preempt(self, rid: int) -> None:
        """Recompute preemption: drop the request's KV, back to the head of the queue."""
        self._release(rid)
        self.computed[rid] = 0
        self.preemptions[rid] += 1
        self.status[rid] = WAITING
        self.waiting.appendleft(rid)

    def _release(self, rid: int) -> None:
        if self.blocks[rid]:
            self.pool.free(np.concatenate(self.blocks[rid]))
        self.blocks[rid] = []
        self.held[rid] = 0

    def _allocate(self, ids: np.ndarray, need: np.ndarray) -> None:
        total = int(need.sum())
        if total == 0:
            return
        blocks = self.pool.allocate(total)
        ends = np.cumsum(need)
        for rid, count, end in zip(ids.tolist(), need.tolist(), ends.tolist(), strict=True):
            if count:
                self.blocks[rid].append(blocks[end - count : end])
        self.held[ids] += need

    def _admit_waiting(self, budget: int, now: float) -> tuple[list[int], list[int]]:
        """Admit waiting requests FCFS while budget, sequence cap and blocks allow."""
        ids: list[int] = []
        tokens: list[int] = []
        seats = self.engine.max_num_seqs - len(self.running)
        while self.waiting and budget > 0 and len(ids) < seats:
            rid = self.waiting[0]
            remaining = int(self.prompt[rid] + self.generated[rid])
            if not self.engine.chunked_prefill and remaining > budget:
                break
            n = min(remaining, budget)
            need = int(self._blocks_for(n))
            if need > self.pool.num_free:
                break
            self.waiting.popleft()
            self.blocks[rid].append(self.pool.allocate(need))
            self.held[rid] = need
            self.status[rid] = RUNNING
            if np.isnan(self.scheduled_s[rid]):
                self.scheduled_s[rid] = now
            ids.append(rid)
            tokens.append(n)
            budget -= n
        return ids, tokens

    def schedule(self, now: float) -> Batch:
        """Choose the next step's batch."""
        budget = self.engine.max_batched_tokens
        ids, n, preempted = self._schedule_running(budget)
        active = n > 0
        ids, n = ids[active], n[active]
        if len(preempted) == 0:
            new_ids, new_tokens = self._admit_waiting(budget - int(n.sum()), now)
            if new_ids:
                new = np.array(new_ids, dtype=np.int64)
                self.running = np.concatenate((self.running, new))
                ids = np.concatenate((ids, new))
                n = np.concatenate((n, np.array(new_tokens, dtype=np.int64)))
        context = self.computed[ids].copy()
        samples = context + n == self.prompt[ids] + self.generated[ids]
        return Batch(ids=ids, new_tokens=n, context=context, samples=samples, preempted=preempted)

    def complete(self, batch: Batch, now: float) -> np.ndarray:
        """Apply a finished step: KV grows, samples are taken, done requests leave."""
        ids, samples = batch.ids, batch.samples
        self.computed[ids] += batch.new_tokens
        sampled = ids[samples]
        self.generated[sampled] += 1
        first = sampled[np.isnan(self.first_token_s[sampled])]
        self.first_token_s[first] = now
        done = sampled[self.generated[sampled] >= self.output[sampled]]
        if len(done):
            self.finish_s[done] = now
            self.status[done] = FINISHED
            for rid in done.tolist():
                self._release(rid)
            self.running = self.running[np.isin(self.running, done, invert=True)]
        return done
