"""Prefill/decode disaggregation: where each request runs, the KV bytes it sends, times
derived by hand for one request and for two sharing a NIC, the deciders, and the trade:
slow NICs lose on TTFT, fast ones win on TPOT under long prompts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.config.loader import build_config
from sim.errors import ConfigError
from sim.run import Simulation, simulate
from sim.workload import build_requests
from tests.cluster import chats

LATENCY = 10e-6
GQA = 2 * 32 * 8 * 128 * 2  # llama-3-8b: 2 (K, V) x layers x kv_heads x head_dim x bf16
MHA = 2 * 32 * 32 * 128 * 2  # llama-2-7b: every head has its own K and V


def synthetic(n: int, prompt: int, output: int, rate: float | None = None, **extra) -> dict:
    arrival = {"kind": "poisson", "rate": rate} if rate else {"kind": "all_at_once"}
    return {
        "seed": extra.pop("seed", 5),
        "model": "llama-3-8b",
        "hardware": "h100-sxm",
        "workload": {
            "kind": "synthetic", "num_requests": n, "arrival": arrival,
            "prompt_tokens": {"kind": "fixed", "value": prompt},
            "output_tokens": {"kind": "fixed", "value": output},
        },
        **extra,
    }  # fmt: skip


def split(prefill: int = 1, decode: int = 1, bandwidth: str = "50GB/s", **disagg) -> dict:
    return {
        "groups": [
            {"name": "p", "role": "prefill", "count": prefill},
            {"name": "d", "role": "decode", "count": decode},
        ],
        "disaggregation": {"decider": "always", **disagg},
        "router": {"prefill": {"kind": "least_loaded"}, "decode": {"kind": "round_robin"}},
        "network": {"bandwidth": bandwidth, "latency": "10us"},
    }


def simulation(data: dict) -> Simulation:
    config = build_config(data)
    return Simulation(config, build_requests(config.workload, config.seed, block_tokens=16))


def chat(cluster: dict, sessions: int = 30, rate: float = 3.0, **extra) -> dict:
    return chats.chat(sessions, rate, cluster=cluster, **extra)


def test_every_disaggregated_request_prefills_on_prefill_and_decodes_on_decode():
    for layerwise in (False, True):
        cluster = split(2, 2, transfer={"layerwise": layerwise})
        if layerwise:  # (and Mooncake's conductor picks the prefill instance)
            cluster["router"]["prefill"] = {"kind": "ttft_estimate"}
        data = chat(cluster, sessions=12, engine={"check": True})
        result = simulate(build_config(data))
        r, t = result.requests, result.timeline
        assert (r.status == "finished").all()
        assert r.prefill_instance.isin([0, 1]).all() and r.decode_instance.isin([2, 3]).all()
        assert (r.instance == r.decode_instance).all()
        assert result.summary["disaggregated_requests"] == len(r)
        # a decode instance computes one prompt token per request (its last), the rest decodes
        decode_rows = t[t.instance >= 2]
        assert decode_rows.prefill_tokens.sum() == len(r)
        assert (t[t.instance < 2].sampled.sum()) == len(r)  # each prefill's one sample
        prefills = [i["prefills"] for i in result.summary["instances"]]
        counts = r.prefill_instance.value_counts().reindex(range(4), fill_value=0)
        assert prefills == counts.tolist() and prefills[2:] == [0, 0]
        # every byte sent left a prefill NIC and entered a decode NIC
        assert result.summary["nic_out_bytes"] == pytest.approx(r.kv_transfer_bytes.sum())
        assert t[t.instance < 2].nic_in_bytes.sum() == 0
        assert t[t.instance >= 2].nic_out_bytes.sum() == 0


@pytest.mark.parametrize(("model", "per_token"), [("llama-3-8b", GQA), ("llama-2-7b", MHA)])
def test_kv_transfer_bytes_are_the_prompt_times_the_kv_bytes_per_token(model, per_token):
    prompt = 1000
    data = synthetic(6, prompt, 4, rate=5.0, model=model, cluster=split())
    r = simulate(build_config(data)).requests
    # the decode instance computes the last prompt token itself (vLLM's KV connectors)
    assert (r.kv_transfer_bytes == (prompt - 1) * per_token).all()


def test_fp8_kv_halves_the_bytes():
    data = synthetic(2, 1000, 4, rate=5.0, kv={"dtype": "fp8"}, cluster=split())
    r = simulate(build_config(data)).requests
    assert (r.kv_transfer_bytes == 999 * GQA / 2).all()


def test_a_never_decider_gives_the_colocated_result_exactly():
    decode = {"kind": "least_loaded"}
    colocated = simulate(
        build_config(chat({"groups": [{"name": "d", "count": 2}], "router": decode}))
    )
    cluster = split(1, 2, decider="never")
    cluster["router"]["decode"] = decode
    never = simulate(build_config(chat(cluster, engine={"check": True})))
    columns = ["instance", "prefill_instance", "decode_instance"]
    assert (never.requests.instance == colocated.requests.instance + 1).all()
    assert (never.requests.prefill_instance == never.requests.decode_instance).all()
    pd.testing.assert_frame_equal(
        never.requests.drop(columns=columns), colocated.requests.drop(columns=columns)
    )
    timeline = never.timeline.assign(instance=never.timeline.instance - 1)
    pd.testing.assert_frame_equal(timeline, colocated.timeline)
    assert never.summary["disaggregated_requests"] == 0
    for key in ("ttft_p50_s", "tpot_p99_s", "e2e_mean_s", "sim_time_s"):
        assert never.summary[key] == colocated.summary[key]


def one_request(
    prompt: int, bandwidth: float, layerwise: bool, n: int = 1, decode: int = 1,
    latency: str = "10us",
):  # fmt: skip
    """``n`` requests at time 0 through one prefill and ``decode`` decode instances; the
    simulation, its result and the instances' cost model."""
    cluster = split(1, decode, f"{bandwidth}B/s", transfer={"layerwise": layerwise})
    cluster["network"]["latency"] = latency
    sim = simulation(synthetic(n, prompt, 3, cluster=cluster, engine={"check": True}))
    return sim, sim.run(), sim.cluster.instances[0].cost


