"""The eight routers: two blind, two load-based, three cache-aware, and Mooncake's conductor.

- ``round_robin``, ``random``: ignore the snapshots.
- ``least_loaded``: the fewest outstanding tokens.
- ``session``: a conversation stays on the instance its first request went to.
- ``prefix_aware``: SGLang router's ``cache_aware`` policy.
- ``kv_aware``: NVIDIA Dynamo's KV router cost, with per-tier overlap credits.
- ``weighted``: llm-d inference scheduler's scorers and max-score picker.
- ``ttft_estimate``: Mooncake's conductor (:mod:`policies.routing.conductor`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from policies.base import fraction, non_negative, param_table, positive
from policies.routing.base import (
    TIERS,
    InstanceSnapshot,
    Router,
    RouteRequest,
    choice,
    credits_param,
)
from policies.routing.conductor import TtftEstimate

POOL = TIERS.index("pool")  # the cluster's KV pool: no instance's own cache


def matched_blocks(request: RouteRequest, instance: InstanceSnapshot) -> int:
    """Leading blocks of ``request``'s prefix that ``instance`` holds in its own tiers (HBM,
    DRAM, SSD): a cluster-wide pool's blocks are every instance's alike, so they tell
    instances apart no more than a miss does (counted, they made every instance match and
    sent ties to the lowest index)."""
    tiers = instance.prefix_tiers(request.block_hashes)
    return int(np.count_nonzero(tiers < POOL))


class RoundRobin(Router):
    """Instances in turn: the i-th request (from 0) goes to position ``i mod n``."""

    name = "round_robin"

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        super().__init__(rng)
        self.calls = 0

    def route(self, request: RouteRequest, instances: Sequence[InstanceSnapshot]) -> int:
        """The next instance in turn."""
        position = self.calls % len(instances)
        self.calls += 1
        return instances[position].index


class RandomRouter(Router):
    """A uniformly random instance, drawn from ``rng``."""

    name = "random"

    def route(self, request: RouteRequest, instances: Sequence[InstanceSnapshot]) -> int:
        """A uniform draw."""
        return instances[int(self.rng.integers(len(instances)))].index


class LeastLoaded(Router):
    """The instance with the fewest outstanding tokens (prefill still to compute plus
    decode still to produce); ties go to the lowest index."""

    name = "least_loaded"

    def route(self, request: RouteRequest, instances: Sequence[InstanceSnapshot]) -> int:
        """The argmin of ``outstanding_tokens``."""
        return instances[int(np.argmin([s.outstanding_tokens for s in instances]))].index


class SessionAffinity(Router):
    """A session's requests all go to the instance its first request went to.

    The first request of a session, and every request without one (``session`` -1), goes
    where ``new`` says (``least_loaded`` or ``round_robin``). A session whose instance is
    not among ``instances`` any more is placed again. The table holds one int per session.
    """

    name = "session"
    params = param_table(new=choice("least_loaded", ("least_loaded", "round_robin")))

    def __init__(self, new: str = "least_loaded", rng: np.random.Generator | None = None):
        super().__init__(rng)
        self.place: Router = LeastLoaded(self.rng) if new == "least_loaded" else RoundRobin()
        self.home: dict[int, int] = {}

    def route(self, request: RouteRequest, instances: Sequence[InstanceSnapshot]) -> int:
        """The session's instance, else a new placement (remembered for the session)."""
        home = self.home.get(request.session)
        if home is not None and any(s.index == home for s in instances):
            return home
        chosen = self.place.route(request, instances)
        if request.session >= 0:
            self.home[request.session] = chosen
        return chosen


