"""A run's steps planned one at a time in plain Python: ``hbm`` mode without prefix caching.

Without prefix caching a run's state is a few integers per running request (tokens computed
and generated, blocks held), and no block is cached or evicted: the pool's free blocks are
a count. A step is then the scheduler's rule on those integers (the running requests'
tokens in order while the budget lasts, then admissions FCFS), and its price is the cost
model's roofline on integer sums: every term of the roofline's attention sums is an
integer below 2**53 (:func:`exact`), so a sum in any order is exact, and the plain-float
formulas below give the very floats :meth:`CostModel.step` gives. Decode steps between two
events (an arrival, a finish, a block shortage) are a tight loop of a few integer updates
each; block allocations wait in a list and are made in one call
(:meth:`KvManager.grow_each`) before any block is freed, in the order the scheduler makes
them, so the block ids are the same too.

Equal to ``engine.decode_runs: false`` (tests/test_decode_runs.py). Where the sums could be
inexact or the cost model is not the roofline (measured operator tables), each step's
attention is the cost model's own call instead (:func:`exact`). With prefix caching, the
piece planner (:mod:`sim.instance.runs`) plans the runs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sim.instance.events import StepHost
from sim.instance.rules import admitted_tokens, blocks_for, share_budget_list
from sim.instance.runlog import RunLog
from sim.instance.scheduler import FINISHED, RUNNING
from sim.memory.blocks import HBM

EXACT = 2.0**53  # integer float sums below this are exact
NO_HITS = [0, 0, 0]


class Tally(NamedTuple):
    """What a step computes: its tokens, sequences sampling, prefill tokens, blocks read
    and attention seconds."""

    tokens: int
    sampled: int
    prefill: int
    reads: int
    attention: float


def applies(engine: StepHost) -> bool:
    """Whether ``engine``'s runs are planned a step at a time here: without prefix caching,
    or with it but a workload that names no prefix (then a run is planned here while no
    block is cached and no request holds hashes of its own: :meth:`StepPlanner.plan`)."""
    return not engine.kv.prefix or not engine.kv.index.named


def exact(engine: StepHost) -> bool:
    """Whether plain-float roofline formulas give ``engine``'s cost model's floats.

    The roofline's attention sums (numpy's, pairwise) are sums of terms ``tokens * bytes *
    layers`` and ``pairs * flops * layers``: with whole KV bytes per token and an even FLOP
    count per pair (``pairs`` are halves), every term and partial sum is an integer, exact
    below 2**53 whatever the order. The bounds: the running sequences' contexts fit in the
    pool, and a step's prefill tokens in the budget. Elsewhere (measured operator tables, a
    pool past the bound) each step's attention is the cost model's own call.
    """
    kv, cost, config = engine.kv, engine.cost, engine.config.engine
    if not cost.roofline_attention:
        return False
    kv_bytes, flops = float(cost.kv_bytes_per_token_layer), float(cost.attention_flops_per_pair)
    if not (kv_bytes.is_integer() and (flops / 2).is_integer()):
        return False
    pool = float(kv.home.capacity * config.block_tokens + config.max_batched_tokens)
    spans = (pool + config.max_num_seqs) * max(kv_bytes, flops) * cost.model.layers
    keys = pool + cost.params.attention_extra_keys  # a query token's keys, at most
    pairs = config.max_batched_tokens * keys * flops * cost.model.layers
    return max(spans, pairs) < EXACT


class StepPlanner:
    """Plans a run's steps into a :class:`RunLog` until one needs the clock."""

    def __init__(self, engine: StepHost, limit: int):
        self.e, self.limit = engine, limit
        cost, params, model = engine.cost, engine.cost.params, engine.cost.model
        self.bt = engine.config.engine.block_tokens
        self.budget = engine.config.engine.max_batched_tokens
        self.seats = engine.config.engine.max_num_seqs
        self.chunked = engine.config.engine.chunked_prefill
        self.kv_bytes = cost.kv_bytes_per_token_layer
        self.flops = cost.attention_flops_per_pair
        self.layers = model.layers
        self.kernel = cost.kernel_seconds  # the roofline's kernel formula, on exact sums
        self.latency = model.layers * params.attention_latency_s
        self.decode_latency = model.layers * params.decode_latency_s
        self.extra_keys = params.attention_extra_keys
        self.reads_bound = cost.decode_reads_bound
        self.overhead = cost.overhead_s  # the step's overhead, by its sequences
        self.window = model.sliding_window or 0  # 0: attention reads the whole context
        self.exact = exact(engine)  # else each step's attention is the cost model's call

    # --- the run --------------------------------------------------------------------------

    def plan(self, log: RunLog) -> None:
        """Take steps into ``log`` until the run must end (``log.last``), nothing runs, a step
        needs the normal loop (a preemption, a swapped request waiting) or the log is full."""
        e = self.e
        s, kv = e.scheduler, e.kv
        hbm = kv.tiers[HBM]
        if hbm.evictable or kv.index.owners:  # a preempted request's blocks are cached
            return
        ids = s.running
        self.ids: list[int] = ids.tolist()
        self.computed: list[int] = s.computed[ids].tolist()
        self.generated: list[int] = s.generated[ids].tolist()
        self.prompt: list[int] = s.prompt[ids].tolist()
        self.output: list[int] = s.output[ids].tolist()
        self.held: list[int] = kv.held[ids].tolist()
        self.available, self.resident = kv.available, hbm.resident
        # blocks to allocate, in order: (request, its first new block's number, how many)
        self.pending: tuple[list[int], list[int], list[int]] = ([], [], [])
        self.decoding = all(  # every running request decodes
            g and p + g - c == 1
            for c, g, p in zip(self.computed, self.generated, self.prompt, strict=True)
        )
        if (
            e.arrivals.next_arrival_s <= log.now
        ):  # delivered now, before or after: SimPy's order decides
            log.last = True
        while self.ids and not log.last and log.steps < self.limit:
            if not (self._decodes(log) or self._step(log)):
                break
        self._flush()
        s.running = np.array(self.ids, dtype=np.int64)
        s.computed[s.running] = self.computed
        s.generated[s.running] = self.generated

    def _grow(self, rid: int, first: int, count: int) -> None:
        """``rid`` needs ``count`` more blocks, numbered from ``first`` (allocated later)."""
        rids, firsts, counts = self.pending
        rids.append(rid)
        firsts.append(first)
        counts.append(count)
        self.available -= count
        self.resident += count

    def _flush(self) -> None:
        """Allocate the pending blocks, in order (as the scheduler's calls would)."""
        rids, firsts, counts = self.pending
        if not rids:
            return
        n = np.array(counts, dtype=np.int64)
        starts = np.cumsum(n) - n
        offsets = np.arange(int(starts[-1] + n[-1]), dtype=np.int64) - np.repeat(starts, n)
        positions = np.repeat(np.array(firsts, dtype=np.int64), n) + offsets
        self.e.kv.grow_each(np.repeat(np.array(rids, dtype=np.int64), n), positions)
        self.pending = ([], [], [])

    # --- one step by the scheduler's rule -------------------------------------------------------

    def _step(self, log: RunLog) -> bool:
        """One step as :meth:`Scheduler.schedule` and :meth:`Scheduler.complete` take it;
        False (nothing changed) if it preempts or would admit a swapped-out request."""
        e, bt = self.e, self.bt
        s, kv = e.scheduler, e.kv
        if s.waiting and kv.swapped:
            return False
        computed, held = self.computed, self.held
        remaining = [
            p + g - c for p, g, c in zip(self.prompt, self.generated, computed, strict=True)
        ]
        tokens = share_budget_list(remaining, self.budget)
        grow = [-(-(c + n) // bt) - h for c, n, h in zip(computed, tokens, held, strict=True)]
        if sum(g for g in grow if g > 0) > self.available:
            return False  # the normal loop preempts
        for i, g in enumerate(grow):
            if g > 0:
                self._grow(self.ids[i], held[i], g)
                held[i] += g
        self._admit(log.now, self.budget - sum(tokens), tokens)
        self._finish_step(log, tokens)
        return True

    def _admit(self, now: float, budget: int, tokens: list[int]) -> None:
        """Admit waiting requests FCFS (:meth:`Scheduler._admit_waiting` without prefix
        caching: each holds nothing and starts at its first token); ``tokens`` gets theirs."""
        s, bt, admitted = self.e.scheduler, self.bt, self.e.kv.loads.admitted
        seats = self.seats - len(self.ids)
        while s.waiting and budget > 0 and seats > 0:
            rid = s.waiting[0]
            n = admitted_tokens(int(s.prompt[rid] + s.generated[rid]), 0, budget, self.chunked)
            if n is None or (blocks := blocks_for(n, bt)) > self.available:
                return
            s.waiting.popleft()
            s.computed[rid] = 0
            s.status[rid] = RUNNING
            admitted[rid] = True  # its first admission (a lookup would find nothing)
            if np.isnan(s.scheduled_s[rid]):
                s.scheduled_s[rid] = now
            self._grow(rid, 0, blocks)
            self.ids.append(rid)
            self.computed.append(0)
            self.generated.append(int(s.generated[rid]))
            self.prompt.append(int(s.prompt[rid]))
            self.output.append(int(s.output[rid]))
            self.held.append(blocks)
            tokens.append(n)
            budget -= n
            seats -= 1

    def tally(
        self, tokens: list[int], computed: list[int], prompt: list[int], generated: list[int]
    ) -> Tally:
        """A step giving ``tokens`` to sequences of ``prompt`` and ``generated`` tokens that
        hold ``computed`` (those given none are left out, as from the scheduler's batch)."""
        bt = self.bt
        window = self.window
        pairs, attended, spans, decodes, sampled, prefill, reads = 0.0, 0, 0, 0, 0, 0, 0
        for n, c, p, g in zip(tokens, computed, prompt, generated, strict=True):
            if not n:
                continue
            reads += -(-c // bt)
            sampled += c + n == p + g
            a = min(c, window) if window else c  # the cached tokens attention reads
            if n == 1:
                spans += a + 1
                decodes += 1
                prefill += c < p  # a prompt's last token
            else:
                pairs += n * (a + (n + 1.0) / 2.0 + self.extra_keys)
                attended += a + n
                prefill += n
        if not self.exact:
            active = [i for i, n in enumerate(tokens) if n]
            new, context = np.array(tokens)[active], np.array(computed)[active]
            attention = self.e.cost.attention_time(new, context)
            return Tally(sum(tokens), sampled, prefill, reads, attention)
        attention = 0.0  # as CostModel.attention_time adds its terms
        if attended:
            flops, traffic = (
                pairs * self.flops * self.layers,
                attended * self.kv_bytes * self.layers,
            )
            attention += self.kernel(flops, traffic)
            attention += self.latency
        if decodes:
            attention += self._decode_kernel(spans)
            attention += self.decode_latency
        return Tally(sum(tokens), sampled, prefill, reads, attention)

    def _finish_step(self, log: RunLog, tokens: list[int]) -> None:
        """Price the step of ``tokens`` per running request, wait for it, complete it."""
        e = self.e
        computed, generated, prompt = self.computed, self.generated, self.prompt
        total, sampled, prefill, reads, attention = self.tally(tokens, computed, prompt, generated)
        linear = e.cost.linear_time(total, sampled)
        overhead = self.overhead(len(tokens) - tokens.count(0), linear + attention)
        compute = linear + attention + overhead
        end = log.now + compute
        log.compute.append(compute)
        log.batch.append(len(tokens) - tokens.count(0))
        log.tokens.append(total)
        log.prefill.append(prefill)
        log.sampled.append(sampled)
        log.linear.append(linear)
        log.attention.append(attention)
        log.overhead.append(overhead)
        log.activations.append(e.cost.activation_bytes(total, sampled))
        log.reads.append(reads)
        log.hits.append(NO_HITS)
        log.deliver(e, [end])
        done, decoding = [], True
        for i, n in enumerate(tokens):
            c, g, p = computed[i] + n, generated[i], prompt[i]
            computed[i] = c
            if n and c == p + g:  # it samples
                if g == 0:
                    e.scheduler.first_token_s[self.ids[i]] = end
                generated[i] = g = g + 1
                if g >= self.output[i]:
                    done.append(i)
                    continue
            decoding = decoding and g > 0 and p + g - c == 1
        self.decoding = decoding
        self._release(done, end)
        log.running.append(len(self.ids))
        log.resident.append(self.resident)
        log.cached.append(0)

    def _decode_kernel(self, spans: int) -> float:
        """The decode kernel's time over sequences attending ``spans`` tokens in all."""
        flops = 0.0 if self.reads_bound else spans * self.flops * self.layers
        return self.kernel(flops, spans * self.kv_bytes * self.layers, True)

    def _release(self, done: list[int], end: float) -> None:
        """The requests at ``done`` (indices, in batch order) finished at ``end``."""
        if not done:
            return
        e = self.e
        s, kv = e.scheduler, e.kv
        self._flush()
        e.clock.planned_s = end
        for i in done:
            rid = self.ids[i]
            s.finish_s[rid] = end
            s.status[rid] = FINISHED
            s.computed[rid] = self.computed[i]
            s.generated[rid] = self.generated[i]
            kv.finish(rid)
            self.available += self.held[i]
            self.resident -= self.held[i]
        if s.freed is not None:
            s.freed(len(done), end)
        gone = set(done)
        kept = [i for i in range(len(self.ids)) if i not in gone]
        for name in ("ids", "computed", "generated", "prompt", "output", "held"):
            column = getattr(self, name)
            setattr(self, name, [column[i] for i in kept])

    # --- decode steps -------------------------------------------------------------------------

    def _decodes(self, log: RunLog) -> bool:
        """Decode steps while every running request decodes and nobody can join: up to the
        next finish, arrival or block shortage. False if the next step is not one."""
        e, bt, n = self.e, self.bt, len(self.ids)
        computed, generated, held, output = self.computed, self.generated, self.held, self.output
        if n > self.budget or not self.decoding:
            return False
        due: list[list[int]] = [[] for _ in range(bt)]  # who starts a block, by step mod bt
        for i in range(n):
            due[held[i] * bt - computed[i]].append(i)
        if len(due[0]) > self.available:
            return False  # the normal loop preempts
        if not self._nobody_joins(len(due[0])):
            return False
        finish = min(o - g for o, g in zip(output, generated, strict=True))
        steps = min(finish, self.limit - log.steps)
        taken = self._decode_steps(log, due, steps)
        for i in range(n):
            computed[i] += taken
            generated[i] += taken
            held[i] = -(-computed[i] // bt)
        linear, activations = e.cost.linear_time(n, n), e.cost.activation_bytes(n, n)
        for column, value in (
            (log.batch, n), (log.tokens, n), (log.prefill, 0), (log.sampled, n),
            (log.linear, linear), (log.activations, activations),
            (log.hits, NO_HITS), (log.running, n), (log.cached, 0),
        ):  # fmt: skip
            column += [value] * taken
        if taken == finish:
            done = [i for i in range(n) if generated[i] >= output[i]]
            self._release(done, log.now)
            log.running[-1] = len(self.ids)
            log.resident[-1] = self.resident
        return True

    def _decode_steps(self, log: RunLog, due: list[list[int]], steps: int) -> int:
        """Up to ``steps`` decode steps of the running requests (those at ``due[j % bt]``
        start a block in step ``j``), fewer if a request arrives (its step is the last) or the
        pool runs short (the run ends before that step); logs what changes; how many steps."""
        bt, n, ids, held, grow = self.bt, len(self.ids), self.ids, self.held, self._grow
        spans, growth, full = self._spans()
        reads = sum(held)
        linear, overhead = self.e.cost.linear_time(n, n), self.overhead
        steady = self.e.cost.constant_overhead_s(n)
        compute_at, attention_at = log.compute.append, log.attention.append
        reads_at, resident_at, spent_at = log.reads.append, log.resident.append, log.overhead.append
        exact, ones, contexts = self.exact, None, None
        if not exact:  # each step's attention is the cost model's call
            ones, contexts = np.ones(n, dtype=np.int64), np.array(self.computed)
        arrival, ends, now, taken = self.e.arrivals.next_arrival_s, [], log.now, 0
        while taken < steps:
            new = due[taken % bt]
            if len(new) > self.available:
                log.last = True  # the normal loop preempts
                break
            for i in new:
                grow(ids[i], held[i] + taken // bt, 1)
            if exact:
                attention = self._decode_kernel(spans) + self.decode_latency
            else:
                attention = self.e.cost.attention_time(ones, contexts + taken)
            spent = overhead(n, linear + attention) if steady is None else steady
            compute = linear + attention + spent
            now = now + compute
            compute_at(compute)
            attention_at(attention)
            spent_at(spent)
            reads_at(reads)
            resident_at(self.resident)
            reads += len(new)
            spans += growth
            taken += 1
            if full:  # sequences whose attention reaches the window from this step on
                growth -= full.get(taken, 0)
            ends.append(now)
            if now >= arrival:  # the step a request arrives in is the last
                break
        if ends:
            log.deliver(self.e, ends)
        return taken

    def _spans(self) -> tuple[int, int, dict[int, int]]:
        """The running sequences' attended tokens in the next decode step, how many more
        each step (those whose attention has not reached the window), and how many reach
        it at each step ahead."""
        n, window = len(self.ids), self.window
        if not window:
            return sum(self.computed) + n, n, {}
        spans = sum(min(c, window) for c in self.computed) + n
        full: dict[int, int] = {}
        for c in self.computed:
            if c < window:
                full[window - c] = full.get(window - c, 0) + 1
        return spans, sum(full.values()), full

    def _nobody_joins(self, first: int) -> bool:
        """Whether no waiting request can join the decode steps ahead (the first of which
        allocates ``first`` blocks): none waits, no seat or budget is left, or the queue head
        is refused now (and stays so while blocks only go)."""
        s, kv = self.e.scheduler, self.e.kv
        budget = self.budget - len(self.ids)
        if not s.waiting or budget <= 0 or len(self.ids) >= self.seats:
            return True
        rid = s.waiting[0]
        if rid in kv.swapped:
            return False
        n = admitted_tokens(int(s.prompt[rid] + s.generated[rid]), 0, budget, self.chunked)
        return n is None or blocks_for(n, self.bt) > self.available - first
