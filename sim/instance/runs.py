"""Runs: consecutive engine steps simulated ahead of the SimPy clock, then waited at once.

In ``hbm`` mode with full access, no prefetch and nothing moving between tiers, every step
is a function of the scheduler's state and of the arrivals, whose delivery times are known
in advance. A run takes such steps one after another without the engine loop's per-step
event and bookkeeping, hands the scheduler the requests that arrive meanwhile itself, waits
one SimPy timeout for all of them and writes their timeline rows at once.

Without prefix caching a run is planned a step at a time by
:class:`sim.instance.step_planner.StepPlanner` (no block is cached then, so a step is a few integer
updates). With it, the run is planned here, in pieces:

- decodes: every running request adds one token a step, so the steps up to the next
  arrival or finish are priced as one array (:meth:`CostModel.decode_steps`), with the
  block allocations (which may evict cached blocks) and the registrations of newly full
  blocks made step by step in the order the scheduler would;
- any other step (admissions, prefill chunks): the scheduler's own
  :meth:`Scheduler.schedule` and :meth:`CostModel.step` (in ``hbm`` mode a cached prefix is
  in HBM: admitting reads no other tier).

While a run plans a step, the KV manager's clock (:attr:`KvManager.now`) reads that step's
time, as SimPy's would: blocks cached or evicted then are stamped as in the normal loop.

A run ends where the normal loop must decide with the clock: a step that would preempt,
an admission of a swapped-out request, an arrival delivered at exactly a step's end, or
nothing left running. Results are bit-identical to
``engine.decode_runs: false`` (tests/test_decode_runs.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from sim.instance import step_planner as steprun
from sim.memory.blocks import HBM
from sim.instance.scheduler import Batch

if TYPE_CHECKING:
    from sim.cost.roofline import StepCost
    from sim.instance.instance import Engine

FIRST_CHUNK = 16  # decode steps priced at once at first; doubles while the decodes go on
MAX_CHUNK = 1024
MAX_RUN_STEPS = 8192  # a run's rows wait in lists until it ends: keep that bounded
ADMIT, PREFILL, DECODE = "admit", "prefill", "decode"


class DecodeRuns:
    """Finds and simulates the engine's runs of steps that need no clock."""

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
        # without prefix caching, a step at a time in plain Python (sim/instance/step_planner.py)
        by_step = self.enabled and steprun.applies(engine)
        self.planner = steprun.StepPlanner(engine, MAX_RUN_STEPS) if by_step else None

    def ready(self) -> bool:
        """Whether a run can start now."""
        e = self.engine
        if not self.enabled or any(x.in_flight for x in e.links.all()):
            return False
        return self._next() is not None

    def _next(self) -> str | None:
        """What the next step of a run is (None: the normal loop takes it)."""
        s, kv = self.engine.scheduler, self.engine.kv
        if not len(s.running) or s.loading or kv.blocking:
            return None  # (in hbm mode no block copies are queued between steps)
        if s.waiting:
            if kv.swapped or self._preempts():
                return None
            return ADMIT
        if not self._decoding():
            return PREFILL
        return DECODE if len(s.running) <= s.engine.max_batched_tokens else None

    def _decoding(self) -> bool:
        """Whether every running request decodes (one token, past its first sample)."""
        s = self.engine.scheduler
        ids = s.running
        generated = s.generated[ids]
        return bool((s.prompt[ids] + generated - s.computed[ids] == 1).all() and generated.all())

    def _preempts(self) -> bool:
        """Whether the pool is too short for the running requests' next tokens."""
        s, kv = self.engine.scheduler, self.engine.kv
        need = s.running_tokens(s.engine.max_batched_tokens)[2]
        return int(need[need > 0].sum()) > kv.available

    def run(self):
        """Simulate a run (a SimPy generator); returns how many steps it took."""
        e = self.engine
        log = _RunLog(e.env.now)
        if self.planner is not None:
            self.planner.plan(log)
        else:
            self._plan_pieces(log)
        e.kv.planned_s = None
        if log.steps:
            yield from self._wait(log)
            self.steps += log.steps
            log.write(e)
        return log.steps

    def _plan_pieces(self, log: _RunLog) -> None:
        """Take the run's steps into ``log`` piece by piece until one needs the clock."""
        e = self.engine
        kv = e.kv
        while not log.last and log.steps < MAX_RUN_STEPS and (kind := self._next()) is not None:
            kv.planned_s = log.now
            if kind != ADMIT and kv.prefix:
                kv.hint_upcoming([])  # as the scheduler does each step: nobody waits
            if kind == DECODE:
                self._decodes(log)
            else:
                self._scheduled_step(kind, log)

    # --- one step at a time -----------------------------------------------------------------

    def _scheduled_step(self, kind: str, log: _RunLog) -> None:
        """An admission or prefill step, priced by :meth:`CostModel.step`."""
        e = self.engine
        s = e.scheduler
        hits = list(e.kv.counters.hits)
        batch = s.schedule(log.now) if kind == ADMIT else self._prefill_batch()
        if batch is None:  # the pool is short: the normal step preempts
            log.last = True
            return
        cost = e.cost.step(batch.new_tokens, batch.context, batch.num_sampled)
        end = log.now + cost.total_s  # as SimPy adds the step's timeout
        log.add_step(batch, cost, e, [b - a for a, b in zip(hits, e.kv.counters.hits, strict=True)])
        self._close_step(log, end, batch)

    def _prefill_batch(self) -> Batch | None:
        """The next step's batch by the scheduler's rule, its blocks allocated; None if the
        pool cannot give them."""
        s = self.engine.scheduler
        n, target, need = s.running_tokens(s.engine.max_batched_tokens)
        if not s.allocate_running(target, need):
            return None
        return s.batch(s.running, n, s.running[:0])

    def _steps_taken(self, counts: np.ndarray, times: np.ndarray, log: _RunLog) -> int:
        """How many of a piece's steps (``counts`` new blocks each, starting at ``times``) it
        takes: those that start before the next arrival while the pool has their blocks. The
        run ends after them if the next one would preempt (or an arrival is due right now)."""
        n = len(counts)
        short = counts > self.engine.kv.available - (counts.cumsum() - counts)  # would fail
        fits = int(short.argmax()) if short.any() else n
        taken = min(int(times[:n].searchsorted(self.engine.next_arrival_s)), fits)
        if (taken < n and taken == fits) or taken == 0:
            log.last = True
        return taken

    def _close_step(self, log: _RunLog, end: float, batch: Batch) -> None:
        """End a scheduled step at ``end``: deliver what arrives during it, then complete
        ``batch``."""
        e = self.engine
        log.deliver(e, [end])
        e.kv.planned_s = end
        e.scheduler.complete(batch, end)
        log.snapshot(e)

    # --- decodes ------------------------------------------------------------------------------

    def _decodes(self, log: _RunLog) -> None:
        """Decode steps up to the next finish, arrival or pool shortage."""
        s = self.engine.scheduler
        ids = s.running.copy()
        start = s.computed[ids]
        steps = int((s.output[ids] - s.generated[ids]).min())  # up to the next finish
        taken, chunk, delivered = 0, FIRST_CHUNK, log.delivered
        while taken < steps:
            n = min(chunk, steps - taken, MAX_CHUNK)
            ran = self._decode_chunk(ids, start + taken, n, log)
            taken += ran
            if ran < n or log.last or log.delivered != delivered:  # someone arrived
                break
            chunk *= 2
        if taken:
            self._advance(ids, taken, taken == steps, log)

    def _decode_chunk(self, ids: np.ndarray, context: np.ndarray, n: int, log: _RunLog) -> int:
        """Up to ``n`` decode steps from ``context``: fewer if a request arrives (the step it
        arrives in is the last) or the pool runs out of blocks (the run ends before)."""
        e = self.engine
        linear, attention, overhead = e.cost.decode_steps(context, n)
        compute = (linear + attention) + overhead  # as StepCost.total_s adds them
        times = np.add.accumulate(np.concatenate(([log.now], compute)))  # as SimPy adds
        at, owner = new_blocks(e.kv.held[ids], context, n, e.kv.bt)
        counts = np.bincount(at, minlength=n)
        taken = self._steps_taken(counts, times, log)
        if taken == 0:
            return 0
        self._allocate(ids, context, ids[owner], counts[:taken], times[:taken], log)
        log.add_decodes(context, linear, attention[:taken], overhead, e)
        log.compute += compute[:taken].tolist()
        log.deliver(e, times[1 : taken + 1].tolist())
        return taken

    def _allocate(
        self,
        ids: np.ndarray,
        context: np.ndarray,
        rids: np.ndarray,
        counts: np.ndarray,
        starts: np.ndarray,
        log: _RunLog,
    ) -> None:
        """Allocate the new blocks of the decode steps taken (``counts`` a step, for ``rids``
        in order) and register the blocks that fill, step by step as the scheduler would (a
        step's registrations can change what the next allocation evicts); note the HBM
        blocks after each step."""
        kv = self.engine.kv
        hbm = kv.tiers[HBM]
        log.running += [len(ids)] * len(counts)
        hashed = np.flatnonzero(kv.registered[ids] < kv.hashed_blocks[ids]) if kv.prefix else []
        bounds = [0, *np.cumsum(counts).tolist()]
        for j, (a, b) in enumerate(pairwise(bounds)):
            kv.planned_s = float(starts[j])  # evicting a cached block reads the clock
            for rid in rids[a:b].tolist():
                kv.allocate(rid, int(kv.held[rid]) * kv.bt + 1)  # its next block
            log.resident.append(hbm.resident)
            log.cached.append(len(hbm.evictable))
            if len(hashed):
                kv.register_full(ids[hashed], context[hashed] + j + 1)

    def _advance(self, ids: np.ndarray, steps: int, finishes: bool, log: _RunLog) -> None:
        """Apply ``steps`` decode steps of ``ids``; the last completes through the scheduler
        if it ``finishes`` requests."""
        e = self.engine
        s = e.scheduler
        s.computed[ids] += steps - finishes
        s.generated[ids] += steps - finishes
        if not finishes:
            return
        ones = np.ones(len(ids), dtype=np.int64)
        e.kv.planned_s = log.now
        s.complete(Batch(ids, ones, s.computed[ids], ones.astype(bool), ids[:0]), log.now)
        log.snapshot(e, replace=True)

    # --- the clock ------------------------------------------------------------------------------

    def _wait(self, log: _RunLog):
        """Wait until the run's end: its last step on its own timeout if an arrival ties with
        its end, as the normal loop would (the queue that step ends with is counted then)."""
        e = self.engine
        env, s = e.env, e.scheduler
        if log.tied:
            yield from self._wait_until(
                log.ends[-2] if log.steps > 1 else log.began, log.compute[:-1]
            )
            yield env.timeout(log.compute[-1])
            log.waiting[-1] = len(s.waiting)
        else:
            yield from self._wait_until(log.ends[-1], log.compute)

    def _wait_until(self, end: float, compute: list[float]):
        """One timeout to ``end`` if a delay lands exactly there, else one a step."""
        env = self.engine.env
        if not compute:
            return
        delay = _exact_delay(env.now, end)
        if delay is None:
            for d in compute:
                yield env.timeout(d)
        else:
            yield env.timeout(delay)


