"""Serving against the CPU-cache hit rate (validation/hitrate.py and the fidelity rows that
use it): the trace by hand, the figures of a hand-made request table, the refusals, and the
runs against a plain closed-loop run and the host link's floor."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from sim.config.loader import build_config
from sim.run import simulate
from tests.validation.helpers import hand_row
from validation import fidelity, hitrate
from validation.hitrate import PHASE_GAP_S, Benchmark, Phases


def _bench(**fields) -> Benchmark:
    base = dict(requests=2, concurrency=1, prompt=40, output=3, hit_rate=0.5, block_tokens=16)
    return Benchmark(**{**base, **fields})


def test_the_trace_serves_each_prefix_then_the_prompts_that_start_with_them(tmp_path):
    path = tmp_path / "t.jsonl"
    phases = hitrate.write_trace(_bench(), path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    # 0.5 x 40 tokens = 1.25 blocks of 16 -> 1 block: prefixes [0] and [1]; a 40-token
    # prompt has ceil(40 / 16) = 3 ids, the other two its own
    assert [(r["t"], r["input_length"], r["output_length"], r["hash_ids"]) for r in rows] == [
        (0.0, 16, 3, [0]),
        (0.0, 16, 3, [1]),
        (PHASE_GAP_S, 40, 3, [0, 2, 3]),
        (PHASE_GAP_S, 40, 3, [1, 4, 5]),
    ]
    assert phases == Phases(warm=2, measure_s=PHASE_GAP_S, measured=2)


def test_without_hits_the_trace_is_the_measured_prompts_alone(tmp_path):
    path = tmp_path / "t.jsonl"
    phases = hitrate.write_trace(_bench(hit_rate=0.0), path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["hash_ids"] for r in rows] == [[0, 1, 2], [3, 4, 5]]
    assert phases == Phases(warm=0, measure_s=0.0, measured=2)


@pytest.mark.parametrize(
    ("prompt", "hit_rate", "tokens"),
    [(40, 0.5, 16), (24, 1.0, 16), (32, 1.0, 32), (40, 0.1, 0), (4000, 0.3, 1200)],
)
def test_the_hit_rate_is_realised_in_whole_blocks_of_the_prompt(prompt, hit_rate, tokens):
    assert _bench(prompt=prompt, hit_rate=hit_rate).prefix_tokens == tokens


def test_a_hit_rate_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match="hit_rate"):
        _bench(hit_rate=1.5)


def _table(finish, first_token, arrival, output) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "arrival_s": arrival,
            "first_token_s": first_token,
            "finish_s": finish,
            "ttft_s": np.subtract(first_token, arrival),
            "output_tokens": output,
            "status": ["finished"] * len(finish),
        }
    )


def test_the_figures_are_over_the_measured_phase_alone():
    # two warm requests (done by t = 5), then three measured from t = 100 to t = 110
    table = _table(
        finish=[4.0, 5.0, 104.0, 106.0, 110.0],
        first_token=[1.0, 2.0, 101.0, 102.0, 105.0],
        arrival=[0.0, 0.0, 100.0, 100.0, 104.0],
        output=[3, 3, 10, 10, 20],
    )
    figures = hitrate.measure(table, Phases(warm=2, measure_s=100.0, measured=3))
    assert figures.round_s == 10.0
    assert figures.request_throughput == 3 / 10.0
    assert figures.output_throughput == 40 / 10.0
    assert figures.mean_ttft_s == pytest.approx((1 + 2 + 1) / 3)


def test_a_warm_phase_that_runs_into_the_measured_one_is_refused():
    table = _table([150.0, 160.0], [1.0, 101.0], [0.0, 100.0], [1, 1])
    with pytest.raises(RuntimeError, match="overlap"):
        hitrate.measure(table, Phases(warm=1, measure_s=100.0, measured=1))


def test_hits_must_be_every_prefix_block_in_dram_and_none_in_hbm():
    bench = _bench(requests=2, prompt=400, hit_rate=0.5)  # 200 tokens: 12 blocks (12.5 -> 12)
    lookups = 200
    hitrate.check_hits({"prefix_lookup_blocks": lookups, "hbm_hit_rate": 0.0,
                        "dram_hit_rate": 24 / lookups}, bench)  # fmt: skip
    for hbm, dram in ((1, 23), (0, 20), (0, 0)):
        summary = {"prefix_lookup_blocks": lookups, "hbm_hit_rate": hbm / lookups,
                   "dram_hit_rate": dram / lookups}  # fmt: skip
        with pytest.raises(RuntimeError, match="DRAM"):
            hitrate.check_hits(summary, bench)


POOL = "engine.kv_pool_blocks=1000"  # 16,000 tokens: less than the prefixes of 12 requests


def _row(**fields) -> pd.Series:
    """A hit-rate row by hand: 12 requests of 6000 tokens, 2 at a time, on a 1000-block pool,
    so that the warm phase's prefixes (36,000 tokens) leave none in HBM."""
    base = dict(batch=2, num_requests=12, input_tokens=6000, output_tokens=20, hit_rate=0.5,
                metric="offload_round_time", settings=POOL)  # fmt: skip
    return hand_row(**{**base, **fields})


