"""Routers: each rule against a hand-computed case, the registry by name and dotted path."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import (
    InstanceSnapshot,
    Param,
    Router,
    RouteRequest,
    check_spec,
    make_router,
    router_names,
)
from policies.base import param_table
from policies.registry import ROUTER
from policies.routing import lookup_from_mapping, ttft_estimate

BT = 16  # tokens per block
HASHES = np.arange(101, 111, dtype=np.uint64)  # a 10-block prefix: 101, 102, ...


def request(prompt_tokens: int = 5 * BT, session: int = -1) -> RouteRequest:
    """A request whose prefix is the first blocks of HASHES."""
    blocks = prompt_tokens // BT
    return RouteRequest(1, prompt_tokens, session, HASHES[:blocks], BT)


def holding(*tiers: int) -> dict:
    """Snapshot fields for an instance holding HASHES' first blocks in these tiers."""
    return {"prefix_tiers": lookup_from_mapping(dict(zip(HASHES.tolist(), tiers, strict=False)))}


def cluster(n: int = 4) -> list[InstanceSnapshot]:
    return [InstanceSnapshot(i) for i in range(n)]


# --- the snapshot's prefix lookup -------------------------------------------------------------


def test_lookup_stops_at_the_first_block_not_held():
    lookup = lookup_from_mapping({101: 0, 102: 2, 104: 1})
    assert lookup(HASHES).tolist() == [0, 2]
    assert lookup(HASHES[1:]).tolist() == [2]
    assert lookup(HASHES[2:]).tolist() == []
    assert InstanceSnapshot(0).prefix_tiers(HASHES).tolist() == []


# --- every router: a valid index, the snapshot's own ------------------------------------------


@pytest.mark.parametrize("name", sorted(ROUTER))
def test_every_router_returns_one_of_the_snapshot_indices(name):
    router = make_router(name, rng=np.random.default_rng(1))
    instances = [InstanceSnapshot(i, waiting=i % 3, kv_used=i) for i in (3, 5, 9)]
    for session in range(20):
        assert router.route(request(session=session), instances) in {3, 5, 9}


def test_every_default_parameter_passes_its_own_check():
    for name, cls in ROUTER.items():
        for key, param in cls.params.items():
            assert param.check(param.default), (name, key)


# --- round_robin, random, least_loaded --------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.integers(10, 1000))
def test_round_robin_over_four_instances_counts_differ_by_at_most_one(n):
    router, instances = make_router("round_robin"), cluster(4)
    counts = np.bincount([router.route(request(), instances) for _ in range(n)], minlength=4)
    assert counts.sum() == n
    assert counts.max() - counts.min() <= 1


def test_random_is_seeded_and_roughly_uniform():
    instances = cluster(4)

    def draws(seed: int, n: int) -> list[int]:
        router = make_router("random", rng=np.random.default_rng(seed))
        return [router.route(request(), instances) for _ in range(n)]

    assert draws(7, 200) == draws(7, 200)
    assert draws(7, 200) != draws(8, 200)
    counts = np.bincount(draws(3, 8000), minlength=4)
    # 2000 expected each; sd = sqrt(8000 * 1/4 * 3/4) ~ 39, so 200 is over 5 sd
    assert np.all(np.abs(counts - 2000) < 200), counts


def test_least_loaded_picks_fewest_outstanding_tokens_lowest_index_on_ties():
    router = make_router("least_loaded")
    loads = [500, 120, 120, 300]
    instances = [InstanceSnapshot(i, outstanding_tokens=t) for i, t in enumerate(loads)]
    assert router.route(request(), instances) == 1
    instances[1] = InstanceSnapshot(1, outstanding_tokens=121)
    assert router.route(request(), instances) == 2


# --- session ----------------------------------------------------------------------------------


def test_session_keeps_a_session_on_its_first_instance():
    router = make_router("session")  # new sessions: least outstanding tokens
    idle = [InstanceSnapshot(i, outstanding_tokens=t) for i, t in enumerate([30, 10, 20])]
    assert router.route(request(session=7), idle) == 1
    busy = [InstanceSnapshot(i, outstanding_tokens=t) for i, t in enumerate([0, 900, 0])]
    assert [router.route(request(session=7), busy) for _ in range(5)] == [1] * 5
    assert router.route(request(session=8), busy) == 0  # a new session is placed anew
    assert router.route(request(session=-1), idle) == 1  # no session: not remembered
    assert router.route(request(session=-1), busy) == 0


