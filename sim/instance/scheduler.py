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
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import NamedTuple

import numpy as np
import simpy

from sim.config.kv import LOOKAHEAD_REQUESTS
from sim.config.run import EngineConfig
from sim.instance.rules import (
    admit_fcfs,
    admitted_tokens,
    blocks_for,
    max_sequence_tokens,
    share_budget,
)
from sim.kv.manager import NO_HITS, KvManager, PrefixHits
from sim.kv.reads import is_decode
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

    num_sampled: int = field(init=False)  # sequences that produce a token this step
    num_tokens: int = field(init=False)  # tokens computed this step

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_sampled", int(self.samples.sum()))
        object.__setattr__(self, "num_tokens", int(self.new_tokens.sum()))


def prefill_tokens(batch: Batch, prompt: np.ndarray) -> int:
    """The batch's tokens that are not decodes (a decode adds one token past its prompt)."""
    decode = is_decode(batch.new_tokens, batch.context, prompt[batch.ids])
    return batch.num_tokens - int(np.count_nonzero(decode))


class Admission(NamedTuple):
    """What admitting a request would do (:meth:`Scheduler.plan_admission`)."""

    hits: PrefixHits  # its cached prefix
    start: int  # the token it starts computing at
    tokens: int  # tokens it computes this step
    blocks: int  # home-tier blocks that takes