@dataclass
class _RunLog:
    """A run's steps as the columns of their timeline rows."""

    began: float
    last: bool = False  # the run ends after its latest step
    tied: bool = False  # an arrival is delivered exactly at its last step's end
    hits: list[list[int]] = field(default_factory=list)  # prefix hits (hbm, dram, ssd)
    delivered: int = 0  # requests handed to the scheduler
    compute: list[float] = field(default_factory=list)  # each step's timeout
    ends: list[float] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    prefill: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)
    linear: list[float] = field(default_factory=list)
    attention: list[float] = field(default_factory=list)
    overhead: list[float] = field(default_factory=list)
    activations: list[float] = field(default_factory=list)
    reads: list[int] = field(default_factory=list)  # blocks the step reads (all in HBM)
    waiting: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    resident: list[int] = field(default_factory=list)  # HBM blocks after the step
    cached: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.ends)

    @property
    def now(self) -> float:
        """When the next step starts."""
        return self.ends[-1] if self.ends else self.began

    def add_step(self, batch: Batch, cost: StepCost, e: Engine, hits: list[int]) -> None:
        """One step of ``batch`` priced at ``cost``, which found ``hits`` cached blocks."""
        s, bt = e.scheduler, e.config.engine.block_tokens
        decode = (batch.new_tokens == 1) & (batch.context >= s.prompt[batch.ids])
        self.compute.append(cost.total_s)
        self.batch.append(len(batch.ids))
        self.tokens.append(batch.num_tokens)
        self.prefill.append(batch.num_tokens - int(np.count_nonzero(decode)))
        self.sampled.append(batch.num_sampled)
        self.linear.append(cost.linear_s)
        self.attention.append(cost.attention_s)
        self.overhead.append(cost.overhead_s)
        self.activations.append(e.cost.activation_bytes(batch.num_tokens, batch.num_sampled))
        self.reads.append(int((-(-batch.context // bt)).sum()))
        self.hits.append(hits)

    def add_decodes(
        self, context: np.ndarray, linear: float, attention: np.ndarray, overhead: float, e: Engine
    ) -> None:
        """``len(attention)`` decode steps of a batch whose contexts start at ``context``."""
        k, n = len(attention), len(context)
        self._add_shapes(n, [n] * k, [0] * k, [n] * k, [e.cost.activation_bytes(n, n)] * k)
        self.linear += [linear] * k
        self.attention += attention.tolist()
        self.overhead += [overhead] * k
        self.reads += _reads(context, k, e).tolist()

    def _add_shapes(
        self,
        batch: int,
        tokens: list[int],
        prefill: list[int],
        sampled: list[int],
        activations: list[float],
    ) -> None:
        self.batch += [batch] * len(tokens)
        self.hits += [[0, 0, 0]] * len(tokens)
        self.tokens += tokens
        self.prefill += prefill
        self.sampled += sampled
        self.activations += activations

    def deliver(self, e: Engine, ends: list[float]) -> None:
        """Steps ending at ``ends`` were taken: hand over the requests delivered during the
        last of them, and note how many wait after each."""
        waiting = e.scheduler.waiting
        before = len(waiting)
        if ends[-1] > e.next_arrival_s:
            self.delivered += e.deliver_before(ends[-1])
        self.ends += ends
        self.waiting += [before] * (len(ends) - 1) + [len(waiting)]
        if e.next_arrival_s == ends[-1]:  # delivered exactly at the step's end
            self.last = self.tied = True  # SimPy's event order decides: the run's last step

    def snapshot(self, e: Engine, replace: bool = False) -> None:
        """The running count and HBM blocks after a step (``replace``: the last step's)."""
        hbm = e.kv.tiers[HBM]
        values = (len(e.scheduler.running), hbm.resident, len(hbm.evictable))
        for column, value in zip((self.running, self.resident, self.cached), values, strict=True):
            if replace:
                column[-1] = value
            else:
                column.append(value)

    def write(self, e: Engine) -> None:
        """Count the run's reads and append its timeline rows."""
        kv = e.kv
        kv.counters.access_blocks += sum(self.reads)
        kv.counters.access_hbm_hits += sum(self.reads)
        e.link_deltas()  # the marks the next normal step's deltas start from
        block_bytes = kv.tiers[HBM].block_bytes
        resident, cached = np.array(self.resident), np.array(self.cached)
        times = np.array([self.began, *self.ends])
        step_s = times[1:] - times[:-1]
        tokens, prefill = np.array(self.tokens), np.array(self.prefill)
        hits = np.array(self.hits, dtype=np.float64).reshape(-1, 3).T
        nothing_moved = (0.0,) * 6 + (*hits, np.array(self.reads, dtype=np.float64))
        e.timeline.record_many(
            self.steps,
            time_s=times[:-1],
            step_s=step_s,
            batch_size=np.array(self.batch),
            step_tokens=tokens,
            prefill_tokens=prefill,
            decode_tokens=tokens - prefill,
            sampled=np.array(self.sampled),
            linear_s=np.array(self.linear),
            attention_s=np.array(self.attention),
            overhead_s=np.array(self.overhead),
            stall_s=0.0,
            running=np.array(self.running),
            waiting=np.array(self.waiting),
            preempted=0,
            **e.memory_columns(
                step_s,
                np.array(self.activations),
                (resident - cached) * block_bytes,
                cached * block_bytes,
                0.0,
                nothing_moved,  # but prefix hits at admissions
            ),
        )


def new_blocks(
    held: np.ndarray, context: np.ndarray, n: int, bt: int
) -> tuple[np.ndarray, np.ndarray]:
    """The blocks that sequences holding ``held`` blocks for ``context`` tokens start in the
    next ``n`` decode steps, by step and then in batch order (as the scheduler allocates):
    each one's step, and its sequence's index."""
    first = np.maximum(held * bt - context, 0)  # steps until its next block
    if n <= bt:  # at most one each: a stable sort on the step keeps batch order
        owner = np.flatnonzero(first < n)
        at = first[owner]
        order = at.argsort(kind="stable")
        return at[order], owner[order]
    per = np.where(first < n, (n - 1 - first) // bt + 1, 0)
    owner = np.repeat(np.arange(len(held)), per)
    nth = np.arange(len(owner)) - np.repeat(np.cumsum(per) - per, per)  # its earlier ones
    step = first[owner] + bt * nth
    order = np.lexsort((owner, step))
    return step[order], owner[order]


def _reads(context: np.ndarray, steps: int, e: Engine) -> np.ndarray:
    """Blocks read in each of ``steps`` decode steps of sequences from ``context`` tokens."""
    bt = e.config.engine.block_tokens
    return (((context + (bt - 1))[None, :] + np.arange(steps)[:, None]) // bt).sum(axis=1)


def _exact_delay(now: float, end: float) -> float | None:
    """A delay that SimPy adds to ``now`` to give exactly ``end`` (None if none is found)."""
    delay = end - now
    for candidate in (delay, np.nextafter(delay, np.inf), np.nextafter(delay, -np.inf)):
        if now + float(candidate) == end:
            return float(candidate)
    return None