def test_session_round_robin_placement_and_a_removed_instance():
    router = make_router({"name": "session", "new": "round_robin"})
    instances = cluster(3)
    assert [router.route(request(session=s), instances) for s in (1, 2, 3, 1, 2)] == [
        0, 1, 2, 0, 1,
    ]  # fmt: skip
    # instance 1 left: session 2 is placed again, the 4th placement: position 3 mod 2
    assert router.route(request(session=2), [instances[0], instances[2]]) == 2
    assert router.route(request(session=2), instances) == 2  # and stays there
    with pytest.raises(ValueError, match=r"'new' = 'lru' is invalid; expected one of"):
        make_router({"name": "session", "new": "lru"})


# --- prefix_aware (SGLang cache_aware) --------------------------------------------------------


@pytest.mark.parametrize(
    ("loads", "imbalanced"),
    [
        ((100, 2, 50), True),  # 98 > 64 and 100 > 1.5 * 2
        ((100, 30, 60), True),  # 70 > 64 and 100 > 45
        ((200, 140, 150), False),  # 60 <= 64
        ((1000, 900, 950), False),  # 100 > 64 but 1000 <= 1350
    ],
)
def test_prefix_aware_imbalance_goes_to_the_least_loaded(loads, imbalanced):
    router = make_router("prefix_aware")
    # instance 0 holds the whole prompt; instance 1 the least loaded
    instances = [
        InstanceSnapshot(0, running=loads[0], **holding(0, 0, 0, 0, 0)),
        InstanceSnapshot(1, running=loads[1], cached_blocks=900),
        InstanceSnapshot(2, waiting=loads[2], cached_blocks=900),
    ]
    assert router.route(request(), instances) == (1 if imbalanced else 0)


def test_prefix_aware_balanced_goes_to_the_best_match_above_the_threshold():
    router = make_router("prefix_aware")  # cache_threshold 0.3
    instances = [
        InstanceSnapshot(0, running=10, cached_blocks=10, **holding(0)),  # 16/80 = 0.2
        InstanceSnapshot(1, running=12, cached_blocks=500, **holding(1, 1, 2)),  # 48/80 = 0.6
        InstanceSnapshot(2, running=11, cached_blocks=300, **holding(0, 0)),  # 32/80 = 0.4
    ]
    assert router.route(request(), instances) == 1


def test_prefix_aware_low_match_goes_to_the_smallest_cache():
    instances = [
        InstanceSnapshot(0, running=10, cached_blocks=500, **holding(0)),  # 0.2
        InstanceSnapshot(1, running=12, cached_blocks=200),
        InstanceSnapshot(2, running=11, cached_blocks=300),
    ]
    assert make_router("prefix_aware").route(request(), instances) == 1
    # match 0.2 > 0.1: the match wins again
    assert (
        make_router({"name": "prefix_aware", "cache_threshold": 0.1}).route(request(), instances)
        == 0
    )


# --- kv_aware (Dynamo) ------------------------------------------------------------------------


def kv_cluster() -> list[InstanceSnapshot]:
    return [
        InstanceSnapshot(0, prefill_blocks=4, decode_blocks=10, **holding(0, 0)),
        InstanceSnapshot(1, prefill_blocks=2, decode_blocks=12, **holding(0, 1, 1, 2)),
        InstanceSnapshot(2, prefill_blocks=0, decode_blocks=15, **holding(3, 3, 3, 3, 3)),
    ]


def test_kv_aware_cost_by_hand_with_tier_credits():
    # 80 tokens = 5 new blocks. Overlaps: 2 x 1.0; 1.0 + 2 x 0.75 + 0.25; 5 x 0.5 (pool)
    router = make_router("kv_aware")
    expected = [(4 + 5 - 2.0) + 10, (2 + 5 - 2.75) + 12, (0 + 5 - 2.5) + 15]  # 17, 16.25, 17.5
    assert router.costs(request(), kv_cluster()).tolist() == pytest.approx(expected)
    assert router.route(request(), kv_cluster()) == 1
    # the pool credited fully: 0 + 5 - 5 = 0 prefill, cost 15
    full_pool = make_router({"name": "kv_aware", "credits": {"pool": 1.0}})
    assert full_pool.costs(request(), kv_cluster())[2] == pytest.approx(15.0)
    assert full_pool.route(request(), kv_cluster()) == 2
    # prefill weighs double: 24, 20.5, 20
    scaled = make_router({"name": "kv_aware", "prefill_load_scale": 2.0})
    assert scaled.costs(request(), kv_cluster()).tolist() == pytest.approx([24, 20.5, 20])
    assert scaled.route(request(), kv_cluster()) == 2


