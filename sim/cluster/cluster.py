"""A cluster: instances on one clock, each on its own host (links, DRAM/SSD, block table),
fed by one arrival feed through a router, sharing the cluster's KV pool if it has one.
``kvsim run`` without a ``cluster`` key builds a cluster of one instance fed directly, which
gives exactly the single-engine results."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import simpy

from policies.registry import make_eviction, make_router
from sim.cluster.disagg import DisaggDispatcher, PrefillArrivals
from sim.cluster.dispatch import Dispatcher
from sim.cluster.feed import ArrivalFeed, ClosedLoopFeed, Target
from sim.cluster.handoff import Handoffs
from sim.cluster.nic import NicColumns
from sim.config.cluster import ClusterConfig
from sim.config.run import Member, RunConfig
from sim.cost import cost_model_for
from sim.instance.instance import Instance
from sim.kv.pools import HostPool, host_pool
from sim.kv.prefix import hashed_block_counts, lost_block_cost
from sim.kv.remote import KvPoolStore, RemoteKv
from sim.memory.fabric import Fabric
from sim.memory.hbm_plan import plan_hbm
from sim.memory.links import Link
from sim.workload.requests import Requests

ROUTER_STREAM = 0x726F75  # the router's random stream, apart from the others


class Cluster:
    """The clock, the instances (``instances``; ``instance`` is the first), their hosts
    (``fabrics``), the feed, and with a ``cluster`` key the router's dispatcher and the pool."""

    def __init__(self, config: RunConfig, requests: Requests):
        self.config, self.requests = config, requests
        self.members: list[Member] = config.members()
        self.env = simpy.Environment()
        spec = config.cluster
        self.pool = _pool_store(self.env, spec, self.members[0].config) if spec else None
        self.fabrics: list[Fabric] = []
        self.hosts: list[HostPool] = []
        self.instances = [self._instance(m) for m in self.members]
        if len(self.instances) > 1:
            for instance in self.instances:
                instance.decode_runs.bound_to_arrivals()
        self.instance = self.instances[0]
        self.fabric = self.fabrics[0]
        self.dispatcher: Dispatcher | DisaggDispatcher | None = None
        self.handoffs: Handoffs | None = None
        self.nic_columns: list[NicColumns] = []
        target: Dispatcher | DisaggDispatcher | Instance = self.instance
        if spec is not None:
            self.nic_columns = [NicColumns(*f.nic) for f in self.fabrics if f.nic]
            for instance, columns in zip(self.instances, self.nic_columns, strict=True):
                instance.observers.append(columns)
            target = self.dispatcher = self._dispatcher(spec)
        self.feed = self._feed(target)
        for instance, member in zip(self.instances, self.members, strict=True):
            instance.arrivals = self.feed
            if self.handoffs is not None and member.role == "prefill":
                instance.arrivals = PrefillArrivals(self.feed, self.handoffs)
        if self.handoffs is not None:
            self.handoffs.feed_done = lambda: self.feed.done

    def _feed(self, target: Target) -> ArrivalFeed | ClosedLoopFeed:
        """The open-loop feed, or a closed-loop client (``workload.max_concurrency``) whose
        requests' arrival times become their send times (a copy: the caller's stay); each
        request crosses the front end (``engine.frontend_*``) to the scheduler."""
        slots, frontend = self.config.workload.max_concurrency, self._frontend_s()
        if slots is None:
            return ArrivalFeed(self.env, self.requests.arrival_s, target, frontend)
        self.requests = replace(self.requests, arrival_s=self.requests.arrival_s.copy())
        feed = ClosedLoopFeed(self.env, self.requests.arrival_s, target, slots, frontend)
        for instance in self.instances:
            instance.scheduler.freed = feed.freed
        return feed

    def _frontend_s(self) -> np.ndarray | None:
        """Each request's time in the front end: ``engine.frontend_latency`` plus
        ``frontend_token_latency`` a prompt token (None: none)."""
        engine = self.config.engine
        if engine.frontend_latency == 0 and engine.frontend_token_latency == 0:
            return None
        tokens = self.requests.prompt_tokens.astype(np.float64)
        return engine.frontend_latency + engine.frontend_token_latency * tokens

    def _dispatcher(self, spec: ClusterConfig) -> Dispatcher | DisaggDispatcher:
        """The router (one, or one per role with the handoffs between them)."""
        seed, routers = self.config.seed, spec.routers
        rng = np.random.default_rng([seed, ROUTER_STREAM])
        if spec.disaggregation is None:
            router = make_router(spec.router.spec, rng)  # type: ignore[union-attr]
            return Dispatcher(self.instances, router, self.requests, routers.decode.signal_interval)
        roles = [m.role for m in self.members]
        prefill = [i for i, role in enumerate(roles) if role == "prefill"]
        nics = [f.nic for f in self.fabrics if f.nic]
        self.handoffs = Handoffs(
            self.instances, nics, spec.disaggregation.transfer, len(self.requests), prefill
        )
        decode = make_router(routers.decode.spec, rng)
        first = make_router(routers.prefill.spec, np.random.default_rng([seed, ROUTER_STREAM, 1]))
        intervals = (routers.prefill.signal_interval, routers.decode.signal_interval)
        return DisaggDispatcher(
            self.instances, roles, (first, decode), intervals, self.requests,
            spec.disaggregation, self.handoffs,
        )  # fmt: skip

    def _instance(self, member: Member) -> Instance:
        """One member's host and instance (start-up refusals first: a table, a model too
        large). With a KV pool, what one instance evicts or registers another can see at
        once: none takes steps ahead of the clock (``engine.decode_runs`` off)."""
        config = member.config
        spec = self.config.cluster
        split = spec is not None and spec.disaggregation is not None
        if (self.pool is not None or split) and len(self.members) > 1:
            engine = config.engine.model_copy(update={"decode_runs": False})
            config = config.model_copy(update={"engine": engine})
        cost = cost_model_for(config)
        plan = plan_hbm(config, cost)
        fabric = Fabric(config.hardware, env=self.env)
        host = host_pool(config, fabric.table, self._lost_cost(config, fabric))
        remote = None
        if spec is not None:
            fabric.nic = _nic(self.env, spec, config, member.index)
            if self.pool is not None:
                remote = RemoteKv(self.env, self.pool, *fabric.nic, now=lambda: self.env.now)
        self.fabrics.append(fabric)
        self.hosts.append(host)
        gpus = range(config.tensor_parallel_size)  # the first N GPUs of its node
        links = fabric.tp_links(gpus, plan.kv_share) if len(gpus) > 1 else None
        return Instance(
            config, self.requests, fabric, host, cost, plan, gpu=0, links=links, remote=remote
        )

    def _lost_cost(self, config: RunConfig, fabric: Fabric):
        """What losing a block from the host's tiers costs (cost-aware eviction policies)."""
        counts = hashed_block_counts(self.requests, config.kv.prefix_caching)
        return lost_block_cost(fabric.table, counts, config.engine.block_tokens)

    def start(self) -> simpy.Event:
        """Start the feed and the instances' step loops; the event that fires when all end."""
        env = self.env
        feed = env.process(self.feed.process())
        if self.dispatcher is not None:  # idle instances learn that no request is left
            feed.callbacks.append(lambda _: [i.wake() for i in self.instances])
        loops = [env.process(instance.steps()) for instance in self.instances]
        return loops[0] if len(loops) == 1 else simpy.AllOf(env, loops)

    def run(self) -> float:
        """Simulate until every request has finished or been rejected; the time it ended
        (asynchronous copies, such as write-through, drain after it)."""
        env = self.env
        env.run(self.start())
        end = env.now
        env.run()
        return end


