"""An instance: one model replica (one engine) doing one SimPy event per step; steps that
need no clock are taken in runs (:mod:`sim.instance.runs`), one event for many steps.

It gets the clock, its GPU's links and the host's KV pool from whoever builds the cluster
(:mod:`sim.cluster`), and requests from the cluster's arrival feed (:meth:`add`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import simpy

from sim.config.run import RunConfig
from sim.cost import CostModel
from sim.instance.events import Arrivals, StepObserver
from sim.instance.runs import DecodeRuns
from sim.instance.scheduler import Batch, Scheduler, prefill_tokens
from sim.instance.step import compute_s, compute_with_fetch
from sim.instance.timeline import (
    TIMELINE_COLUMNS,
    TP_COLUMNS,
    LinkMarks,
    Timeline,
    memory_columns,
    step_row,
)
from sim.kv.clock import PlanClock
from sim.kv.manager import KvManager
from sim.kv.pools import HostPool
from sim.kv.remote import RemoteKv
from sim.memory.fabric import Fabric
from sim.memory.hbm_plan import HbmPlan
from sim.memory.links import Links

if TYPE_CHECKING:
    from sim.memory.tplinks import TpLinks
from sim.workload.requests import Requests

ACCESS_STREAM = 0x6B76  # the access model's random stream, apart from the workload's


class Instance:
    """Iteration-level continuous batching over tiered KV memory (``kv.mode``)."""

    def __init__(
        self, config: RunConfig, requests: Requests, fabric: Fabric, host: HostPool,
        cost: CostModel, plan: HbmPlan, gpu: int = 0, links: Links | TpLinks | None = None,
        remote: RemoteKv | None = None,
    ):  # fmt: skip
        self.config = config
        self.requests = requests
        self.cost, self.plan = cost, plan
        self.env = fabric.env
        # its GPUs' links: one GPU's, or (tensor parallelism) a transfer split over several
        self.links = fabric.links_for(gpu) if links is None else links
        self.clock = PlanClock(self.env)
        rng = np.random.default_rng([config.seed, ACCESS_STREAM])
        self.kv = KvManager(
            config, requests, self.clock, self.links, fabric.table, host,
            self.plan.pool_blocks, rng, remote,
        )  # fmt: skip
        self.scheduler = Scheduler(config.engine, requests, self.kv)
        self.timeline = Timeline(TIMELINE_COLUMNS + (TP_COLUMNS if plan.gpus > 1 else ()))
        self.marks = LinkMarks(self.links, self.kv.counters)
        self.observers: list[StepObserver] = []
        # told of each step's batch and compute seconds as its compute starts (layerwise
        # prefill/decode handoffs: sim/cluster/handoff.py)
        self.on_compute: Callable[[Batch, float], None] | None = None
        self.arrivals: Arrivals  # the cluster's feed (set before the run)
        self.stall_s = 0.0
        self._wakeup = self.env.event()
        loaded = self.scheduler.loaded

        def on_loaded(rid: int) -> None:
            loaded(rid)
            self.wake()

        self.kv.on_loaded = on_loaded
        self.decode_runs = DecodeRuns(self)

    def add(self, rid: int) -> None:
        """A request arrives here (the feed wakes the loop once per instant: :meth:`wake`)."""
        self.scheduler.add(rid)

    def wake(self) -> None:
        """Wake the step loop if it waits for work."""
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    def steps(self):
        """The step loop (a SimPy process): schedule, move what the step needs, compute, apply."""
        s = self.scheduler
        while True:
            if not s.has_work and self.arrivals.done:
                return
            if self.decode_runs.ready() and (yield from self.decode_runs.run()):
                continue
            batch = s.schedule(self.env.now) if s.has_work else None
            if batch is None or len(batch.ids) == 0:
                if batch is not None and len(batch.preempted):
                    continue
                if not s.loading and self.arrivals.done and s.has_work:
                    raise RuntimeError("scheduler made no progress with work pending")
                yield self._wakeup
                self._wakeup = self.env.event()
                continue
            yield from self._step(batch)

    def room_bytes(self, activations: float) -> float:
        """HBM left for KV (cache and staging) once weights, reserve and activations are in,
        in whole-KV bytes (one GPU's room over its ``kv_share``: the same at one GPU)."""
        p = self.plan
        room = p.room(activations)
        return room if p.gpus == 1 else room / p.kv_share

    def _step(self, batch: Batch):
        """One engine step: blocking copies, then compute overlapped with the step's fetch."""
        activations = self.cost.activation_bytes(batch.num_tokens, batch.num_sampled)
        io = self.kv.plan_step(
            batch.ids, batch.context, batch.new_tokens, self.room_bytes(activations)
        )
        self.kv.prefetch.on_step(self.scheduler, batch)  # prefetch hook: stage for next steps
        cost = self.cost.step(batch.new_tokens, io.attention_context, batch.num_sampled)
        params = self.cost.params
        compute = compute_s(cost, io, params)
        start = self.env.now
        if io.blocking:
            yield simpy.AllOf(self.env, io.blocking)
        if self.on_compute is not None:
            self.on_compute(batch, compute)
        engine = self.config.engine
        yield from compute_with_fetch(
            self.env, self.links.h2d, io, compute, cost.idle_host_s,
            self.config.model.layers, self.config.kv.layerwise, engine.layer_events,
        )  # fmt: skip
        step_s = self.env.now - start
        waited = bool(io.blocking) or io.fetch_bytes > 0
        self.stall_s += max(step_s - compute, 0.0) if waited else 0.0
        self.scheduler.complete(batch, self.env.now)
        self.kv.flush_copies()  # write-through of the blocks this step completed
        s = self.scheduler
        row = step_row(
            time_s=start, step_s=step_s, batch_size=len(batch.ids),
            step_tokens=batch.num_tokens,
            prefill_tokens=prefill_tokens(batch, s.prompt), sampled=batch.num_sampled,
            linear_s=cost.linear_s, attention_s=cost.attention_s, overhead_s=cost.overhead_s,
            comm_s=cost.comm_s,
            stall_s=max(step_s - cost.total_s, 0.0) if io.blocking or io.fetch_bytes else 0.0,
            running=len(s.running), waiting=len(s.waiting), preempted=len(batch.preempted),
            **self.memory_columns(
                step_s, activations, *self.kv.hbm_kv_bytes(), io.staging_bytes,
                self.marks.deltas(),
            ),
        )  # fmt: skip
        self.timeline.record(**row)
        for observer in self.observers:
            observer.step_ended(row)

    def memory_columns(
        self, step_s: float | np.ndarray, activations: float | np.ndarray,
        kv_running: float | np.ndarray, kv_cached: float | np.ndarray, staging: float,
        moved: tuple,
    ) -> dict[str, float | np.ndarray]:  # fmt: skip
        """:func:`sim.instance.timeline.memory_columns` for this instance's plan and tiers."""
        return memory_columns(
            self.plan, self.kv.tiers, step_s, activations, kv_running, kv_cached, staging, moved
        )