def test_kv_aware_prefill_term_is_clamped_at_zero():
    instances = [InstanceSnapshot(0, decode_blocks=3, **holding(0, 0, 0, 0, 0))]
    # 0 + 5 - 5 = 0; a credit cannot make the prefill term negative
    assert make_router("kv_aware").costs(request(), instances).tolist() == [3.0]
    long_match = [InstanceSnapshot(0, decode_blocks=3, **holding(*[0] * 10))]
    assert make_router("kv_aware").costs(request(3 * BT), long_match).tolist() == [3.0]


def test_kv_aware_temperature_zero_is_argmin_and_huge_is_near_uniform():
    cold = make_router("kv_aware", rng=np.random.default_rng(0))
    assert {cold.route(request(), kv_cluster()) for _ in range(50)} == {1}
    hot = make_router({"name": "kv_aware", "temperature": 1e9}, rng=np.random.default_rng(0))
    counts = np.bincount([hot.route(request(), kv_cluster()) for _ in range(6000)], minlength=3)
    assert np.all(np.abs(counts - 2000) < 200), counts  # sd ~ 37


def test_kv_aware_softmax_follows_the_scaled_costs():
    # costs 17, 16.25, 17.5 scale to 0.6, 0, 1; at temperature 1, p ~ exp(-scaled)
    weights = np.exp(-np.array([0.6, 0.0, 1.0]))
    expected = weights / weights.sum()
    spec = {"name": "kv_aware", "temperature": 1.0}
    picks = [make_router(spec, rng=np.random.default_rng(5)) for _ in range(2)]
    runs = [[p.route(request(), kv_cluster()) for _ in range(20_000)] for p in picks]
    assert runs[0] == runs[1]  # seeded
    share = np.bincount(runs[0], minlength=3) / 20_000
    assert share == pytest.approx(expected, abs=0.015)


def test_kv_aware_credits_are_checked():
    with pytest.raises(ValueError, match=r"'credits' = \{'nvme': 0.5\} is invalid"):
        make_router({"name": "kv_aware", "credits": {"nvme": 0.5}})
    with pytest.raises(ValueError, match=r"expected a mapping of hbm, dram, ssd, pool"):
        check_spec({"name": "kv_aware", "credits": {"dram": 1.5}}, Router)


# --- weighted (llm-d) -------------------------------------------------------------------------


def weighted_cluster() -> list[InstanceSnapshot]:
    return [
        InstanceSnapshot(0, waiting=6, kv_used=90, kv_capacity=100, **holding(0, 0, 1, 2)),
        InstanceSnapshot(1, waiting=0, kv_used=10, kv_capacity=100),
        InstanceSnapshot(2, waiting=3, kv_used=50, kv_capacity=100, **holding(0, 0)),
    ]


def test_weighted_scores_by_hand():
    # prefix 4/4, 0/4, 2/4; queue (6 - w) / 6: 0, 1, 0.5; kv 1 - used: 0.1, 0.9, 0.5
    router = make_router("weighted")  # weights 3, 2, 2
    expected = [3 * 1 + 2 * 0 + 2 * 0.1, 3 * 0 + 2 * 1 + 2 * 0.9, 3 * 0.5 + 2 * 0.5 + 2 * 0.5]
    assert router.scores(request(4 * BT), weighted_cluster()).tolist() == pytest.approx(expected)
    assert router.route(request(4 * BT), weighted_cluster()) == 1  # 3.2, 3.8, 3.5
    prefix_heavy = make_router({"name": "weighted", "prefix_weight": 10.0})
    assert prefix_heavy.route(request(4 * BT), weighted_cluster()) == 0  # 10.2, 3.8, 7.0


def test_weighted_equal_queues_score_one_and_ties_go_to_the_lowest_index():
    instances = [InstanceSnapshot(i, waiting=4, kv_used=20, kv_capacity=40) for i in range(3)]
    router = make_router({"name": "weighted", "prefix_weight": 0.0})
    assert router.scores(request(), instances).tolist() == pytest.approx([2 + 1.0] * 3)
    assert router.route(request(), instances) == 0


# --- the registry: user routers, errors -------------------------------------------------------


class LastInstance(Router):
    """A user's router: always the last instance (``offset`` from the end)."""

    name = "last_instance"
    params = param_table(offset=Param(0, "an int >= 0", lambda v: isinstance(v, int) and v >= 0))

    def __init__(self, offset: int = 0, rng: np.random.Generator | None = None) -> None:
        super().__init__(rng)
        self.offset = offset

    def route(self, request: RouteRequest, instances) -> int:
        return instances[-1 - self.offset].index


# --- ttft_estimate (Mooncake's conductor) -----------------------------------------------------