def _nic(
    env: simpy.Environment, spec: ClusterConfig, config: RunConfig, index: int
) -> tuple[Link, Link]:
    """Instance ``index``'s NIC, (in, out): ``cluster.network`` where the run gives it, else
    its hardware's per-GPU NIC times its GPUs (each GPU sends its own KV shard), else
    ``cluster.network``'s defaults."""
    nic = config.hardware.nic
    if "network" in spec.model_fields_set or nic is None:
        bandwidth, latency = spec.network.bandwidth, spec.network.latency
    else:
        bandwidth, latency = nic.bandwidth * config.tensor_parallel_size, nic.latency
    return (
        Link(env, f"nic_in{index}", bandwidth, latency),
        Link(env, f"nic_out{index}", bandwidth, latency),
    )


def _pool_store(
    env: simpy.Environment, spec: ClusterConfig, config: RunConfig
) -> KvPoolStore | None:
    """The cluster's KV pool (``cluster.kv_pool``), in blocks of the instances' format."""
    pool = spec.kv_pool
    if pool is None:
        return None
    block_bytes = config.tier_block_bytes("dram")
    capacity = int(pool.capacity // block_bytes)
    policy = make_eviction(
        pool.eviction,
        capacity=max(capacity, 1),
        rng=np.random.default_rng([config.seed, 3]),
        cost=lambda slot: float(config.engine.block_tokens),
    )
    return KvPoolStore(capacity, block_bytes, policy, Link(env, "kv_pool", pool.bandwidth))
