"""The engine: a SimPy process doing one event per step, fed by an arrival process."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import simpy

from sim.config.run import RunConfig
from sim.costmodel import CostModel, CostParams, StepCost
from sim.memory import BlockPool, HbmPlan, plan_hbm
from sim.metrics import Timeline, request_frame, summarize
from sim.scheduler import Batch, Scheduler
from sim.workload import build_requests
from sim.workload.requests import Requests


@dataclass(frozen=True)
class RunResult:
    """What a run returns; files are written by the caller (``sim.rundir``)."""

    config: RunConfig
    plan: HbmPlan
    requests: pd.DataFrame
    timeline: pd.DataFrame
    summary: dict


class Engine:
    """Iteration-level continuous batching over an HBM-resident KV pool (``kv.mode: hbm``)."""

    def __init__(self, config: RunConfig, requests: Requests):
        self.config = config
        self.requests = requests
        self.cost = CostModel(
            config.model, CostParams.from_hardware(config.hardware), config.kv_dtype_bytes
        )
        self.plan = plan_hbm(config, self.cost)
        self.pool = BlockPool(self.plan.pool_blocks)
        self.scheduler = Scheduler(config.engine, requests, self.pool)
        self.timeline = Timeline()
        self.env = simpy.Environment()
        self._wakeup = self.env.event()
        self._arrived = 0

    def run(self) -> RunResult:
        """Simulate until every request has finished or been rejected."""
        started = time.perf_counter()
        self.env.process(self._arrivals())
        self.env.run(self.env.process(self._steps()))
        s = self.scheduler
        requests = request_frame(
            self.requests,
            s.scheduled_s,
            s.first_token_s,
            s.finish_s,
            s.preemptions,
            s.reject_reason,
        )
        timeline = self.timeline.to_frame()
        summary = summarize(requests, timeline, self.env.now)
        summary["wall_time_s"] = time.perf_counter() - started
        return RunResult(self.config, self.plan, requests, timeline, summary)

    def _arrivals(self):
        """Hand requests to the scheduler at their arrival times (one event per instant)."""
        arrival = self.requests.arrival_s
        times, starts = np.unique(arrival, return_index=True)
        bounds = [*starts.tolist(), len(arrival)]
        for i, at in enumerate(times.tolist()):
            yield self.env.timeout(at - self.env.now)
            for rid in range(bounds[i], bounds[i + 1]):
                self.scheduler.add(rid)
            self._arrived = bounds[i + 1]
            if not self._wakeup.triggered:
                self._wakeup.succeed()

    def _steps(self):
        """The engine loop: schedule, run the step for its cost-model time, apply it."""
        s = self.scheduler
        while True:
            if not s.has_work:
                if self._arrived == len(self.requests):
                    return
                yield self._wakeup
                self._wakeup = self.env.event()
                continue
            batch = s.schedule(self.env.now)
            if len(batch.ids) == 0:
                if len(batch.preempted) == 0:
                    raise RuntimeError("scheduler made no progress with work pending")
                continue
            cost = self.cost.step(batch.new_tokens, batch.context, batch.num_sampled)
            self._record(batch, cost)
            yield self.env.timeout(cost.total_s)
            s.complete(batch, self.env.now)

    def _record(self, batch: Batch, cost: StepCost) -> None:
        """One timeline row for the step about to run (HBM as held during it)."""
        plan, s = self.plan, self.scheduler
        activations = self.cost.activation_bytes(batch.num_tokens, batch.num_sampled)
        kv = self.pool.num_used * plan.block_bytes
        decode = (batch.new_tokens == 1) & (batch.context >= s.prompt[batch.ids])
        prefill = int(batch.new_tokens[~decode].sum())
        self.timeline.record(
            time_s=self.env.now,
            step_s=cost.total_s,
            batch_size=len(batch.ids),
            step_tokens=batch.num_tokens,
            prefill_tokens=prefill,
            decode_tokens=batch.num_tokens - prefill,
            sampled=batch.num_sampled,
            linear_s=cost.linear_s,
            attention_s=cost.attention_s,
            overhead_s=cost.overhead_s,
            running=len(s.running),
            waiting=len(s.waiting),
            preempted=len(batch.preempted),
            hbm_weights_bytes=plan.weights,
            hbm_reserve_bytes=plan.runtime_reserve,
            hbm_activation_bytes=activations,
            hbm_kv_bytes=kv,
            hbm_kv_pool_bytes=plan.kv_pool,
            hbm_free_bytes=plan.capacity - plan.weights - plan.runtime_reserve - activations - kv,
        )


def simulate(
    config: RunConfig, requests: Requests | None = None, base_dir: Path = Path(".")
) -> RunResult:
    """Build the workload (unless given; trace paths resolve against ``base_dir``) and run."""
    if requests is None:
        requests = build_requests(config.workload, config.seed, base_dir)
    return Engine(config, requests).run()
