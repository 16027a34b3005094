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

from itertools import pairwise

import numpy as np

from sim.instance import step_planner as steprun
from sim.instance.events import StepHost
from sim.instance.runlog import RunLog
from sim.instance.scheduler import Batch
from sim.memory.blocks import HBM

FIRST_CHUNK = 16  # decode steps priced at once at first; doubles while the decodes go on
MAX_CHUNK = 1024
MAX_RUN_STEPS = 8192  # a run's rows wait in lists until it ends: keep that bounded
ADMIT, PREFILL, DECODE = "admit", "prefill", "decode"


class DecodeRuns:
    """Finds and simulates the engine's runs of steps that need no clock."""

    def __init__(self, engine: StepHost):
        self.engine = engine
        self.steps = 0  # engine steps taken in runs so far
        config, kv = engine.config, engine.kv
        self.enabled = (
            config.engine.decode_runs
            and kv.mode.runs_ahead
            and not kv.access.sparse
            and not kv.prefetch.active
            and not config.engine.kv_heat
        )
        # without prefix caching, a step at a time in plain Python (sim/instance/step_planner.py)
        by_step = self.enabled and steprun.applies(engine)
        self.planner = steprun.StepPlanner(engine, MAX_RUN_STEPS) if by_step else None
        self.bounded = False  # in a cluster: only decode steps that end before any arrival

    def bound_to_arrivals(self) -> None:
        """Take only what no one can observe when a router looks at this instance at every
        arrival in the cluster: decode steps that end before the next arrival (no admission,
        no prefill, no step that an arrival falls in). The instance's state at each arrival
        is then the normal loop's."""
        self.bounded = True
        self.planner = None

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
            if kv.swapped or self.bounded or self._preempts():
                return None
            return ADMIT
        if not self._decoding():
            return None if self.bounded else PREFILL
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
        log = RunLog(e.env.now)
        if self.planner is not None:
            self.planner.plan(log)
        else:
            self._plan_pieces(log)
        e.clock.planned_s = None
        if log.steps:
            yield from self._wait(log)
            self.steps += log.steps
            rows = log.write(e)
            for observer in e.observers:
                observer.steps_ended(rows, log.steps)
        return log.steps

    def _plan_pieces(self, log: RunLog) -> None:
        """Take the run's steps into ``log`` piece by piece until one needs the clock."""
        e = self.engine
        kv = e.kv
        while not log.last and log.steps < MAX_RUN_STEPS and (kind := self._next()) is not None:
            e.clock.planned_s = log.now
            if kind != ADMIT and kv.prefix:
                kv.hint_upcoming([])  # as the scheduler does each step: nobody waits
            if kind == DECODE:
                self._decodes(log)
            else:
                self._scheduled_step(kind, log)

    # --- one step at a time -----------------------------------------------------------------

    def _scheduled_step(self, kind: str, log: RunLog) -> None:
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

    def _steps_taken(self, counts: np.ndarray, times: np.ndarray, log: RunLog) -> int:
        """How many of a piece's steps (``counts`` new blocks each, starting at ``times``) it
        takes: those that start before the next arrival while the pool has their blocks. The
        run ends after them if the next one would preempt (or an arrival is due right now)."""
        n = len(counts)
        short = counts > self.engine.kv.available - (counts.cumsum() - counts)  # would fail
        fits = int(short.argmax()) if short.any() else n
        arrival = self.engine.arrivals.next_arrival_s
        if self.bounded:  # steps that end before it (an end at the arrival ties: not taken)
            taken = min(int(times[1 : n + 1].searchsorted(arrival)), fits)
        else:
            taken = min(int(times[:n].searchsorted(arrival)), fits)
        if (taken < n and taken == fits) or taken == 0:
            log.last = True
        return taken

    def _close_step(self, log: RunLog, end: float, batch: Batch) -> None:
        """End a scheduled step at ``end``: deliver what arrives during it, then complete
        ``batch``."""
        e = self.engine
        log.deliver(e, [end])
        e.clock.planned_s = end
        e.scheduler.complete(batch, end)
        log.snapshot(e)

    # --- decodes ------------------------------------------------------------------------------

    def _decodes(self, log: RunLog) -> None:
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

    def _decode_chunk(self, ids: np.ndarray, context: np.ndarray, n: int, log: RunLog) -> int:
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
        log: RunLog,
    ) -> None:
        """Allocate the new blocks of the decode steps taken (``counts`` a step, for ``rids``
        in order) and register the blocks that fill, step by step as the scheduler would (a
        step's registrations can change what the next allocation evicts); note the HBM
        blocks after each step."""
        kv = self.engine.kv
        hbm = kv.tiers[HBM]
        log.running += [len(ids)] * len(counts)
        index = kv.index
        hashed = (
            np.flatnonzero(index.registered[ids] < index.hashed_blocks[ids]) if kv.prefix else []
        )
        bounds = [0, *np.cumsum(counts).tolist()]
        for j, (a, b) in enumerate(pairwise(bounds)):
            self.engine.clock.planned_s = float(
                starts[j]
            )  # evicting a cached block reads the clock
            for rid in rids[a:b].tolist():
                kv.allocate(rid, int(kv.held[rid]) * kv.bt + 1)  # its next block
            log.resident.append(hbm.resident)
            log.cached.append(len(hbm.evictable))
            if len(hashed):
                kv.register_full(ids[hashed], context[hashed] + j + 1)

    def _advance(self, ids: np.ndarray, steps: int, finishes: bool, log: RunLog) -> None:
        """Apply ``steps`` decode steps of ``ids``; the last completes through the scheduler
        if it ``finishes`` requests."""
        e = self.engine
        s = e.scheduler
        s.computed[ids] += steps - finishes
        s.generated[ids] += steps - finishes
        if not finishes:
            return
        ones = np.ones(len(ids), dtype=np.int64)
        e.clock.planned_s = log.now
        s.complete(Batch(ids, ones, s.computed[ids], ones.astype(bool), ids[:0]), log.now)
        log.snapshot(e, replace=True)

    # --- the clock ------------------------------------------------------------------------------

    def _wait(self, log: RunLog):
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


def _exact_delay(now: float, end: float) -> float | None:
    """A delay that SimPy adds to ``now`` to give exactly ``end`` (None if none is found)."""
    delay = end - now
    for candidate in (delay, np.nextafter(delay, np.inf), np.nextafter(delay, -np.inf)):
        if now + float(candidate) == end:
            return float(candidate)
    return None
