"""Continuous batching with the simulator's rules (``sim/scheduler.py``), for the mini-engine.

Each step: running requests first, in admission order, each given the tokens it still
needs until the token budget is spent; if the KV blocks do not suffice, the newest running
requests are preempted by recompute (vLLM's loop); then, if nothing was preempted, waiting
requests are admitted FCFS while the budget, ``max_num_seqs`` and free blocks allow.
Prefix caching and swap preemption are not implemented here: a config asking for them is
refused by :func:`check_engine`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sim.config.run import RunConfig
from sim.errors import KvsimError
from validation.kvpools import KvPools


@dataclass(frozen=True)
class Step:
    """One step's batch: per sequence, its request, tokens in KV, new tokens, and a sample."""

    ids: list[int]
    context: list[int]
    new: list[int]
    samples: list[bool]
    preempted: list[int]


def check_engine(config: RunConfig) -> None:
    """Refuse settings the mini-engine does not implement, naming the key."""
    problems = []
    if config.engine.preemption != "recompute":
        problems.append("engine.preemption: swap (recompute only)")
    if config.kv.prefix_caching:
        problems.append("kv.prefix_caching: true (set it to false)")
    if config.kv.access.kind != "full":
        problems.append("kv.access: sparse (full only)")
    if problems:
        raise KvsimError("the mini-engine does not implement " + "; ".join(problems))


class Batcher:
    """Waiting queue, running set and every request's progress."""

    def __init__(self, config: RunConfig, prompt: list[int], output: list[int], kv: KvPools):
        self.engine = config.engine
        self.kv = kv
        self.prompt, self.output = prompt, output
        n = len(prompt)
        self.computed = [0] * n
        self.generated = [0] * n
        self.preemptions = [0] * n
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.finished: list[int] = []
        self.rejected: list[int] = []
        limits = [kv.capacity * self.engine.block_tokens + 1]
        if self.engine.max_model_len:
            limits.append(self.engine.max_model_len)
        if not self.engine.chunked_prefill:
            limits.append(self.engine.max_batched_tokens)
        self.max_len = min(limits)

    def add(self, rid: int) -> None:
        """A request arrives: queue it, or reject it if it can never run."""
        if self.prompt[rid] + self.output[rid] > self.max_len:
            self.rejected.append(rid)
        else:
            self.waiting.append(rid)

    @property
    def has_work(self) -> bool:
        """Whether any request waits or runs."""
        return bool(self.waiting or self.running)

    def _total(self, rid: int) -> int:
        return self.prompt[rid] + self.generated[rid]

    def _preempt(self, rid: int) -> None:
        self.kv.release(rid)
        self.computed[rid] = 0
        self.preemptions[rid] += 1
        self.waiting.appendleft(rid)

    def _schedule_running(self, budget: int) -> tuple[list[int], list[int], list[int]]:
        tokens = []
        for rid in self.running:
            n = max(min(self._total(rid) - self.computed[rid], budget), 0)
            tokens.append(n)
            budget -= n
        running, preempted = list(self.running), []
        i = 0
        while i < len(running):
            rid = running[i]
            target = self.computed[rid] + tokens[i]
            if self.kv.need(rid, target) <= self.kv.available:
                self.kv.allocate(rid, target)
                i += 1
                continue
            victim = running.pop()
            preempted.append(victim)
            self._preempt(victim)
        self.running = running
        return running, tokens[: len(running)], preempted

    def _admit(self, budget: int) -> tuple[list[int], list[int]]:
        ids, tokens = [], []
        seats = self.engine.max_num_seqs - len(self.running)
        while self.waiting and budget > 0 and len(ids) < seats:
            rid = self.waiting[0]
            total = self._total(rid)
            if not self.engine.chunked_prefill and total > budget:
                break
            n = min(total, budget)
            if self.kv.need(rid, n) > self.kv.available:
                break
            self.waiting.popleft()
            self.kv.allocate(rid, n)
            ids.append(rid)
            tokens.append(n)
            budget -= n
        return ids, tokens

    def schedule(self) -> Step:
        """Choose the next step's batch."""
        budget = self.engine.max_batched_tokens
        ids, tokens, preempted = self._schedule_running(budget)
        active = [(r, n) for r, n in zip(ids, tokens, strict=True) if n > 0]
        if not preempted:
            new_ids, new_tokens = self._admit(budget - sum(n for _, n in active))
            self.running += new_ids
            active += list(zip(new_ids, new_tokens, strict=True))
        ids = [r for r, _ in active]
        new = [n for _, n in active]
        context = [self.computed[r] for r in ids]
        samples = [c + n == self._total(r) for r, c, n in zip(ids, context, new, strict=True)]
        return Step(ids, context, new, samples, preempted)

    def complete(self, step: Step) -> list[int]:
        """Apply a finished step; returns the requests that finished."""
        done = []
        for rid, n, sampled in zip(step.ids, step.new, step.samples, strict=True):
            self.computed[rid] += n
            if sampled:
                self.generated[rid] += 1
                if self.generated[rid] >= self.output[rid]:
                    done.append(rid)
        for rid in done:
            self.kv.release(rid)
            self.running.remove(rid)
            self.finished.append(rid)
        return done
