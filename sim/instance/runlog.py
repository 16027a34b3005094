"""A run's steps, kept as the columns of their timeline rows until the run ends and writes
them at once (:meth:`RunLog.write`); both run planners fill one."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.cost.roofline import StepCost
from sim.instance.events import StepHost
from sim.instance.scheduler import Batch, prefill_tokens
from sim.instance.timeline import step_row
from sim.memory.blocks import HBM


@dataclass
class RunLog:
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

    def add_step(self, batch: Batch, cost: StepCost, e: StepHost, hits: list[int]) -> None:
        """One step of ``batch`` priced at ``cost``, which found ``hits`` cached blocks."""
        bt = e.config.engine.block_tokens
        self.compute.append(cost.total_s)
        self.batch.append(len(batch.ids))
        self.tokens.append(batch.num_tokens)
        self.prefill.append(prefill_tokens(batch, e.scheduler.prompt))
        self.sampled.append(batch.num_sampled)
        self.linear.append(cost.linear_s)
        self.attention.append(cost.attention_s)
        self.overhead.append(cost.overhead_s)
        self.activations.append(e.cost.activation_bytes(batch.num_tokens, batch.num_sampled))
        self.reads.append(int((-(-batch.context // bt)).sum()))
        self.hits.append(hits)

    def add_decodes(
        self,
        context: np.ndarray,
        linear: float,
        attention: np.ndarray,
        overhead: np.ndarray,
        e: StepHost,
    ) -> None:
        """``len(attention)`` decode steps of a batch whose contexts start at ``context``."""
        k, n = len(attention), len(context)
        self._add_shapes(n, [n] * k, [0] * k, [n] * k, [e.cost.activation_bytes(n, n)] * k)
        self.linear += [linear] * k
        self.attention += attention.tolist()
        self.overhead += overhead[:k].tolist()
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

    def deliver(self, e: StepHost, ends: list[float]) -> None:
        """Steps ending at ``ends`` were taken: hand over the requests delivered during the
        last of them, and note how many wait after each."""
        waiting = e.scheduler.waiting
        before = len(waiting)
        if ends[-1] > e.arrivals.next_arrival_s:
            self.delivered += e.arrivals.deliver_before(ends[-1])
        self.ends += ends
        self.waiting += [before] * (len(ends) - 1) + [len(waiting)]
        if e.arrivals.next_arrival_s == ends[-1]:  # delivered exactly at the step's end
            self.last = self.tied = True  # SimPy's event order decides: the run's last step

    def snapshot(self, e: StepHost, replace: bool = False) -> None:
        """The running count and HBM blocks after a step (``replace``: the last step's)."""
        hbm = e.kv.tiers[HBM]
        values = (len(e.scheduler.running), hbm.resident, len(hbm.evictable))
        for column, value in zip((self.running, self.resident, self.cached), values, strict=True):
            if replace:
                column[-1] = value
            else:
                column.append(value)

    def write(self, e: StepHost) -> dict[str, float | np.ndarray]:
        """Count the run's reads and append its timeline rows; the rows, as columns."""
        kv = e.kv
        kv.counters.access_blocks += sum(self.reads)
        kv.counters.access_hbm_hits += sum(self.reads)
        e.marks.deltas()  # the marks the next normal step's deltas start from
        block_bytes = kv.tiers[HBM].block_bytes
        resident, cached = np.array(self.resident), np.array(self.cached)
        times = np.array([self.began, *self.ends])
        step_s = times[1:] - times[:-1]
        tokens, prefill = np.array(self.tokens), np.array(self.prefill)
        hits = np.array(self.hits, dtype=np.float64).reshape(-1, 3).T
        nothing_moved = (0.0,) * 6 + (*hits, np.array(self.reads, dtype=np.float64))
        rows = step_row(
            time_s=times[:-1],
            step_s=step_s,
            batch_size=np.array(self.batch),
            step_tokens=tokens,
            prefill_tokens=prefill,
            sampled=np.array(self.sampled),
            linear_s=np.array(self.linear),
            attention_s=np.array(self.attention),
            overhead_s=np.array(self.overhead),
            comm_s=_comm(self.tokens, self.sampled, e),
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
        e.timeline.record_many(self.steps, **rows)
        return rows


def _comm(tokens: list[int], sampled: list[int], e: StepHost) -> float | np.ndarray:
    """Each step's collectives (0.0 on one GPU)."""
    if e.cost.comm is None:
        return 0.0
    return np.array([e.cost.comm_time(t, s) for t, s in zip(tokens, sampled, strict=True)])


def _reads(context: np.ndarray, steps: int, e: StepHost) -> np.ndarray:
    """Blocks read in each of ``steps`` decode steps of sequences from ``context`` tokens."""
    bt = e.config.engine.block_tokens
    return (((context + (bt - 1))[None, :] + np.arange(steps)[:, None]) // bt).sum(axis=1)
