"""Clusters: one instance reproduces the plain run; routing spreads requests as each router
says; the KV pool serves blocks another instance wrote; the invariants hold across it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.config.loader import build_config
from sim.errors import ConfigError
from sim.run import simulate
from tests.cluster.chats import chat

ROUTERS = [
    "round_robin", "random", "least_loaded", "session", "prefix_aware", "kv_aware", "weighted",
]  # fmt: skip
CLUSTER_ONLY = {"instances", "nic_in_bytes", "nic_out_bytes", "wall_time_s"}
CLUSTER_COLUMNS = [
    "instance", "prefix_tier", "prefill_instance", "decode_instance", "kv_transfer_bytes",
    "kv_transfer_s", "kv_transfer_exposed_s",
]  # fmt: skip


def run(data: dict, *sets: str):
    return simulate(build_config(data, overrides=sets))


@pytest.mark.parametrize("mode", ["hbm", "offload"])
def test_a_cluster_of_one_is_the_plain_run(mode):
    plain = run(chat(kv={"mode": mode}))
    for router in ROUTERS:
        one = run(chat(kv={"mode": mode}, cluster={"instances": 1, "router": {"kind": router}}))
        requests = one.requests.drop(columns=CLUSTER_COLUMNS)
        pd.testing.assert_frame_equal(requests, plain.requests)
        assert (one.requests.instance == 0).all()
        assert (one.timeline[["nic_in_bytes", "nic_out_bytes"]] == 0).all().all()
        timeline = one.timeline.drop(columns=["instance", "nic_in_bytes", "nic_out_bytes"])
        pd.testing.assert_frame_equal(timeline, plain.timeline)
        mine = {k: v for k, v in one.summary.items() if k not in CLUSTER_ONLY}
        assert mine == {k: v for k, v in plain.summary.items() if k != "wall_time_s"}


def test_round_robin_spreads_requests_evenly():
    result = run(chat(cluster={"instances": 4, "router": {"kind": "round_robin"}}))
    counts = result.requests.instance.value_counts().reindex(range(4), fill_value=0)
    assert counts.max() - counts.min() <= 1
    assert [i["requests"] for i in result.summary["instances"]] == counts.tolist()
    assert sorted(result.timeline.instance.unique()) == [0, 1, 2, 3]


def test_session_affinity_keeps_a_conversation_on_one_instance():
    sim = simulation(chat(cluster={"instances": 3, "router": {"kind": "session"}}))
    result = sim.run()
    sessions = sim.cluster.requests.session
    per_session = pd.Series(result.requests.instance.to_numpy()).groupby(sessions)
    assert per_session.ngroups > 3 and (per_session.nunique() == 1).all()
    assert result.requests.instance.nunique() == 3


def pool(capacity: str = "200GiB", **more) -> dict:
    return {"kv_pool": {"capacity": capacity, "bandwidth": "200GB/s", **more}}


def test_the_pool_serves_blocks_another_instance_wrote():
    base = {"instances": 4, "router": {"kind": "round_robin"}}
    without = run(chat(cluster=base))
    with_pool = run(chat(cluster={**base, **pool()}, engine={"check": True}))
    s = with_pool.summary
    assert s["pool_hit_rate"] > 0
    assert (with_pool.requests.prefix_tier == "pool").any()
    assert s["ttft_p50_s"] < without.summary["ttft_p50_s"]
    assert s["kv_pool_blocks"] > 0
    # every byte in or out of the pool crossed some NIC
    assert s["kv_pool_bytes_moved"] == pytest.approx(s["nic_in_bytes"] + s["nic_out_bytes"])
    assert "pool_hit_rate" not in without.summary


def test_write_back_puts_only_what_instances_lose():
    base = {"instances": 2, "router": {"kind": "round_robin"}, **pool()}
    through = run(chat(cluster=base))
    back = run(chat(cluster=base, kv={"write_policy": "write_back"}, engine={"check": True}))
    # an H100 holds the whole chat: write-back has little to put, write-through puts it all
    assert back.summary["kv_pool_blocks_written"] < through.summary["kv_pool_blocks_written"]


def test_heterogeneous_groups_take_their_overrides():
    groups = [
        {"name": "h100", "count": 1},
        {"name": "a100", "count": 2, "hardware": "a100-80g-sxm", "engine": {"max_num_seqs": 4}},
    ]
    result = run(chat(cluster={"groups": groups, "router": {"kind": "least_loaded"}}))
    instances = result.summary["instances"]
    assert [i["group"] for i in instances] == ["h100", "a100", "a100"]
    assert [i["hardware"] for i in instances] == ["h100-sxm", "a100-80g-sxm", "a100-80g-sxm"]
    a100 = result.timeline[result.timeline.instance > 0]
    assert a100.running.max() <= 4
    assert result.timeline[result.timeline.instance == 0].running.max() > 4


def test_checks_hold_across_a_cluster_with_a_pool_in_every_mode():
    for mode in ("hbm", "offload", "dram_centric"):
        cluster = {"instances": 3, "router": {"kind": "kv_aware"}, **pool("2GiB")}
        result = run(chat(sessions=20, cluster=cluster, kv={"mode": mode}, engine={"check": True}))
        assert result.summary["requests_finished"] == len(result.requests)


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"instances": 2, "groups": [{"name": "a"}]}, "give instances or groups, not both"),
        ({"router": {"kind": "kv_awar"}}, "did you mean 'kv_aware'"),
        ({"router": {"kind": "kv_aware", "params": {"tempo": 1}}}, "unknown parameter 'tempo'"),
        ({**pool(ssd_capacity="1TiB")}, "ssd_capacity"),
        ({"groups": [{"name": "a", "engine": {"max_num_sex": 2}}]}, "did you mean 'max_num_seqs'"),
        ({"groups": [{"name": "a"}, {"name": "a"}]}, "group name 'a' given twice"),
        ({"instance": 2}, "did you mean 'instances'"),
    ],
)
def test_bad_cluster_configs_are_refused_with_the_key(cluster, message):
    with pytest.raises(ConfigError, match="cluster") as caught:
        build_config(chat(cluster=cluster))
    assert message in str(caught.value)


def test_a_pool_needs_prefix_caching_and_one_block_format():
    with pytest.raises(ConfigError, match="prefix_caching"):
        build_config(chat(cluster={"instances": 2, **pool()}, kv={"prefix_caching": False}))
    groups = [{"name": "a"}, {"name": "b", "kv": {"dtype": "fp8"}}]
    with pytest.raises(ConfigError, match="cannot share a pool"):
        build_config(chat(cluster={"groups": groups, **pool()}))


def test_instances_share_no_block_table():
    result = run(chat(cluster={"instances": 2, "router": {"kind": "round_robin"}}))
    hits = result.summary["instances"]
    # without a pool, each instance's hits are its own: the sum of their lookups is the total
    total = sum(i["prefix_lookup_blocks"] for i in hits)
    assert total == result.summary["prefix_lookup_blocks"]
    assert np.isclose(
        sum(i["prefix_hit_tokens"] for i in hits), result.summary["prefix_hit_tokens"]
    )


def simulation(data: dict, *sets: str):
    from sim.run import Simulation
    from sim.workload import build_requests

    config = build_config(data, overrides=sets)
    requests = build_requests(config.workload, config.seed, block_tokens=16)
    return Simulation(config, requests)


@pytest.mark.parametrize(
    ("router", "prefix"),
    [("least_loaded", True), ("kv_aware", True), ("prefix_aware", False), ("random", False)],
)
def test_runs_ahead_in_a_cluster_change_nothing(router, prefix):
    """Instances take decode steps ahead of the clock only where no arrival falls (the router
    sees each instance's state at every arrival): the same tables as step by step."""
    cluster = {"instances": 3, "router": {"kind": router, "signal_interval": 0.05}}
    data = chat(cluster=cluster, kv={"prefix_caching": prefix})
    ahead = simulation(data)
    result = ahead.run()
    assert sum(i.decode_runs.steps for i in ahead.cluster.instances) > 0
    stepwise = run(data, "engine.decode_runs=false")
    pd.testing.assert_frame_equal(result.requests, stepwise.requests)
    pd.testing.assert_frame_equal(result.timeline, stepwise.timeline)


def test_with_a_pool_no_instance_runs_ahead():
    sim = simulation(chat(cluster={"instances": 2, **pool()}))
    sim.run()
    assert all(i.decode_runs.steps == 0 for i in sim.cluster.instances)


def test_a_router_sees_pool_blocks_as_the_pool_tier():
    sim = simulation(chat(sessions=10, cluster={"instances": 2, **pool()}))
    sim.run()
    first, second = sim.cluster.instances
    index, store = second.kv.table.index, sim.cluster.pool
    assert store is not None
    mine = np.flatnonzero(sim.cluster.dispatcher.instance_of == 0).tolist()
    prompts = [first.kv.index.hashes[r] for r in mine]
    # a prompt the first instance served that the second does not hold all of
    hashes = next(h for h in prompts if not all(x in index for x in h.tolist()))
    tiers = second.kv.prefix_tiers(hashes)
    held = next(i for i, x in enumerate(hashes.tolist()) if x not in index)  # its own, HBM
    assert (tiers[:held] == 0).all()
    assert len(tiers) == held + store.leading(hashes[held:])
    assert len(tiers) > held and (tiers[held:] == 3).all()


def test_an_instances_nic_is_its_profiles_per_gpu_nic_unless_the_run_gives_one():
    from sim.cluster.cluster import Cluster
    from sim.workload import build_requests

    def nic_bandwidths(cluster: dict, *sets: str) -> list[float]:
        config = build_config(chat(sessions=2, cluster=cluster), overrides=sets)
        requests = build_requests(config.workload, config.seed, block_tokens=16)
        return [f.nic[0].bandwidth for f in Cluster(config, requests).fabrics]

    groups = [{"name": "h", "count": 1}, {"name": "a", "count": 1, "hardware": "a100-80g-sxm"}]
    assert nic_bandwidths({"groups": groups}) == [34.4e9, 7.8e9]  # the profiles' fits
    assert nic_bandwidths({"instances": 1}, "engine.tensor_parallel_size=2") == [2 * 34.4e9]
    given = {"groups": groups, "network": {"bandwidth": "10GB/s"}}
    assert nic_bandwidths(given) == [10e9, 10e9]
    assert nic_bandwidths({"instances": 1}, "hardware=l40s") == [50e9]  # no NIC: the default


def test_tensor_parallel_instances_in_a_cluster_keep_every_invariant():
    """Llama-3-70B at TP 4 on two instances with a pool (offload) and split into one prefill
    and one decode instance: the checks hold, and a split request sends its KV once (each of
    the 4 GPUs its quarter, over its own NIC)."""
    data = {
        **chat(sessions=8, rate=2.0),
        "model": "llama-3-70b",
        "engine": {"tensor_parallel_size": 4, "check": True},
    }
    pooled = run({**data, "kv": {"mode": "offload"}, "cluster": {"instances": 2, **pool()}})
    assert pooled.summary["gpus"] == 8 and pooled.summary["tensor_parallel_size"] == 4
    split = {
        "groups": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}],
        "disaggregation": {"decider": "always"},
    }
    result = run({**data, "cluster": split})
    r = result.requests
    per_token = 80 * 8 * 128 * 2 * 2  # layers x KV heads x head dim x (K, V) x bf16
    sent = r[r.kv_transfer_bytes > 0]
    assert len(sent) and (sent.kv_transfer_bytes % per_token == 0).all()
    assert (sent.kv_transfer_bytes <= (sent.prompt_tokens - 1) * per_token).all()