def test_without_hits_a_row_is_a_plain_closed_loop_run():
    row = _row(hit_rate=0.0, settings=f"{POOL} kv.mode=hbm")
    config = fidelity.row_config(row)
    config["workload"].update(num_requests=12, max_concurrency=2)
    plain = simulate(build_config(config, overrides=[POOL, "kv.mode=hbm"])).requests
    assert fidelity.predict(row) == pytest.approx(plain["finish_s"].max(), rel=1e-12)
    row["metric"] = "offload_mean_ttft"
    assert fidelity.predict(row) == pytest.approx(plain["ttft_s"].mean(), rel=1e-12)


def test_a_prefix_in_dram_takes_at_least_its_bytes_over_the_host_link_and_saves_time():
    # one request at a time: its 3000-token prefix comes back at no more than H100's 55 GB/s,
    # 128 KiB a token (Llama-3-8B bf16), before its first token
    alone = dict(batch=1, metric="offload_mean_ttft")
    hit = fidelity.predict(_row(**alone))
    cold = fidelity.predict(_row(**alone, hit_rate=0.0))
    assert hit >= 3000 * 128 * 1024 / 55e9
    assert hit < cold
    # and the throughput of the whole benchmark grows with the hit rate
    rates = [
        fidelity.predict(_row(metric="offload_request_throughput", unit="req/s", hit_rate=h))
        for h in (0.0, 0.5, 0.9)
    ]
    assert rates == sorted(rates) and rates[0] < rates[-1]


def test_a_pool_that_keeps_the_prefixes_in_hbm_is_refused():
    # two 1000-token prefixes fit H100's pool many times over: phase 2 finds them in HBM
    row = _row(batch=1, num_requests=2, input_tokens=2000, settings="")
    with pytest.raises(RuntimeError, match=r"hand: .* in HBM"):
        fidelity.predict(row)


def test_found_is_the_share_of_the_measured_prompts_tokens_in_each_tier():
    # 2 prompts of 400 tokens = 50 blocks of 16; 10 blocks hit in HBM, 25 in DRAM
    summary = {"prefix_lookup_blocks": 100, "hbm_hit_rate": 0.10, "dram_hit_rate": 0.25}
    assert hitrate.found(summary, _bench(requests=2, prompt=400)) == {"hbm": 0.2, "dram": 0.5}


def _curve(capsys, *extra: str) -> list[list[str]]:
    hitrate.main(
        ["--model", "llama-3-8b", "--hardware", "h100-sxm", "--prompt", "2000", "--output", "4",
         "--concurrency", "2", "--requests", "12", *extra]
    )  # fmt: skip
    return [line.split() for line in capsys.readouterr().out.splitlines()]


def test_the_curve_prints_each_hit_rate_with_where_the_prefixes_were_found(tmp_path, capsys):
    out = tmp_path / "curve.png"
    # a 400-block pool (6,400 tokens) keeps none of the 12 prefixes of 992 tokens
    small = "engine.kv_pool_blocks=400"
    lines = _curve(capsys, "--hit-rates", "0,0.5", "--set", small, "--plot", str(out))
    assert lines[0] == [
        "hit_rate", "found_hbm", "found_dram", "round_s", "request_throughput",
        "output_throughput", "mean_ttft_s",
    ]  # fmt: skip
    # 0.5 x 2000 tokens = 62.5 blocks -> 62 blocks = 992 tokens, all of them from DRAM
    assert [float(x) for x in lines[1][:3]] == [0.0, 0.0, 0.0]
    assert [float(x) for x in lines[2][:3]] == [0.496, 0.0, 0.496]
    assert out.stat().st_size > 0
    # a 1000-block pool still holds some prefixes when they come back: the curve says so
    hit, hbm, dram = (float(x) for x in _curve(capsys, "--hit-rates", "0.5", "--set", POOL)[1][:3])
    assert hbm > 0 and hbm + dram == pytest.approx(hit)
    # ... unless the engine's own prefix cache is off: then every prefix comes from DRAM
    off = _curve(
        capsys, "--hit-rates", "0.5", "--set", POOL, "--set", "kv.hbm_prefix_caching=false"
    )
    assert [float(x) for x in off[1][:3]] == [0.496, 0.0, 0.496]


def test_the_curve_realises_the_hit_rate_in_the_engines_own_blocks(capsys):
    # 0.25 x 2000 tokens = 500: 15.6 blocks of 32 -> 16 = 512 tokens (of 16: 31.25 -> 31 = 496)
    line = _curve(capsys, "--hit-rates", "0.25", "--block-tokens", "32")[1]
    hit, hbm, dram = (float(x) for x in line[:3])
    assert hit == 0.256 and hbm + dram == pytest.approx(hit)
    # the engine's block and the trace's prefix blocks are one: a bigger engine block alone is
    # refused, with the sizes that would do
    with pytest.raises(SystemExit):
        _curve(capsys, "--hit-rates", "0.25", "--set", "engine.block_tokens=32")
    assert "use a divisor of 16 (2, 4, 8, 16)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--hit-rates", "x"], "expected comma-separated fractions"),
        (["--hit-rates", "1.5"], "hit_rate 1.5 is not a fraction"),
        (["--set", "kv.mode=nope"], "unknown KV mode"),
    ],
)
def test_the_curve_refuses_bad_input_in_one_line(capsys, extra, message):
    with pytest.raises(SystemExit) as exit_:
        _curve(capsys, *extra)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