class PrefixAware(Router):
    """SGLang router's ``cache_aware`` policy (sgl-router, ``policies/cache_aware.rs``).

    Load is an instance's waiting plus running requests. If the cluster is imbalanced,
    ``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold * min``, the
    least loaded instance. Else the instance with the longest prefix match, if its match
    rate (matched tokens / prompt tokens) is above ``cache_threshold``; else the instance
    with the smallest cache (``cached_blocks``, SGLang's smallest tree). Defaults are
    sgl-router's: 0.3, 64, 1.5. SGLang matches its own approximate tree of the text it
    routed; here the match is the instance's real prefix cache, in its own tiers (HBM, DRAM,
    SSD; not the cluster's KV pool, which every instance reads alike).
    """

    name = "prefix_aware"
    params = param_table(
        cache_threshold=fraction(0.3, closed=True),
        balance_abs_threshold=non_negative(64),
        balance_rel_threshold=positive(1.5),
    )

    def __init__(
        self,
        cache_threshold: float = 0.3,
        balance_abs_threshold: float = 64,
        balance_rel_threshold: float = 1.5,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__(rng)
        self.cache_threshold = float(cache_threshold)
        self.abs_threshold = float(balance_abs_threshold)
        self.rel_threshold = float(balance_rel_threshold)

    def imbalanced(self, loads: np.ndarray) -> bool:
        """SGLang's test: both thresholds exceeded."""
        low, high = loads.min(), loads.max()
        return bool(high - low > self.abs_threshold and high > self.rel_threshold * low)

    def route(self, request: RouteRequest, instances: Sequence[InstanceSnapshot]) -> int:
        """Least loaded if imbalanced, else best match above the threshold, else smallest."""
        loads = np.array([s.requests for s in instances])
        if self.imbalanced(loads):
            return instances[int(np.argmin(loads))].index
        matched = [matched_blocks(request, s) * request.block_tokens for s in instances]
        rates = np.minimum(matched, request.prompt_tokens) / max(request.prompt_tokens, 1)
        best = int(np.argmax(rates))
        if rates[best] > self.cache_threshold:
            return instances[best].index
        return instances[int(np.argmin([s.cached_blocks for s in instances]))].index


DYNAMO_CREDITS: Mapping[str, float] = {"hbm": 1.0, "dram": 0.75, "ssd": 0.25, "pool": 0.5}


def softmax_pick(costs: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """Dynamo's ``softmax_sample``: argmin at temperature 0, else a draw with probability
    ``exp(-c' / temperature)``, ``c'`` the costs scaled to [0, 1] (all equal: uniform)."""
    if temperature == 0:
        return int(np.argmin(costs))
    low, high = costs.min(), costs.max()
    scaled = (costs - low) / (high - low) if high > low else np.zeros_like(costs)
    weights = np.exp(-scaled / temperature)
    return int(rng.choice(len(costs), p=weights / weights.sum()))


class KvAware(Router):
    """NVIDIA Dynamo's KV router (``kv_router``): the lowest cost

        prefill_load_scale * max(prefill_blocks + new_blocks - overlap, 0) + decode_blocks

    where ``new_blocks`` is the request's prompt in blocks and ``overlap`` sums, over the
    leading blocks the instance holds, the credit of the tier each is in (Dynamo's device
    overlap credit 1.0, ``host_cache_hit_weight`` 0.75 for DRAM, 0.25 for disk; the
    cluster pool's 0.5 is kvsim's). ``prefill_load_scale`` is older Dynamo's
    ``overlap_score_weight``. With ``temperature`` > 0 the choice is a softmax draw over
    the min-max scaled costs (:func:`softmax_pick`); at 0, the argmin (lowest index ties).
    """

    name = "kv_aware"
    params = param_table(
        prefill_load_scale=non_negative(1.0),
        credits=credits_param(DYNAMO_CREDITS),
        temperature=non_negative(0.0),
    )

    def __init__(
        self,
        prefill_load_scale: float = 1.0,
        credits: Mapping[str, float] | None = None,
        temperature: float = 0.0,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__(rng)
        merged = {**DYNAMO_CREDITS, **(credits or {})}
        self.credit = np.array([float(merged[tier]) for tier in TIERS])
        self.prefill_load_scale = float(prefill_load_scale)
        self.temperature = float(temperature)

    def costs(self, request: RouteRequest, instances: Sequence[InstanceSnapshot]) -> np.ndarray:
        """Each instance's cost, in blocks."""
        out = np.empty(len(instances))
        for i, s in enumerate(instances):
            overlap = float(self.credit[s.prefix_tiers(request.block_hashes)].sum())
            prefill = max(s.prefill_blocks + request.blocks - overlap, 0.0)
            out[i] = self.prefill_load_scale * prefill + s.decode_blocks
        return out

    def route(self, request: RouteRequest, instances: Sequence[InstanceSnapshot]) -> int:
        """The cheapest instance (or a softmax draw)."""
        costs = self.costs(request, instances)
        return instances[softmax_pick(costs, self.temperature, self.rng)].index


class Weighted(Router):
    """llm-d inference scheduler's weighted scorers and max-score picker.

    Scores, each in [0, 1]: ``prefix-cache-scorer``, the fraction of the request's prefix
    blocks the instance holds (leading blocks, in its own tiers: llm-d scores pod-local
    caches); ``queue-scorer``,
    ``(max - waiting) / (max - min)`` over the instances' waiting requests (1 when all are
    equal); ``kv-cache-utilization-scorer``, ``1 - kv_used / kv_capacity``. The instance
    with the highest weighted sum wins (lowest index ties; llm-d draws among ties).
    Default weights 3, 2, 2, as in llm-d's inference-scheduling profile.
    """

    name = "weighted"
    params = param_table(
        prefix_weight=non_negative(3.0), queue_weight=non_negative(2.0), kv_weight=non_negative(2.0)
    )

    def __init__(
        self,
        prefix_weight: float = 3.0,
        queue_weight: float = 2.0,
        kv_weight: float = 2.0,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__(rng)
        self.weights = (float(prefix_weight), float(queue_weight), float(kv_weight))

    def scores(self, request: RouteRequest, instances: Sequence[InstanceSnapshot]) -> np.ndarray:
        """Each instance's weighted score."""
        matched = np.array([matched_blocks(request, s) for s in instances], dtype=float)
        prefix = matched / max(len(request.block_hashes), 1)
        waiting = np.array([s.waiting for s in instances], dtype=float)
        span = waiting.max() - waiting.min()
        queue = (waiting.max() - waiting) / span if span > 0 else np.ones(len(instances))
        kv = np.array([1.0 - s.kv_used / s.kv_capacity for s in instances])
        w_prefix, w_queue, w_kv = self.weights
        return w_prefix * prefix + w_queue * queue + w_kv * kv

    def route(self, request: RouteRequest, instances: Sequence[InstanceSnapshot]) -> int:
        """The highest score."""
        return instances[int(np.argmax(self.scores(request, instances)))].index


ROUTERS: tuple[type[Router], ...] = (
    RoundRobin, RandomRouter, LeastLoaded, SessionAffinity, PrefixAware, KvAware, Weighted,
    TtftEstimate,
)  # fmt: skip