class Scheduler:
    """Owns the waiting queue, the running set and every request's progress (numpy arrays)."""

    def __init__(self, engine: EngineConfig, requests: Requests, kv: KvManager):
        self.engine = engine
        self.kv = kv
        n = len(requests)
        self.prompt = requests.prompt_tokens.astype(np.int64)
        self.output = requests.output_tokens.astype(np.int64)
        self.computed = np.zeros(n, dtype=np.int64)
        self.generated = np.zeros(n, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.recomputed_tokens = 0
        self.status = np.zeros(n, dtype=np.int8)
        self.scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.reject_reason: dict[int, str] = {}
        self.waiting: deque[int] = deque()
        self.running = np.zeros(0, dtype=np.int64)
        self.loading = 0
        self.max_len = max_sequence_tokens(engine, kv.home.capacity)
        kv.on_loaded = self.loaded
        # prefill/decode disaggregation (sim/cluster/handoff.py sets the two hooks)
        self.receiving = np.zeros(n, dtype=bool)  # its KV comes from a prefill instance
        self.sending = np.zeros(n, dtype=bool)  # prefilled here for a decode instance
        self.handed = np.zeros(n, dtype=bool)  # its KV came by handoff; not yet running
        self.fill: Callable[[int, int], simpy.Event] | None = None  # (rid, tokens) -> landed
        self.prefilled: Callable[[int, float], None] | None = None  # (rid, now): KV ready
        # a closed-loop client (workload.max_concurrency; sim/cluster/feed.py sets it):
        # (requests, when) left the engine, finished or rejected (when None: at arrival)
        self.freed: Callable[[int, float | None], None] | None = None

    # --- arrivals ---------------------------------------------------------------------------

    def add(self, rid: int) -> bool:
        """A request arrives: queue it, or reject it if it can never run."""
        length = int(self.prompt[rid] + self.output[rid])
        if length > self.max_len:
            self.status[rid] = REJECTED
            self.reject_reason[rid] = self._reason(length)
            if self.freed is not None:
                self.freed(1, None)
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

    def loaded(self, rid: int) -> None:
        """A request's prefix finished loading from a lower tier: it goes first in line."""
        self.loading -= 1
        self.waiting.appendleft(rid)

    @property
    def has_work(self) -> bool:
        """Whether any request is waiting, loading or running."""
        return bool(self.waiting) or len(self.running) > 0 or self.loading > 0

    # --- one step ---------------------------------------------------------------------------

    def _remaining(self, ids: np.ndarray) -> np.ndarray:
        return self.prompt[ids] + self.generated[ids] - self.computed[ids]

    def running_tokens(self, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each running request's tokens this step, in order (all it needs while ``budget``
        lasts), the tokens it then holds, and the new blocks it needs for them."""
        ids = self.running
        computed = self.computed[ids]
        remaining = self.prompt[ids] + self.generated[ids] - computed
        n = share_budget(remaining, budget)
        target = computed + n
        return n, target, -(-target // self.engine.block_tokens) - self.kv.held[ids]

    def _schedule_running(self, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Tokens for each running request in order, preempting from the tail if needed."""
        ids = self.running
        n, target, need = self.running_tokens(budget)
        if self.allocate_running(target, need):
            return ids, n, ids[:0]
        return self._schedule_running_preempting(ids, n)

    def allocate_running(self, target: np.ndarray, need: np.ndarray) -> bool:
        """Give the running requests their new blocks (``need`` each, to hold ``target``
        tokens) if the pool has them all; False (nothing allocated) if it has not."""
        growing = np.flatnonzero(need > 0)
        if int(need[growing].sum()) > self.kv.available:
            return False
        allocate, ids = self.kv.allocate, self.running
        for rid, t in zip(ids[growing].tolist(), target[growing].tolist(), strict=True):
            allocate(rid, t)
        return True

    def _schedule_running_preempting(self, ids: np.ndarray, n: np.ndarray):
        """vLLM's loop: allocate in order; when a request does not fit, preempt the newest."""
        running = ids.tolist()
        tokens = n.tolist()
        preempted: list[int] = []
        i = 0
        while i < len(running):
            rid, target = running[i], int(self.computed[running[i]]) + tokens[i]
            while self.kv.need(rid, target) > self.kv.available:
                victim = running.pop()
                preempted.append(victim)
                self._preempt(victim)
                if victim == rid:
                    break
            else:
                self.kv.allocate(rid, target)
                i += 1
                continue
            break
        kept = np.asarray(running, dtype=np.int64)
        self.running = kept
        return (
            kept,
            np.asarray(tokens[: len(running)], dtype=np.int64),
            np.asarray(preempted, dtype=np.int64),
        )

    def _preempt(self, rid: int) -> None:
        """Preempt by swap (KV kept in DRAM) or recompute (KV dropped); back to the queue head."""
        tokens = int(self.prompt[rid] + self.generated[rid])
        swapped = self.kv.preempt(
            rid, self.engine.preemption == "swap", tokens, int(self.computed[rid])
        )
        if not swapped:
            self.recomputed_tokens += int(self.computed[rid])
            self.computed[rid] = 0
        self.preemptions[rid] += 1
        self.status[rid] = WAITING
        self._requeue(rid)

    def _requeue(self, rid: int) -> None:
        """Back to the queue's head, behind the requests whose handed-off KV has landed: they
        hold their KV and need one token; a recomputing request admitted before them could
        take the budget, be preempted for their blocks the next step, and so on for ever."""
        waiting, handed = self.waiting, self.handed
        behind = 0
        while behind < len(waiting) and handed[waiting[behind]]:
            behind += 1
        waiting.insert(behind, rid)

    def plan_admission(self, rid: int, budget: int) -> Admission | None:
        """Admitting ``rid`` (not swapped) with ``budget`` tokens left, applying nothing; None
        if the budget refuses it (no chunked prefill, and its rest does not fit)."""
        kv = self.kv
        fresh = kv.held[rid] == 0  # new, or preempted by recompute: look up its prefix
        hits = kv.match(rid) if fresh else NO_HITS
        start = len(hits) * self.engine.block_tokens if fresh else int(self.computed[rid])
        total = int(self.prompt[rid] + self.generated[rid])
        n = admitted_tokens(total, start, budget, self.engine.chunked_prefill)
        if n is None:
            return None
        cost = kv.admission_cost(rid, hits, start + n) if fresh else kv.need(rid, start + n)
        return Admission(hits, start, n, cost)

    def _admit_one(self, rid: int, budget: int) -> int | None:
        """Admit the queue head: its tokens this step, 0 if it went loading, None if it can't."""
        kv = self.kv
        if self.receiving[rid]:
            return self._admit_handoff(rid)
        if rid in kv.swapped:
            n = min(int(self._remaining(np.array([rid]))[0]), budget)
            if kv.swap_in_blocks(rid) + kv.need(rid, int(self.computed[rid]) + n) > kv.available:
                return None
            kv.swap_in(rid)
            kv.allocate(rid, int(self.computed[rid]) + n)
            return n
        plan = self.plan_admission(rid, budget)
        if plan is None or plan.blocks > kv.available:
            return None
        hits, start, n, _ = plan
        if kv.held[rid] == 0:
            self.computed[rid] = start
            if kv.take(rid, hits):
                self.loading += 1
                return 0
        kv.allocate(rid, start + n)
        return n

    def _admit_handoff(self, rid: int) -> int | None:
        """Admit a disaggregated request (as vLLM's KV connectors do): its cached prefix here,
        and room for the rest of its prompt but the last token, whose KV its prefill instance
        sends (it waits in "loading" until it landed, then computes the last token); None if
        the room is not there (it waits in the queue, before its prefill)."""
        kv, prompt = self.kv, int(self.prompt[rid])
        own = kv.index.match(rid)
        k = blocks_for(prompt - 1, self.engine.block_tokens) - len(own)
        hits = PrefixHits(own.blocks, own.tiers, k)
        if kv.admission_cost(rid, hits, prompt) > kv.available:
            return None
        assert self.fill is not None
        tokens, fill = prompt - 1 - len(own) * self.engine.block_tokens, self.fill
        self.receiving[rid] = False
        self.handed[rid] = True
        self.computed[rid] = prompt - 1
        kv.loads.take(rid, hits, lambda blocks: fill(rid, tokens))
        self.loading += 1
        return 0

    def _admit_waiting(self, budget: int, now: float) -> tuple[list[int], list[int]]:
        """Admit waiting requests FCFS while budget, sequence cap and blocks allow."""
        seats = self.engine.max_num_seqs - len(self.running)
        return admit_fcfs(
            self.waiting, budget, seats, self._admit_one, lambda rid: self._start(rid, now)
        )

    def _start(self, rid: int, now: float) -> None:
        self.status[rid] = RUNNING
        self.handed[rid] = False
        if np.isnan(self.scheduled_s[rid]):
            self.scheduled_s[rid] = now

    def _stuck(self) -> bool:
        """Nothing runs or loads, and the queue head could not be admitted."""
        return len(self.running) == 0 and self.loading == 0 and bool(self.waiting)

    def _return_held_blocks(self) -> bool:
        """Liveness: requests behind the queue head that hold the prefix blocks they loaded
        (a preempted request was queued in front of them) give the blocks back to the cache,
        where they stay findable, and will match their prefix again. True if any did."""
        kv, head = self.kv, self.waiting[0]
        holders = [r for r in self.waiting if r != head and kv.held[r] > 0 and r not in kv.swapped]
        for rid in reversed(holders):
            kv.release(rid)
            self.computed[rid] = 0
        return bool(holders)

    def schedule(self, now: float) -> Batch:
        """Choose the next step's batch."""
        budget = self.engine.max_batched_tokens
        if self.kv.prefix:
            self.kv.hint_upcoming(list(islice(self.waiting, LOOKAHEAD_REQUESTS)))
        ids, n, preempted = self._schedule_running(budget)
        if len(preempted) == 0:
            new_ids, new_tokens = self._admit_waiting(budget - int(n.sum()), now)
            if not new_ids and self._stuck() and self._return_held_blocks():
                new_ids, new_tokens = self._admit_waiting(budget, now)
            if new_ids:
                new = np.array(new_ids, dtype=np.int64)
                self.running = np.concatenate((self.running, new))
                ids = np.concatenate((ids, new))
                n = np.concatenate((n, np.array(new_tokens, dtype=np.int64)))
        return self.batch(ids, n, preempted)

    def batch(self, ids: np.ndarray, n: np.ndarray, preempted: np.ndarray) -> Batch:
        """The step's batch: ``ids`` with ``n`` new tokens each (those given none left out)."""
        if not n.all():
            active = n > 0
            ids, n = ids[active], n[active]
        context = self.computed[ids]  # a copy (fancy indexing)
        samples = context + n == self.prompt[ids] + self.generated[ids]
        return Batch(ids=ids, new_tokens=n, context=context, samples=samples, preempted=preempted)

    def complete(self, batch: Batch, now: float) -> np.ndarray:
        """Apply a finished step: KV grows, samples are taken, done requests leave."""
        ids, samples = batch.ids, batch.samples
        self.computed[ids] += batch.new_tokens
        if self.kv.prefix:
            self.kv.register_full(ids, self.computed[ids])
        sampled = ids[samples]
        self.generated[sampled] += 1
        first = sampled[np.isnan(self.first_token_s[sampled])]
        self.first_token_s[first] = now
        done = sampled[self.generated[sampled] >= self.output[sampled]]
        if len(done):
            self.finish_s[done] = now
            self.status[done] = FINISHED
            left = 0
            for rid in done.tolist():
                if self.sending[rid]:  # the handoff releases its blocks once they are sent
                    self.sending[rid] = False
                    self.prefilled(rid, now)  # type: ignore[misc]
                else:
                    self.kv.finish(rid)
                    left += 1
            if left and self.freed is not None:
                self.freed(left, now)
            self.running = self.running[self.status[self.running] == RUNNING]
        return done
