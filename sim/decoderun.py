"""Decode runs: consecutive decode steps that carry no scheduling decision, taken as arrays.

When every running request is decoding, no waiting request can be admitted and nothing is
moving between tiers (``hbm`` mode, full access, no copies, no prefetch), the steps up to
the next finish are known in advance: the same batch, each context one token longer per
step. A run computes their costs as one array (:meth:`sim.costmodel.CostModel.decode_steps`),
makes the block allocations at block boundaries in the order the scheduler would, waits
one SimPy timeout for all of them, and writes their timeline rows at once.

A run stops at the step in which a request arrives (the next arrival time is known), or
before a step the KV pool cannot give its new blocks (the normal step then preempts).
Results are bit-identical to ``engine.decode_runs: false`` (tests/test_decode_runs.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sim.blocks import DRAM, HBM, SSD
from sim.scheduler import Batch

if TYPE_CHECKING:
    from sim.engine import Engine

FIRST_CHUNK = 16  # steps costed at once at first; doubles while the run goes on
MAX_CHUNK = 1024


class DecodeRuns:
    """Finds and simulates the engine's decode runs."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.steps = 0  # engine steps taken in runs so far
        config, kv = engine.config, engine.kv
        self.enabled = (
            config.engine.decode_runs
            and kv.mode == "hbm"
            and not kv.access.sparse
            and not kv.prefetch.active
            and kv.heat_log is None
            and not config.engine.check
        )

    def length(self) -> int:
        """Steps from now that form a decode run if nothing interrupts it (0: none)."""
        e = self.engine
        s, kv = e.scheduler, e.kv
        if not self.enabled or s.loading or not len(s.running) or kv.blocking:
            return 0  # (in hbm mode no block copies are queued between steps)
        ids = s.running
        if len(ids) > s.engine.max_batched_tokens or any(x.in_flight for x in e.links.all()):
            return 0
        generated = s.generated[ids]
        if (s.prompt[ids] + generated - s.computed[ids] != 1).any() or not generated.all():
            return 0  # someone is still in prefill (or samples its first token)
        if s.waiting and (kv.prefix or not s.head_blocked()):
            return 0
        return int((s.output[ids] - generated).min())  # up to the step of the next finish

    def run(self, steps: int):
        """Simulate up to ``steps`` decode steps (a SimPy generator); returns how many ran."""
        e = self.engine
        kv = e.kv
        ids = e.scheduler.running.copy()
        start = e.scheduler.computed[ids]
        if kv.prefix:
            kv.hint_upcoming([])  # as the scheduler does each step: nothing waits
        log = _RunLog(e.env.now, e._arrived, len(e.scheduler.waiting))
        chunk = FIRST_CHUNK
        while log.steps < steps:
            n = min(chunk, steps - log.steps, MAX_CHUNK)
            ran = yield from self._chunk(ids, start + log.steps, n, log)
            if ran < n or e._arrived != log.arrived:  # a request arrived in its last step
                break
            chunk *= 2
        if log.steps:
            self._apply(ids, start, log, finishes=log.steps == steps)
        return log.steps

    def _chunk(self, ids: np.ndarray, context: np.ndarray, n: int, log: _RunLog):
        """Up to ``n`` steps from ``context``, as one SimPy timeout; fewer if a request
        arrives (the step it arrives in is the last) or the pool runs out of blocks."""
        e = self.engine
        kv, env, hbm = e.kv, e.env, e.kv.tiers[HBM]
        linear, attention, overhead = e.cost.decode_steps(context, n)
        compute = (linear + attention) + overhead  # as StepCost.total_s adds them
        times = np.add.accumulate(np.concatenate(([env.now], compute)))  # as SimPy adds
        grows = self._allocations(ids, context, n)
        counts = np.array([len(g) for g in grows])
        short = counts > kv.available - (np.cumsum(counts) - counts)  # allocation would fail
        fits = int(np.argmax(short)) if short.any() else n
        n = min(int(np.searchsorted(times[:n], e.next_arrival_s)), fits)  # start before it
        for j in range(n):  # nothing else reads the blocks until the run's timeout ends
            for rid, target in grows[j]:
                kv.allocate(rid, target)
            log.resident.append(hbm.resident)
            log.cached.append(len(hbm.evictable))
            if kv.prefix:
                kv.register_full(ids, context + j + 1)
        if n == 0:
            return 0
        delay = _exact_delay(env.now, float(times[n]))
        if delay is None:  # no single delay lands exactly there: one timeout a step
            for d in compute[:n].tolist():
                yield env.timeout(d)
        else:
            yield env.timeout(delay)
        log.ends.extend(times[1 : n + 1].tolist())
        log.attention.extend(attention[:n].tolist())
        log.waiting.extend([log.waiting_before] * (n - 1) + [len(e.scheduler.waiting)])
        log.linear, log.overhead = linear, overhead
        log.steps += n
        return n

    def _allocations(
        self, ids: np.ndarray, context: np.ndarray, n: int
    ) -> list[list[tuple[int, int]]]:
        """Per step of the next ``n``: (request, tokens) of those that start a new block,
        in batch order (as the scheduler allocates)."""
        bt = self.engine.config.engine.block_tokens
        first = np.maximum(self.engine.kv.held[ids] * bt - context, 0)  # steps until one
        out: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for rid, j, ctx in zip(ids.tolist(), first.tolist(), context.tolist(), strict=True):
            for step in range(j, n, bt):
                out[step].append((rid, ctx + step + 1))
        return out

    def _apply(self, ids: np.ndarray, start: np.ndarray, log: _RunLog, finishes: bool) -> None:
        """The run's effect on the scheduler and counters, and its timeline rows; the last
        step goes through ``Scheduler.complete`` if it ``finishes`` requests."""
        e = self.engine
        s, kv, plan = e.scheduler, e.kv, e.plan
        steps, bt = log.steps, e.config.engine.block_tokens
        self.steps += steps
        s.computed[ids] += steps - finishes
        s.generated[ids] += steps - finishes
        running = np.full(steps, len(ids))
        if finishes:
            ones = np.ones(len(ids), dtype=np.int64)
            last = Batch(ids, ones, s.computed[ids], ones.astype(bool), ids[:0])
            s.complete(last, e.env.now)
            hbm = kv.tiers[HBM]
            log.resident[-1], log.cached[-1] = hbm.resident, len(hbm.evictable)
            running[-1] = len(s.running)
        contexts = start[None, :] + np.arange(steps)[:, None]
        reads = (-(-contexts // bt)).sum(axis=1)  # blocks each step reads, all in HBM
        c = kv.counters
        c.access_blocks += int(reads.sum())
        c.access_hbm_hits += int(reads.sum())
        e._link_deltas()  # the marks the next normal step's deltas start from
        n = len(ids)
        activations = e.cost.activation_bytes(n, n)
        hbm = kv.tiers[HBM]
        resident, cached = np.array(log.resident), np.array(log.cached)
        running_b = (resident - cached) * hbm.block_bytes
        cached_b = cached * hbm.block_bytes
        used = plan.weights + plan.runtime_reserve + activations + running_b + cached_b + 0.0
        times = np.array([log.began, *log.ends])
        linear = np.full(steps, log.linear)
        e.timeline.record_many(
            steps,
            time_s=times[:-1],
            step_s=times[1:] - times[:-1],
            batch_size=n,
            step_tokens=n,
            prefill_tokens=0,
            decode_tokens=n,
            sampled=n,
            linear_s=linear,
            attention_s=np.array(log.attention),
            overhead_s=log.overhead,
            stall_s=0.0,
            running=running,
            waiting=np.array(log.waiting),
            preempted=0,
            hbm_weights_bytes=plan.weights,
            hbm_reserve_bytes=plan.runtime_reserve,
            hbm_activation_bytes=activations,
            hbm_kv_running_bytes=running_b,
            hbm_kv_cached_bytes=cached_b,
            hbm_staging_bytes=0.0,
            hbm_kv_bytes=running_b + cached_b,
            hbm_kv_pool_bytes=hbm.capacity * hbm.block_bytes,
            hbm_free_bytes=plan.capacity - used,
            dram_kv_bytes=kv.tiers[DRAM].used_bytes,
            ssd_kv_bytes=kv.tiers[SSD].used_bytes,
            h2d_bytes=0.0,
            d2h_bytes=0.0,
            ssd_read_bytes=0.0,
            ssd_write_bytes=0.0,
            h2d_util=0.0,
            d2h_util=0.0,
            hbm_hit_blocks=0.0,
            dram_hit_blocks=0.0,
            ssd_hit_blocks=0.0,
            access_hbm_hits=reads.astype(np.float64),
        )


@dataclass
class _RunLog:
    """What a run's steps saw, for its timeline rows."""

    began: float
    arrived: int  # requests arrived when it began: one more ends the run
    waiting_before: int
    steps: int = 0
    ends: list[float] = field(default_factory=list)
    resident: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    attention: list[float] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    linear: float = 0.0
    overhead: float = 0.0


def _exact_delay(now: float, end: float) -> float | None:
    """A delay that SimPy adds to ``now`` to give exactly ``end`` (None if none is found)."""
    delay = end - now
    for candidate in (delay, np.nextafter(delay, np.inf), np.nextafter(delay, -np.inf)):
        if now + float(candidate) == end:
            return float(candidate)
    return None