def test_whole_transfer_ttft_is_prefill_plus_transfer_plus_the_last_token():
    prompt, bandwidth = 4001, 10e9
    _, result, cost = one_request(prompt, bandwidth, layerwise=False)
    prefill = cost.step(np.array([prompt]), np.array([0]), 1).total_s
    transfer = (prompt - 1) * GQA / bandwidth + LATENCY  # both NICs at once: one latency
    last = cost.step(np.array([1]), np.array([prompt - 1]), 1).total_s
    r = result.requests.iloc[0]
    assert r.kv_transfer_s == pytest.approx(transfer, rel=1e-9)
    assert r.kv_transfer_exposed_s == pytest.approx(transfer, rel=1e-9)
    assert r.ttft_s == pytest.approx(prefill + transfer + last, rel=1e-9)


@pytest.mark.parametrize("bandwidth", [1e9, 50e9])  # a layer's transfer above / below its compute
def test_layerwise_exposed_time_by_hand(bandwidth):
    prompt, layers = 4001, 32
    _, result, cost = one_request(prompt, bandwidth, layerwise=True)
    prefill = cost.step(np.array([prompt]), np.array([0]), 1).total_s
    per_layer = prefill / layers  # layer l is done at (l + 1) x per_layer
    transfer = (prompt - 1) * GQA / layers / bandwidth + LATENCY  # each layer pays a latency
    # layer l's transfer ends at max(its layer's end, the previous transfer's end) + transfer
    exposed = max(0.0, transfer - per_layer) * (layers - 1) + transfer
    last = cost.step(np.array([1]), np.array([prompt - 1]), 1).total_s
    r = result.requests.iloc[0]
    assert r.kv_transfer_exposed_s == pytest.approx(exposed, rel=1e-9)
    assert r.ttft_s == pytest.approx(prefill + exposed + last, rel=1e-9)
    if bandwidth > 10e9:
        assert exposed == pytest.approx(transfer)  # only the last layer shows
        whole = (prompt - 1) * GQA / bandwidth + LATENCY
        assert r.kv_transfer_exposed_s < whole / 10


