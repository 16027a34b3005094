"""A cluster: instances on one host fabric, fed by one arrival feed. ``kvsim run`` builds a
cluster of one instance, which gives exactly the single-engine results."""

from __future__ import annotations

from sim.cluster.feed import ArrivalFeed
from sim.config.run import RunConfig
from sim.cost import cost_model_for
from sim.instance.instance import Instance
from sim.kv.pools import HostPool, host_pool
from sim.kv.prefix import hashed_block_counts, lost_block_cost
from sim.memory.fabric import Fabric
from sim.memory.hbm_plan import plan_hbm
from sim.workload.requests import Requests


class Cluster:
    """The fabric (clock, links, block table), the host's KV pool, the instances, the feed."""

    def __init__(self, config: RunConfig, requests: Requests):
        self.config, self.requests = config, requests
        cost = cost_model_for(config)  # start-up refusals first: a table, a model too large
        plan = plan_hbm(config, cost)
        self.fabric = Fabric(config.hardware)
        self.host: HostPool = host_pool(config, self.fabric.table, self._lost_cost())
        gpus = range(config.tensor_parallel_size)  # the first N GPUs of the node
        links = self.fabric.tp_links(gpus, plan.kv_share) if len(gpus) > 1 else None
        self.instance = Instance(
            config, requests, self.fabric, self.host, cost, plan, gpu=0, links=links
        )
        self.instances = [self.instance]
        self.feed = ArrivalFeed(self.fabric.env, requests.arrival_s, self.instance)
        self.instance.arrivals = self.feed

    def _lost_cost(self):
        """What losing a block from the host's tiers costs (cost-aware eviction policies)."""
        counts = hashed_block_counts(self.requests, self.config.kv.prefix_caching)
        return lost_block_cost(self.fabric.table, counts, self.config.engine.block_tokens)

    def start(self):
        """Start the feed and the instances' step loops; the process that ends with them."""
        env = self.fabric.env
        env.process(self.feed.process())
        return env.process(self.instance.steps())

    def run(self) -> float:
        """Simulate until every request has finished or been rejected; the time it ended
        (asynchronous copies, such as write-through, drain after it)."""
        env = self.fabric.env
        env.run(self.start())
        end = env.now
        env.run()
        return end
