"""Prefill/decode handoffs through the cluster's KV pool (``transfer.via: pool``, as
Mooncake): two legs per piece (prefill NIC -> pool, pool -> decode NIC), timed by hand whole
and layer by layer; the prompt's blocks stay in the pool for later requests; NIC and pool
bytes conserve; refused without a pool."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config.loader import build_config
from sim.errors import ConfigError
from sim.run import Simulation
from sim.workload import build_requests
from tests.cluster.test_disaggregation import GQA, LATENCY, chat, split, synthetic

BLOCK = 16 * GQA  # a pool block: 16 tokens of Llama-3-8B's KV
PROMPT = 4001  # 4000 tokens sent: 250 full blocks


def pool_split(
    nic: float, pool: float, layerwise: bool, prefill: int = 1, decode: int = 1,
    capacity: str = "100GiB",
) -> dict:  # fmt: skip
    cluster = split(prefill, decode, f"{nic}B/s", transfer={"via": "pool", "layerwise": layerwise})
    cluster["kv_pool"] = {"capacity": capacity, "bandwidth": f"{pool}B/s"}
    return cluster


def one_request(cluster: dict, hashed: bool, write_policy: str = "write_through", n: int = 1):
    """``n`` requests of ``PROMPT`` tokens (identical prompts with prefix hashes if
    ``hashed``), the first at 0 s, the others 5 s apart (each alone)."""
    data = synthetic(n, PROMPT, 3, cluster=cluster, engine={"check": True})
    data["kv"] = {"write_policy": write_policy}
    if hashed:
        data["workload"]["shared_prefix_tokens"] = PROMPT
    config = build_config(data)
    requests = build_requests(config.workload, config.seed, block_tokens=16)
    requests.arrival_s[:] = 5.0 * np.arange(n)
    sim = Simulation(config, requests)
    return sim, sim.run(), sim.cluster.instances[0].cost


def leg(size: float, nic: float, pool: float) -> float:
    """One leg alone: through the NIC (with its latency) and the pool's link at once."""
    return max(size / nic + LATENCY, size / pool)


@pytest.mark.parametrize("pool", [1e12, 4e9])  # the pool's link above / below the NIC's
@pytest.mark.parametrize(
    ("hashed", "policy"), [(False, "write_through"), (True, "write_through"), (True, "write_back")]
)
def test_whole_transfer_is_a_write_then_a_read(pool, hashed, policy):
    """TTFT = prefill + write + read + the last token, each leg bytes / min(NIC, pool) (+
    the NIC's latency). With write-through the prefill instance has the full blocks on
    their way already when its step ends; the handoff writes none again, and reads once
    they have landed: the same time."""
    nic = 10e9
    sim, result, cost = one_request(pool_split(nic, pool, False), hashed, policy)
    size = (PROMPT - 1) * GQA
    prefill = cost.step(np.array([PROMPT]), np.array([0]), 1).total_s
    last = cost.step(np.array([1]), np.array([PROMPT - 1]), 1).total_s
    exposed = 2 * leg(size, nic, pool)
    r = result.requests.iloc[0]
    assert r.kv_transfer_bytes == size
    assert r.kv_transfer_s == pytest.approx(exposed, rel=1e-9)
    assert r.kv_transfer_exposed_s == pytest.approx(exposed, rel=1e-9)
    assert r.ttft_s == pytest.approx(prefill + exposed + last, rel=1e-9)
    # the bytes went out of the prefill NIC once and into the decode NIC once, each also
    # through the pool's link; the full blocks stay in the pool (only with prefix hashes)
    s, store = result.summary, sim.cluster.pool
    assert s["instances"][0]["nic_out_bytes"] == size and s["instances"][0]["nic_in_bytes"] == 0
    assert s["instances"][1]["nic_in_bytes"] == size and s["instances"][1]["nic_out_bytes"] == 0
    assert s["kv_pool_bytes_moved"] == 2 * size
    assert store.resident == (250 if hashed else 0)