def test_layerwise_is_slower_for_a_short_prompt_behind_a_slow_start():
    """32 latencies instead of one: where a transfer's latency (1 ms) exceeds a layer's
    compute, a short prompt's KV lands later layer by layer; a long one's still earlier."""
    for prompt, slower in ((20, True), (8000, False)):
        times = [
            one_request(prompt, 50e9, lw, latency="1ms")[1].requests.ttft_s.iloc[0]
            for lw in (False, True)
        ]
        assert (times[1] > times[0]) == slower


def test_two_transfers_share_the_prefill_nic():
    prompt, bandwidth = 4001, 10e9
    _, result, cost = one_request(prompt, bandwidth, layerwise=False, n=2, decode=2)
    r = result.requests
    assert sorted(r.decode_instance) == [1, 2] and (r.prefill_instance == 0).all()
    prefill = cost.step(np.array([prompt, prompt]), np.array([0, 0]), 2).total_s
    # one prefill step for both; both transfers leave its NIC at once and share it
    both = 2 * (prompt - 1) * GQA / bandwidth + LATENCY
    assert r.kv_transfer_exposed_s.tolist() == pytest.approx([both, both], rel=1e-9)
    last = cost.step(np.array([1]), np.array([prompt - 1]), 1).total_s
    assert r.ttft_s.tolist() == pytest.approx([prefill + both + last] * 2, rel=1e-9)


def test_the_prefill_instance_keeps_the_kv_as_prefix_cache_or_drops_it():
    for caching in (True, False):
        sim = simulation(chat(split(), sessions=4, kv={"prefix_caching": caching}))
        sim.run()
        p = sim.cluster.instances[0].kv
        assert int(p.held.sum()) == 0  # released once sent
        assert (len(p.table.index) > 0) == caching


def test_prefix_threshold_disaggregates_only_long_uncached_prompts():
    def run_with(threshold: int):
        decider = {"kind": "prefix_threshold", "uncached_tokens": threshold}
        cluster = split(1, 2, decider=decider)
        cluster["router"]["decode"] = {"kind": "session"}  # a conversation's turns stay
        data = chat(cluster, sessions=15, engine={"check": True})
        return simulate(build_config(data)).requests

    r = run_with(0)
    assert (r.prefill_instance == 0).all()  # every prompt has an uncached token
    r = run_with(10**6)
    assert (r.prefill_instance > 0).all() and (r.kv_transfer_bytes == 0).all()
    r = run_with(600)
    split_rows = r.prefill_instance == 0
    assert 0 < split_rows.sum() < len(r)
    # those split lacked over 600 tokens; those kept whole had a short prompt or a hit
    assert (r[split_rows].prompt_tokens > 600).all()
    whole = r[~split_rows]
    assert ((whole.prompt_tokens <= 600) | (whole.prefix_tier != "none")).all()


def test_slow_nics_lose_to_colocation_on_ttft():
    colocated = {"groups": [{"name": "m", "count": 2}], "router": {"kind": "round_robin"}}
    data = synthetic(40, 3000, 30, rate=4.0, cluster=colocated)
    base = simulate(build_config(data)).summary
    data["cluster"] = split(1, 1, "1GB/s")
    slow = simulate(build_config(data)).summary
    assert slow["ttft_p50_s"] > base["ttft_p50_s"] + 0.3  # ~0.39 s of KV over 1 GB/s


