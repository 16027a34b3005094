"""One simulation: build the workload and a cluster of one instance, attach the observers
the config asks for, run, and gather what a run directory holds (``sim.rundir`` writes it).

A run's tables are numpy columns; pandas is imported only when a caller asks for a table as
a DataFrame (``RunResult.requests``, ...), so ``kvsim run`` does without it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from sim.cluster.cluster import Cluster
from sim.config.run import RunConfig
from sim.instance.events import StepObserver
from sim.instance.instance import Instance
from sim.memory.hbm_plan import HbmPlan
from sim.observe.cluster import check_cluster, cluster_results
from sim.observe.heatlog import HeatLog
from sim.observe.invariants import Invariants
from sim.observe.metrics import Columns, goodput, request_columns, summarize, tier_summary
from sim.workload import build_requests
from sim.workload.requests import Requests

if TYPE_CHECKING:
    import pandas as pd

ObserverFactory = Callable[[Instance], StepObserver]  # builds an extra observer of the instance


@dataclass(frozen=True)
class RunResult:
    """What a run returns; files are written by the caller (``sim.rundir``).

    ``tables`` holds the run's tables as columns by name, in file order: ``requests``,
    ``timeline`` and, with ``engine.kv_heat``, ``kv_heat`` (the blocks read per step); the
    properties of the same names give them as DataFrames, built when first asked for."""

    config: RunConfig
    plan: HbmPlan
    summary: dict
    tables: dict[str, Columns] = field(repr=False)

    @cached_property
    def requests(self) -> pd.DataFrame:
        """One row per request (``requests.parquet``)."""
        return as_frame(self.tables["requests"])

    @cached_property
    def timeline(self) -> pd.DataFrame:
        """One row per engine step (``timeline.parquet``)."""
        return as_frame(self.tables["timeline"])

    @cached_property
    def kv_heat(self) -> pd.DataFrame | None:
        """Per recorded step, the blocks read (``kv_heat.parquet``), or None without
        ``engine.kv_heat``."""
        heat = self.tables.get("kv_heat")
        return None if heat is None else as_frame(heat)


def as_frame(columns: Columns) -> pd.DataFrame:
    """A table as a DataFrame (pandas imported here, when first needed)."""
    import pandas as pd

    return pd.DataFrame(columns)


def simulate(
    config: RunConfig,
    requests: Requests | None = None,
    base_dir: Path = Path("."),
    observers: Sequence[ObserverFactory] = (),
) -> RunResult:
    """Build the workload (unless given; trace paths resolve against ``base_dir``) and run;
    ``observers`` build extra observers of the instance's steps (a progress bar)."""
    if requests is None:
        requests = build_requests(
            config.workload, config.seed, base_dir, config.engine.block_tokens
        )
    return Simulation(config, requests, observers).run()


class Simulation:
    """A cluster (of one instance without a ``cluster`` key) with its observers: the heat log
    (``engine.kv_heat``, the first instance's) and the invariants (``engine.check``, every
    instance's), and any the caller's ``observers`` build, subscribed before the run. The
    first instance's parts are at hand (``kv``, ``scheduler``, ...) for scripts and tests
    that look inside a run."""

    def __init__(
        self, config: RunConfig, requests: Requests, observers: Sequence[ObserverFactory] = ()
    ):
        self.cluster = cluster = Cluster(config, requests)
        self.config, self.instance = config, cluster.instance
        self.env, self.fabric = cluster.env, cluster.fabric
        instance = cluster.instance
        self.kv, self.scheduler, self.timeline = instance.kv, instance.scheduler, instance.timeline
        self.cost, self.plan, self.links = instance.cost, instance.plan, instance.links
        self.decode_runs = instance.decode_runs
        engine = config.engine
        self.heat_log = HeatLog(engine.kv_heat_interval_s) if engine.kv_heat else None
        instance.kv.reads_observer = self.heat_log
        self.checks: list[Invariants] = []
        routed = cluster.dispatcher.instance_of if cluster.dispatcher is not None else None
        for i, (member, fabric) in enumerate(zip(cluster.instances, cluster.fabrics, strict=True)):
            if engine.check:
                checks = Invariants(member, fabric, routed)
                checks.index = i
                if cluster.handoffs is not None:
                    checks.prefill_of = cluster.handoffs.prefill_of
                self.checks.append(checks)
                member.observers.append(checks)
            member.observers.extend(build(member) for build in observers)

    def run(self) -> RunResult:
        """Simulate until every request has finished or been rejected."""
        started = time.perf_counter()
        cluster = self.cluster
        end = cluster.run()
        if cluster.dispatcher is None:
            requests, timeline, summary = _one_instance(cluster.instance, cluster.requests, end)
        else:
            requests, timeline, summary = cluster_results(cluster, end)
        slo = cluster.config.metrics.slo
        if slo is not None:
            summary.update(goodput(requests, summary["sim_time_s"], slo.ttft, slo.tpot))
        if cluster.requests.report is not None:
            summary["workload"] = cluster.requests.report.as_dict()
        summary["wall_time_s"] = time.perf_counter() - started
        tables = {"requests": requests, "timeline": timeline}
        if self.heat_log is not None:
            tables["kv_heat"] = self.heat_log.columns()
        for checks in self.checks:
            checks.run_ended(requests)
        if self.checks and cluster.dispatcher is not None:
            check_cluster(cluster)
        return RunResult(cluster.config, self.plan, summary, tables)


def _one_instance(
    instance: Instance, requests: Requests, end: float
) -> tuple[Columns, Columns, dict]:
    """The requests, timeline and summary of a run of one instance (no ``cluster`` key)."""
    s, kv = instance.scheduler, instance.kv
    frame = request_columns(
        requests, s.scheduled_s, s.first_token_s, s.finish_s, s.preemptions, s.reject_reason
    )
    timeline = kv.prefetch.extend_timeline(instance.timeline.arrays())
    summary = summarize(frame, timeline, end)
    summary.update(tier_summary([instance]))
    summary.update(kv.prefetch.summary())  # empty for prefetch: none
    return frame, timeline, summary