@pytest.mark.parametrize("nic", [1e9, 50e9])  # a layer's leg above / below its compute
def test_layerwise_through_the_pool_is_a_two_stage_pipeline(nic):
    """Layer l's write ends at W_l = max((l + 1) d, W_{l-1}) + w, its read at
    R_l = max(W_l, R_{l-1}) + r; with w = r (the same bytes each way, the pool's link wide
    enough for a write and a read at once) R_l = W_l + w, so the time exposed after the
    step is max(0, w - d) x (layers - 1) + 2 w."""
    layers, pool = 32, 1e13
    _, result, cost = one_request(pool_split(nic, pool, True), hashed=True)
    prefill = cost.step(np.array([PROMPT]), np.array([0]), 1).total_s
    d = prefill / layers
    w = leg((PROMPT - 1) * GQA / layers, nic, pool)
    exposed = max(0.0, w - d) * (layers - 1) + 2 * w
    written = read = 0.0  # the recurrence, a layer at a time
    for layer in range(layers):
        written = max((layer + 1) * d, written) + w
        read = max(written, read) + w
    assert read - prefill == pytest.approx(exposed, rel=1e-9)
    last = cost.step(np.array([1]), np.array([PROMPT - 1]), 1).total_s
    r = result.requests.iloc[0]
    assert r.kv_transfer_exposed_s == pytest.approx(exposed, rel=1e-9)
    assert r.ttft_s == pytest.approx(prefill + exposed + last, rel=1e-9)


def test_a_later_request_with_the_same_prompt_reads_it_from_the_pool():
    """The second request prefills on the other prefill instance: its whole prompt (but
    the last token) is a pool hit there, and its handoff writes nothing (the pool holds
    every block), yet its decode instance still reads all its KV from the pool."""
    cluster = pool_split(10e9, 1e12, True, prefill=2, decode=2)
    cluster["router"]["prefill"] = {"kind": "round_robin"}
    sim, result, _ = one_request(cluster, hashed=True, n=2)
    r, s = result.requests, result.summary
    assert r.prefill_instance.tolist() == [0, 1] and r.decode_instance.tolist() == [2, 3]
    assert r.prefix_tier.tolist() == ["none", "pool"]
    assert sim.cluster.instances[1].kv.counters.pool_hits == 250
    size = (PROMPT - 1) * GQA
    assert (r.kv_transfer_bytes == size).all()
    nic_in, nic_out = ([i[k] for i in s["instances"]] for k in ("nic_in_bytes", "nic_out_bytes"))
    assert nic_out == [size, 0, 0, 0]  # the first prefill wrote it; nobody wrote it again
    assert nic_in == [0, 250 * BLOCK, size, size]
    assert s["kv_pool_blocks_written"] == 250 and s["pool_hit_rate"] > 0


@pytest.mark.parametrize(
    ("policy", "capacity"),
    [("write_through", "100GiB"), ("write_back", "100GiB"), ("write_through", "20MiB")],
)
def test_nic_and_pool_bytes_conserve(policy, capacity):
    """Every full block written to the pool went out of some NIC once (the handoffs' and
    write-through's together, none twice: no block is written while in the pool or on its
    way), plus each split prompt's partial last block; into the NICs came the pool hits
    and every handoff's KV; the pool's link carried both. A 10-block pool evicts blocks
    before their read: the reads still complete (the invariants check every handoff)."""
    cluster = pool_split(50e9, 200e9, True, prefill=2, decode=2, capacity=capacity)
    data = chat(cluster, sessions=12, engine={"check": True}, kv={"write_policy": policy})
    config = build_config(data)
    sim = Simulation(config, build_requests(config.workload, config.seed, block_tokens=16))
    result = sim.run()
    r, s, store = result.requests, result.summary, sim.cluster.pool
    assert (r.status == "finished").all() and s["disaggregated_requests"] == len(r)
    assert r.prefill_instance.isin([0, 1]).all() and r.decode_instance.isin([2, 3]).all()
    # the prompt but its last token, less the whole blocks the decode instance had cached
    cached = r.prompt_tokens - 1 - r.kv_transfer_bytes / GQA
    assert (cached >= 0).all() and (cached % 16 == 0).all()
    partial = ((r.prompt_tokens - 1) % 16).sum() * GQA
    assert s["nic_out_bytes"] == pytest.approx(store.blocks_written * BLOCK + partial, rel=1e-12)
    hits = sum(i.kv.counters.pool_hits for i in sim.cluster.instances)
    assert s["nic_in_bytes"] == pytest.approx(hits * BLOCK + r.kv_transfer_bytes.sum(), rel=1e-12)
    assert s["kv_pool_bytes_moved"] == pytest.approx(s["nic_in_bytes"] + s["nic_out_bytes"])
    assert (store.blocks_evicted > 0) == (capacity == "20MiB")
    assert hits > 0


def test_via_pool_without_a_pool_is_refused_with_the_key():
    with pytest.raises(ConfigError) as caught:
        build_config(chat(split(transfer={"via": "pool"})))
    message = str(caught.value)
    assert "cluster.disaggregation.transfer.via" in message and "kv_pool" in message