def test_fast_nics_and_long_prompts_win_on_tpot_p99():
    """Colocated, each 8k prompt's chunks stall the decodes batched with them; with its
    prefill elsewhere, a decode instance's steps are decodes (and one token per arrival)."""
    colocated = {"groups": [{"name": "m", "count": 4}], "router": {"kind": "least_loaded"}}
    data = synthetic(120, 8000, 200, rate=6.0, cluster=colocated)
    base = simulate(build_config(data)).summary
    data["cluster"] = split(2, 2, "50GB/s")
    fast = simulate(build_config(data)).summary
    assert fast["tpot_p99_s"] < 0.7 * base["tpot_p99_s"]


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({**split(), "disaggregation": None}, "no cluster.disaggregation"),
        ({"instances": 2, "disaggregation": {}}, "groups of role prefill and decode"),
        (
            {"groups": [{"name": "p", "role": "prefill"}, {"name": "m"}], "disaggregation": {}},
            "groups of role prefill and decode and no mixed one",
        ),
        ({"instances": 2, "router": {"prefill": {}, "decode": {}}}, "a router per role needs"),
        (split(transfer={"via": "pool"}), "there is no cluster.kv_pool"),
        (split(decider="sometimes"), "expected never, always or"),
        (split(decider={"kind": "prefix_threshold", "uncached": 5}), "uncached_tokens"),
    ],
)
def test_bad_disaggregation_configs_are_refused_with_the_key(cluster, message):
    if cluster.get("disaggregation", 1) is None:
        del cluster["disaggregation"]
    with pytest.raises(ConfigError, match="cluster") as caught:
        build_config(chat(cluster))
    assert message in str(caught.value)


def test_prefill_and_decode_must_hold_kv_in_one_dtype():
    cluster = split()
    cluster["groups"][1]["kv"] = {"dtype": "fp8"}
    with pytest.raises(ConfigError, match="dtype"):
        build_config(chat(cluster))


def test_a_prompt_too_long_for_a_side_is_rejected_or_kept_whole():
    """Too long for its decode instance: rejected there (and no prefill runs); too long for
    every prefill instance: its decode instance does it all."""
    cluster = split()
    cluster["groups"][1]["engine"] = {"max_model_len": 3000}
    r = simulate(build_config(synthetic(3, 4000, 4, rate=5.0, cluster=cluster))).requests
    assert (r.status == "rejected").all() and (r.kv_transfer_bytes == 0).all()
    cluster = split()
    cluster["groups"][0]["engine"] = {"max_model_len": 3000}
    data = synthetic(3, 4000, 4, rate=5.0, cluster=cluster, engine={"check": True})
    r = simulate(build_config(data)).requests
    assert (r.status == "finished").all() and (r.prefill_instance == 1).all()


class StepLimit:
    """Fails a run that takes more steps than ``limit`` (a livelock would never end)."""

    def __init__(self, limit: int):
        self.limit, self.steps = limit, 0

    def step_ended(self, row) -> None:
        self.steps += 1
        if self.steps > self.limit:
            raise RuntimeError(f"more than {self.limit} steps: the run does not progress")

    def steps_ended(self, rows, steps: int) -> None:
        self.steps += steps


def test_a_preempted_long_request_does_not_starve_landed_handoffs():
    """Three prefill instances fill one decode instance (2,500 blocks) with landed KV; a
    10k-token request preempted there recomputes in two steps of 8,192 tokens. Queued in
    front of the landed requests it would take the budget, be preempted for their blocks,
    and again, for ever; behind them (they need one token each) the run ends."""
    cluster = split(3, 1)
    cluster["groups"][1]["engine"] = {"kv_pool_blocks": 2500}
    data = synthetic(60, 10000, 1, rate=8.0, cluster=cluster, seed=0)
    data["workload"]["output_tokens"] = {"kind": "uniform", "min": 50, "max": 600}
    config = build_config(data)
    limit = StepLimit(100_000)
    requests = build_requests(config.workload, config.seed, block_tokens=16)
    result = Simulation(config, requests, observers=[lambda instance: limit]).run()
    assert (result.requests.status == "finished").all()
    assert result.requests.preemptions.sum() > 0  # the case arose
