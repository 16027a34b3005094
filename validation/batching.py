"""Continuous batching with the simulator's rules (``sim/instance/rules.py``), for the
mini-engine.

Each step: running requests first, in admission order, each given the tokens it still
needs until the token budget is spent; if the KV blocks do not suffice, the newest running
requests are preempted by recompute (vLLM's loop); then, if nothing was preempted, waiting
requests are admitted FCFS while the budget, ``max_num_seqs`` and free blocks allow. A
request admitted with a prefix hit starts after the hit tokens; one whose hit must first be
loaded from the host pool waits, and goes first in line once the load is done (when, is
:meth:`Batcher._finish_loads`). Swap preemption, sparse access, SSD, KV compression and
eviction policies other than ``lru`` are not implemented here: :func:`check_engine` refuses
them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sim.config.run import RunConfig
from sim.errors import KvsimError
from sim.instance.rules import (
    admit_fcfs,
    admitted_tokens,
    max_sequence_tokens,
    share_budget_list,
)
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
    kv, problems = config.kv, []
    if config.engine.preemption != "recompute":
        problems.append("engine.preemption: swap (recompute only)")
    if kv.prefix_caching and kv.mode == "dram_centric":
        problems.append("kv.prefix_caching with kv.mode: dram_centric (set it to false)")
    if kv.prefix_caching and any(kv.eviction_for(t) != "lru" for t in ("hbm", "dram")):
        problems.append("kv.eviction other than lru (lru only)")
    if kv.access.kind != "full":
        problems.append("kv.access: sparse (full only)")
    if kv.mode == "offload" and kv.write_policy != "write_through":
        problems.append("kv.write_policy: write_back (write_through only)")
    ssd = config.tier_capacity("ssd")[1]
    if kv.mode == "offload" and ssd > 0:
        problems.append("an SSD tier (set kv.ssd_capacity: 0)")
    if kv.dtype or kv.dram_dtype or kv.ssd_dtype:
        problems.append("kv.dtype / kv.dram_dtype / kv.ssd_dtype (KV in the model dtype only)")
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
        self.loading: list[tuple[int, int]] = []  # (request, blocks) loads in start order
        self.last: Step | None = None
        self.running: list[int] = []
        self.finished: list[int] = []
        self.rejected: list[int] = []
        self.max_len = max_sequence_tokens(self.engine, kv.capacity)

    def add(self, rid: int) -> None:
        """A request arrives: queue it, or reject it if it can never run."""
        if self.prompt[rid] + self.output[rid] > self.max_len:
            self.rejected.append(rid)
        else:
            self.waiting.append(rid)

    @property
    def has_work(self) -> bool:
        """Whether any request waits, loads or runs."""
        return bool(self.waiting or self.running or self.loading)

    def _total(self, rid: int) -> int:
        return self.prompt[rid] + self.generated[rid]

    def _preempt(self, rid: int) -> None:
        self.kv.preempt(rid, self._total(rid), self.computed[rid])
        self.computed[rid] = 0
        self.preemptions[rid] += 1
        self.waiting.appendleft(rid)

    def _schedule_running(self, budget: int) -> tuple[list[int], list[int], list[int]]:
        remaining = [self._total(rid) - self.computed[rid] for rid in self.running]
        tokens = share_budget_list(remaining, budget)
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

    def _admit_one(self, rid: int, budget: int) -> int | None:
        """Admit the queue head: its tokens this step, 0 if it went loading, None if it can't."""
        kv, bt = self.kv, self.engine.block_tokens
        fresh = kv.held(rid) == 0  # new, or preempted: look up its prefix
        hits = kv.match(rid) if fresh else []
        start = len(hits) * bt if fresh else self.computed[rid]
        n = admitted_tokens(self._total(rid), start, budget, self.engine.chunked_prefill)
        if n is None:
            return None
        cost = kv.admission_cost(rid, hits, start + n) if fresh else kv.need(rid, start + n)
        if cost > kv.available:
            return None
        if fresh:
            self.computed[rid] = start
            loaded = kv.take(rid, hits)
            if loaded:
                self.loading.append((rid, loaded))
                return 0
        kv.allocate(rid, start + n)
        return n

    def _admit(self, budget: int) -> tuple[list[int], list[int]]:
        seats = self.engine.max_num_seqs - len(self.running)
        return admit_fcfs(self.waiting, budget, seats, self._admit_one)

    def _finish_loads(self) -> None:
        """Loads done since the last step go first in line, as the simulator's engine has them.

        Loads share the link fairly, so fewer blocks finish first (ties: in start order) and
        each goes to the head of the queue. After a step ran, all have finished (a load of a
        few blocks is far shorter than a step); after a step that only preempted, none (no
        time passed); after an empty step, the engine waited for the first to finish.
        """
        last, self.last = self.last, None
        if not self.loading or (last is not None and not last.ids and last.preempted):
            return
        done = sorted(self.loading, key=lambda load: load[1])
        if last is not None and not last.ids:
            done = [load for load in done if load[1] == done[0][1]]
        for load in done:
            self.loading.remove(load)
            self.kv.loaded(load[0])
            self.waiting.appendleft(load[0])

    def _stuck(self) -> bool:
        """Nothing runs or loads, and the queue head could not be admitted."""
        return not self.running and not self.loading and bool(self.waiting)

    def _return_held_blocks(self) -> bool:
        """Liveness, as the simulator: requests behind the queue head holding the prefix blocks
        they loaded give them back to the cache (still findable). True if any did."""
        head = self.waiting[0]
        holders = [r for r in self.waiting if r != head and self.kv.held(r) > 0]
        for rid in reversed(holders):
            self.kv.release(rid)
            self.computed[rid] = 0
        return bool(holders)

    def schedule(self) -> Step:
        """Choose the next step's batch."""
        self._finish_loads()
        budget = self.engine.max_batched_tokens
        ids, tokens, preempted = self._schedule_running(budget)
        active = [(r, n) for r, n in zip(ids, tokens, strict=True) if n > 0]
        if not preempted:
            new_ids, new_tokens = self._admit(budget - sum(n for _, n in active))
            if not new_ids and self._stuck() and self._return_held_blocks():
                new_ids, new_tokens = self._admit(budget)
            self.running += new_ids
            active += list(zip(new_ids, new_tokens, strict=True))
        ids = [r for r, _ in active]
        new = [n for _, n in active]
        context = [self.computed[r] for r in ids]
        samples = [c + n == self._total(r) for r, c, n in zip(ids, context, new, strict=True)]
        self.last = Step(ids, context, new, samples, preempted)
        return self.last

    def complete(self, step: Step) -> list[int]:
        """Apply a finished step; returns the requests that finished."""
        done = []
        if step.ids:  # every load in flight ended during the step, before its KV is written
            for rid, _ in sorted(self.loading, key=lambda load: load[1]):
                self.kv.loaded(rid)
        for rid, n in zip(step.ids, step.new, strict=True):
            self.computed[rid] += n
            self.kv.register(rid, self.computed[rid])
        for rid, sampled in zip(step.ids, step.samples, strict=True):
            if sampled:
                self.generated[rid] += 1
                if self.generated[rid] >= self.output[rid]:
                    done.append(rid)
        for rid in done:
            self.kv.finish(rid)
            self.running.remove(rid)
            self.finished.append(rid)
        return done
