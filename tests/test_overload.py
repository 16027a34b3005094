"""The overload signal on runs whose answer is known by hand: an engine that serves one
request at a time (``max_num_seqs: 1``) of identical requests is a single server with a
fixed service time S (a lone request's run time). Arrivals every S / 0.3 never queue;
arrivals every S / 10 queue up at 9 requests per 10 arrivals. And the bundled Mooncake
configs, which slow their traces down to a rate one GPU serves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from sim.config import load_config
from sim.run import simulate
from sim.workload import build_requests
from sim.workload.requests import Requests
from tests.conftest import REPO, make_config

CONFIG = make_config("engine.max_num_seqs=1")


def evenly(n: int, gap_s: float) -> Requests:
    """``n`` requests of 512 prompt and 64 output tokens (no prefix sharing), ``gap_s`` apart."""
    return Requests(
        arrival_s=np.arange(n) * gap_s,
        prompt_tokens=np.full(n, 512),
        output_tokens=np.full(n, 64),
    )


@pytest.fixture(scope="module")
def service_s() -> float:
    """S: the run time of one request alone."""
    return simulate(CONFIG, evenly(1, 1.0)).summary["sim_time_s"]


def test_arrivals_at_a_third_of_the_service_rate_are_not_overload(service_s):
    n, gap = 30, service_s / 0.3
    s = simulate(CONFIG, evenly(n, gap)).summary
    assert s["overloaded"] is False
    assert s["queue_growth"] == 0.0  # each request is done before the next arrives
    assert s["offered_rate_rps"] == pytest.approx(n / ((n - 1) * gap))
    assert s["served_rate_rps"] == pytest.approx(n / ((n - 1) * gap + service_s))


def test_arrivals_at_ten_times_the_service_rate_are_overload(service_s):
    """The server is never idle: the run lasts n x S, so it serves 1 / S; the queue grows by
    the 9 requests of every 10 that it cannot serve: queue growth 1 - 1/10."""
    n, gap = 100, service_s / 10
    s = simulate(CONFIG, evenly(n, gap)).summary
    assert s["overloaded"] is True
    assert s["queue_growth"] == pytest.approx(0.9, abs=0.05)
    assert s["served_rate_rps"] == pytest.approx(1 / service_s, rel=1e-6)
    assert s["offered_rate_rps"] == pytest.approx(n / ((n - 1) * gap))
    assert s["sim_time_s"] == pytest.approx(n * service_s, rel=1e-6)


@pytest.mark.parametrize("name", ["mooncake-conversation", "mooncake-synthetic"])
def test_the_bundled_mooncake_configs_are_served_and_the_traces_own_rates_are_not(
    traces_dir: Path, name: str
):
    """The first 500 requests as bundled are not overloaded; at the trace's own arrival rate
    (``rate_scale: 1``) they are. (The whole traces, 2 and 0.5 min each: see the configs.)"""
    growth = {}
    for scale in ("bundled", 1):
        sets = ["workload.max_requests=500"] + (
            [] if scale == "bundled" else ["workload.rate_scale=1"]
        )
        config = load_config(REPO / "experiments" / "configs" / f"{name}.yaml", sets)
        requests = build_requests(config.workload, config.seed, traces_dir, 16)
        s = simulate(config, requests).summary
        growth[scale] = s["queue_growth"]
        assert s["overloaded"] is (scale == 1), (scale, s["queue_growth"])
    assert growth["bundled"] < 0.05 and growth[1] > 0.4


def test_kvsim_run_warns_once_on_a_really_overloaded_run(tmp_path, capsys):
    """The whole path: a single-server engine fed 100 requests/s prints one warning."""
    from sim.cli import main
    from tests.conftest import BASE

    data = {**BASE, "engine": {**BASE.get("engine", {}), "max_num_seqs": 1}}
    data["workload"] = {
        "kind": "synthetic", "num_requests": 60, "arrival": {"kind": "poisson", "rate": 100.0},
        "prompt_tokens": 512, "output_tokens": 64,
    }  # fmt: skip
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("kvsim: warning: overloaded: "), err