def test_ttft_estimate_by_hand():
    """Queue + uncached prefill + cached blocks' fetch, per instance; the lowest wins."""
    fetch = (0.0, 0.001, 0.01, 0.004)  # one block from hbm, dram, ssd, the pool
    per_token = 1e-4
    snaps = [
        # nothing cached, 1000 tokens queued: (1000 + 80) x 1e-4 = 0.108
        InstanceSnapshot(0, prefill_tokens=1000, prefill_s_per_token=per_token,
                         block_fetch_s=fetch),
        # 4 blocks in DRAM, 2000 queued: (2000 + 16) x 1e-4 + 4 x 0.001 = 0.2056
        InstanceSnapshot(1, prefill_tokens=2000, prefill_s_per_token=per_token,
                         block_fetch_s=fetch, **holding(1, 1, 1, 1)),
        # 5 blocks (2 HBM, 3 SSD), 900 queued: (900 + 0) x 1e-4 + 3 x 0.01 = 0.12
        InstanceSnapshot(2, prefill_tokens=900, prefill_s_per_token=per_token,
                         block_fetch_s=fetch, **holding(0, 0, 2, 2, 2)),
    ]  # fmt: skip
    req = request(5 * BT)
    expected = [0.108, 0.2056, 0.12]
    assert [ttft_estimate(req, s) for s in snaps] == pytest.approx(expected)
    router = make_router("ttft_estimate")
    assert router.route(req, snaps) == 0
    # with fewer queued tokens on 2 (0.12 -> 0.05) it wins; ties go to the lowest index
    snaps[2] = InstanceSnapshot(2, prefill_tokens=200, prefill_s_per_token=per_token,
                                block_fetch_s=fetch, **holding(0, 0, 2, 2, 2))  # fmt: skip
    assert router.route(req, snaps) == 2
    assert router.route(req, [snaps[0], snaps[0]]) == 0


class NotARouter:
    """Has a route method but is no Router."""

    def route(self, request, instances) -> int:
        return 0


def test_a_users_router_by_dotted_path():
    router = make_router({"name": f"{__name__}:LastInstance", "offset": 1})
    assert isinstance(router, LastInstance)
    assert router.route(request(), cluster(4)) == 2
    assert make_router(f"{__name__}:LastInstance").route(request(), cluster(4)) == 3
    with pytest.raises(ValueError, match=r"'offset' = -1 is invalid; expected an int >= 0"):
        make_router({"name": f"{__name__}:LastInstance", "offset": -1})


def test_a_class_that_is_not_a_router_is_refused_by_name():
    with pytest.raises(ValueError, match=r"NotARouter is not a subclass of Router"):
        make_router(f"{__name__}:NotARouter")
    with pytest.raises(ValueError, match=r"NotARouter is not a subclass of Router"):
        check_spec(f"{__name__}:NotARouter", Router)


def test_unknown_router_names_get_a_suggestion():
    with pytest.raises(ValueError, match="unknown router policy 'round_robbin'") as info:
        make_router("round_robbin")
    message = str(info.value)
    assert "did you mean 'round_robin'?" in message
    assert "kv_aware" in message and "package.module:Class" in message
    with pytest.raises(ValueError, match=r"unknown parameter 'cache_treshold' \(did you mean"):
        make_router({"name": "prefix_aware", "cache_treshold": 0.5})


def test_router_names_and_the_rng_is_used():
    assert router_names() == [
        "kv_aware", "least_loaded", "prefix_aware", "random", "round_robin", "session",
        "ttft_estimate", "weighted",
    ]  # fmt: skip
    rng = np.random.default_rng(11)
    assert make_router("random", rng=rng).rng is rng
    assert math.isclose(make_router("kv_aware").temperature, 0.0)


def test_pool_blocks_are_no_instances_own_match():
    """Blocks in the cluster's pool (tier 3) are every instance's alike: prefix_aware and
    weighted match an instance's own tiers only (else every instance matched a pooled
    prefix and the lowest index took them all)."""
    pooled = [
        InstanceSnapshot(i, running=10, cached_blocks=50, **holding(3, 3, 3, 3)) for i in (0, 1)
    ]
    own = InstanceSnapshot(2, running=10, cached_blocks=50, **holding(0, 0, 3, 3))  # 32/80 own
    assert make_router("prefix_aware").route(request(), [*pooled, own]) == 2
    scores = make_router("weighted").scores(request(), [*pooled, own])
    assert scores[2] - scores[0] == pytest.approx(3.0 * 2 / 5)  # prefix weight x 2 of 5 blocks
