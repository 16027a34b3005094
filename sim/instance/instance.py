"""The engine: a SimPy process doing one event per step, fed by an arrival process; steps
that need no clock are taken in runs (sim/instance/runs.py), one event for many steps."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import simpy

from sim.memory.blocks import DRAM, HBM, SSD
from sim.config.run import RunConfig
from sim.cost.roofline import cost_model_for
from sim.instance.runs import DecodeRuns
from sim.observe.invariants import attach as attach_invariants
from sim.kv.manager import KvManager, StepIO
from sim.memory.links import Links
from sim.memory.hbm_plan import HbmPlan, plan_hbm
from sim.observe.metrics import Timeline, request_frame, summarize
from sim.instance.scheduler import Batch, Scheduler
from sim.workload import build_requests
from sim.workload.requests import Requests

ACCESS_STREAM = 0x6B76  # the access model's random stream, apart from the workload's


@dataclass(frozen=True)
class RunResult:
    """What a run returns; files are written by the caller (``sim.rundir``)."""

    config: RunConfig
    plan: HbmPlan
    requests: pd.DataFrame
    timeline: pd.DataFrame
    summary: dict
    kv_heat: pd.DataFrame | None = None  # per step, the blocks read (``engine.kv_heat``)


def layerwise_step_s(transfer_s: float, layer_compute_s: float, layers: int) -> float:
    """A step whose KV streams in layer by layer while earlier layers compute."""
    x = transfer_s / layers
    return x + (layers - 1) * max(x, layer_compute_s) + layer_compute_s


class Engine:
    """Iteration-level continuous batching over tiered KV memory (``kv.mode``)."""

    def __init__(self, config: RunConfig, requests: Requests):
        self.config = config
        self.requests = requests
        self.cost = cost_model_for(config)  # roofline or measured tables (validation helper)
        self.plan = plan_hbm(config, self.cost)
        self.env = simpy.Environment()
        self.links = Links.from_hardware(self.env, config.hardware)
        rng = np.random.default_rng([config.seed, ACCESS_STREAM])
        self.kv = KvManager(config, requests, self.env, self.links, self.plan.pool_blocks, rng)
        self.scheduler = Scheduler(config.engine, requests, self.kv)
        self.timeline = Timeline()
        self._wakeup = self.env.event()
        self._arrived = 0  # requests handed to the scheduler (by the arrival process or a run)
        self.delivery_s = delivery_times(requests.arrival_s)
        self._marks = [0.0] * 10
        self.stall_s = 0.0
        loaded = self.scheduler._loaded

        def on_loaded(rid: int) -> None:
            loaded(rid)
            self._wake()

        self.kv.on_loaded = on_loaded
        self.decode_runs = DecodeRuns(self)
        if config.engine.check:  # reliability hook: invariants after every step (sim/observe/invariants.py)
            attach_invariants(self)

    def run(self) -> RunResult:
        """Simulate until every request has finished or been rejected."""
        started = time.perf_counter()
        self.env.process(self._arrivals())
        self.env.run(self.env.process(self._steps()))
        end = self.env.now
        self.env.run()  # let asynchronous copies (write-through) drain
        s = self.scheduler
        requests = request_frame(
            self.requests, s.scheduled_s, s.first_token_s, s.finish_s, s.preemptions,
            s.reject_reason,
        )  # fmt: skip
        timeline = self.kv.prefetch.extend_timeline(self.timeline.to_frame())  # prefetch columns
        summary = summarize(requests, timeline, end)
        summary.update(self._tier_summary())
        summary.update(self.kv.prefetch.summary())  # empty for prefetch: none
        if self.requests.report is not None:
            summary["workload"] = self.requests.report.as_dict()
        summary["wall_time_s"] = time.perf_counter() - started
        kv_heat = self.kv.heat_log.frame() if self.kv.heat_log is not None else None
        return RunResult(self.config, self.plan, requests, timeline, summary, kv_heat)

    def _tier_summary(self) -> dict:
        c, links = self.kv.counters, self.links
        lookups = max(c.lookup_blocks, 1)
        return {
            "hbm_hit_rate": c.hits[HBM] / lookups,
            "dram_hit_rate": c.hits[DRAM] / lookups,
            "ssd_hit_rate": c.hits[SSD] / lookups,
            "prefix_lookup_blocks": c.lookup_blocks,
            "prefix_hit_tokens": c.prefix_hit_tokens,
            "recomputed_tokens": self.scheduler.recomputed_tokens,
            "hbm_access_hit_rate": c.access_hbm_hits / max(c.access_blocks, 1),
            "h2d_bytes": links.h2d.bytes_delivered,
            "d2h_bytes": links.d2h.bytes_delivered,
            "ssd_read_bytes": links.ssd_read.bytes_delivered,
            "ssd_write_bytes": links.ssd_write.bytes_delivered,
            "stall_s": self.stall_s,
            "swaps": c.swaps,
        }

    def _wake(self) -> None:
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    def _arrivals(self):
        """Hand requests to the scheduler at their arrival times (one event per instant),
        but those a run has handed over already."""
        arrival = self.requests.arrival_s
        times, starts = np.unique(arrival, return_index=True)
        bounds = [*starts.tolist(), len(arrival)]
        for i, at in enumerate(times.tolist()):
            yield self.env.timeout(at - self.env.now)
            first = max(bounds[i], self._arrived)
            for rid in range(first, bounds[i + 1]):
                self.scheduler.add(rid)
            self._arrived = max(self._arrived, bounds[i + 1])
            if first < bounds[i + 1]:
                self._wake()

    @property
    def next_arrival_s(self) -> float:
        """When SimPy delivers the next request not yet handed over (inf: none is left)."""
        i = self._arrived
        return float(self.delivery_s[i]) if i < len(self.delivery_s) else math.inf

    def deliver_before(self, t: float) -> int:
        """Hand the scheduler the requests SimPy delivers before ``t`` (for a run, which
        simulates ahead of the clock); how many."""
        first = self._arrived
        upto = max(int(np.searchsorted(self.delivery_s, t)), first)
        for rid in range(first, upto):
            self.scheduler.add(rid)
        self._arrived = upto
        return upto - first

    def _steps(self):
        """The engine loop: schedule, move what the step needs, compute, apply."""
        s = self.scheduler
        while True:
            if not s.has_work and self._arrived == len(self.requests):
                return
            if self.decode_runs.ready() and (yield from self.decode_runs.run()):
                continue
            batch = s.schedule(self.env.now) if s.has_work else None
            if batch is None or len(batch.ids) == 0:
                if batch is not None and len(batch.preempted):
                    continue
                if not s.loading and self._arrived == len(self.requests) and s.has_work:
                    raise RuntimeError("scheduler made no progress with work pending")
                yield self._wakeup
                self._wakeup = self.env.event()
                continue
            yield from self._step(batch)

    def _room_bytes(self, activations: float) -> float:
        """HBM left for KV (cache and staging) once weights, reserve and activations are in."""
        p = self.plan
        return p.usable - p.weights - p.runtime_reserve - activations

    def _step(self, batch: Batch):
        """One engine step: blocking copies, then compute overlapped with the step's fetch."""
        activations = self.cost.activation_bytes(batch.num_tokens, batch.num_sampled)
        io = self.kv.plan_step(
            batch.ids, batch.context, batch.new_tokens, self._room_bytes(activations)
        )
        self.kv.prefetch.on_step(self.scheduler, batch)  # prefetch hook: stage for next steps
        cost = self.cost.step(batch.new_tokens, io.attention_context, batch.num_sampled)
        params = self.cost.params
        compute = (
            cost.total_s
            + (io.decompress_bytes + io.fetch_bytes * (io.decompress_bytes > 0))
            / params.memory_bandwidth
        )
        start = self.env.now
        if io.blocking:
            yield simpy.AllOf(self.env, io.blocking)
        yield from self._compute_with_fetch(io, compute, params.step_overhead_s)
        step_s = self.env.now - start
        waited = bool(io.blocking) or io.fetch_bytes > 0
        self.stall_s += max(step_s - compute, 0.0) if waited else 0.0
        self.scheduler.complete(batch, self.env.now)
        self.kv.flush_copies()  # write-through of the blocks this step completed
        self._record(start, step_s, batch, cost, io, activations)

    def _compute_with_fetch(self, io: StepIO, compute: float, overhead: float):
        layers = self.config.model.layers
        h2d = self.links.h2d
        if io.fetch_bytes <= 0:
            yield self.env.timeout(compute)
            return
        per_layer = (compute - overhead) / layers
        if self.config.engine.layer_events:
            yield from self._layer_by_layer(io, per_layer, layers)
            yield self.env.timeout(overhead)
        elif self.config.kv.layerwise:
            t0 = self.env.now
            yield h2d.transfer(io.fetch_bytes, io.fetch_chunk, latencies=layers)
            fetched = self.env.now - t0
            total = layerwise_step_s(fetched, per_layer, layers) + overhead
            yield self.env.timeout(max(total - fetched, 0.0))
        else:
            yield h2d.transfer(io.fetch_bytes, io.fetch_chunk)
            yield self.env.timeout(compute)

    def _layer_by_layer(self, io: StepIO, per_layer: float, layers: int):
        """Per-layer events: layer i's KV copy, then its compute once the previous layer ended."""
        h2d = self.links.h2d
        arrived = [self.env.event() for _ in range(layers)]

        def copies():
            for event in arrived:
                yield h2d.transfer(io.fetch_bytes / layers, io.fetch_chunk)
                event.succeed()

        self.env.process(copies())
        for event in arrived:
            yield event
            yield self.env.timeout(per_layer)

    def link_deltas(self) -> tuple[float, ...]:
        links, c = self.links, self.kv.counters
        h2d, d2h = links.h2d, links.d2h
        hbm, dram, ssd = c.hits
        now = [
            h2d.bytes_delivered, d2h.bytes_delivered,
            links.ssd_read.bytes_delivered, links.ssd_write.bytes_delivered,
            h2d.busy_s, d2h.busy_s, float(hbm), float(dram), float(ssd), float(c.access_hbm_hits),
        ]  # fmt: skip
        m = self._marks
        self._marks = now
        return tuple([now[i] - m[i] for i in range(10)])

    def _record(
        self, start: float, step_s: float, batch: Batch, cost, io: StepIO, activations: float
    ) -> None:
        """One timeline row for a step (HBM as held during it, bytes moved during it)."""
        s = self.scheduler
        decode = (batch.new_tokens == 1) & (batch.context >= s.prompt[batch.ids])
        prefill = batch.num_tokens - int(np.count_nonzero(decode))  # decodes add one token
        self.timeline.record(
            time_s=start,
            step_s=step_s,
            batch_size=len(batch.ids),
            step_tokens=batch.num_tokens,
            prefill_tokens=prefill,
            decode_tokens=batch.num_tokens - prefill,
            sampled=batch.num_sampled,
            linear_s=cost.linear_s,
            attention_s=cost.attention_s,
            overhead_s=cost.overhead_s,
            stall_s=max(step_s - cost.total_s, 0.0) if io.blocking or io.fetch_bytes else 0.0,
            running=len(s.running),
            waiting=len(s.waiting),
            preempted=len(batch.preempted),
            **self.memory_columns(
                step_s, activations, *self.kv.hbm_kv_bytes(), io.staging_bytes, self.link_deltas()
            ),
        )

    def memory_columns(
        self,
        step_s: float | np.ndarray,
        activations: float | np.ndarray,
        kv_running: float | np.ndarray,
        kv_cached: float | np.ndarray,
        staging: float,
        moved: tuple,
    ) -> dict[str, float | np.ndarray]:
        """A step's HBM, tier and link columns of the timeline (or a run's steps', as arrays);
        ``moved``: what :meth:`link_deltas` gives."""
        plan, kv = self.plan, self.kv
        hbm = kv.tiers[HBM]
        h2d, d2h, ssd_r, ssd_w, h2d_busy, d2h_busy, *hits, access_hits = moved
        used = plan.weights + plan.runtime_reserve + activations + kv_running + kv_cached + staging
        duration = np.maximum(step_s, 1e-12)
        return {
            "hbm_weights_bytes": plan.weights,
            "hbm_reserve_bytes": plan.runtime_reserve,
            "hbm_activation_bytes": activations,
            "hbm_kv_running_bytes": kv_running,
            "hbm_kv_cached_bytes": kv_cached,
            "hbm_staging_bytes": staging,
            "hbm_kv_bytes": kv_running + kv_cached,
            "hbm_kv_pool_bytes": hbm.capacity * hbm.block_bytes,
            "hbm_free_bytes": plan.capacity - used,
            "dram_kv_bytes": kv.tiers[DRAM].used_bytes,
            "ssd_kv_bytes": kv.tiers[SSD].used_bytes,
            "h2d_bytes": h2d,
            "d2h_bytes": d2h,
            "ssd_read_bytes": ssd_r,
            "ssd_write_bytes": ssd_w,
            "h2d_util": np.minimum(h2d_busy / duration, 1.0),
            "d2h_util": np.minimum(d2h_busy / duration, 1.0),
            "hbm_hit_blocks": hits[HBM],
            "dram_hit_blocks": hits[DRAM],
            "ssd_hit_blocks": hits[SSD],
            "access_hbm_hits": access_hits,
        }


def delivery_times(arrival_s: np.ndarray) -> np.ndarray:
    """When SimPy delivers each request (arrivals sorted): the arrival process waits
    ``at - now`` after the previous instant, and the clock adds that delay, which does not
    always land exactly on ``at``."""
    times, counts = np.unique(arrival_s, return_counts=True)
    delivered, now = [], 0.0
    for at in times.tolist():
        now = now + (at - now)
        delivered.append(now)
    return np.repeat(np.array(delivered, dtype=np.float64), counts)


def simulate(
    config: RunConfig, requests: Requests | None = None, base_dir: Path = Path(".")
) -> RunResult:
    """Build the workload (unless given; trace paths resolve against ``base_dir``) and run."""
    if requests is None:
        requests = build_requests(
            config.workload, config.seed, base_dir, config.engine.block_tokens
        )
    return Engine(config, requests).run()
