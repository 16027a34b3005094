"""The command line: a run writes its files; every bad config is one message and exit 2."""

import json
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from sim.cli import main
from tests.conftest import BASE, REPO

QUICKSTART = REPO / "experiments" / "configs" / "quickstart.yaml"


def write(tmp_path, data, name="run.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_run_writes_every_file_with_the_required_columns(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(write(tmp_path, BASE)), "--out", str(out)]) == 0
    assert "output tokens/s" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "requests_finished",
        "requests_rejected",
        "output_tokens_per_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p99_s",
        "e2e_p50_s",
        "hbm_peak_bytes",
        "preemptions",
        "sim_time_s",
        "wall_time_s",
    ):
        assert key in summary
    assert summary["requests_finished"] == 20
    requests = pd.read_parquet(out / "requests.parquet")
    assert {
        "request_id",
        "arrival_s",
        "first_token_s",
        "finish_s",
        "prompt_tokens",
        "output_tokens",
        "ttft_s",
        "tpot_s",
        "preemptions",
    } <= set(requests.columns)
    timeline = pd.read_parquet(out / "timeline.parquet")
    assert {
        "time_s",
        "batch_size",
        "step_tokens",
        "step_s",
        "hbm_weights_bytes",
        "hbm_activation_bytes",
        "hbm_kv_bytes",
        "hbm_free_bytes",
    } <= set(timeline.columns)
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["engine"]["block_tokens"] == 16  # defaults filled in
    assert resolved["hardware"]["hbm"]["bandwidth"] == 3.35e12


def test_set_overrides_apply(tmp_path):
    out = tmp_path / "out"
    args = ["run", str(write(tmp_path, BASE)), "--out", str(out), "--set", "engine.max_num_seqs=3"]
    assert main(args) == 0
    assert yaml.safe_load((out / "config.resolved.yaml").read_text())["engine"]["max_num_seqs"] == 3
    assert pd.read_parquet(out / "timeline.parquet").batch_size.max() <= 3


BAD = {
    "typo": (
        {**BASE, "engine": {"max_num_seq": 4}},
        ["engine.max_num_seq", "did you mean 'max_num_seqs'"],
    ),
    "unit": (
        {**BASE, "hardware": {"profile": "h100-sxm", "hbm": {"capacity": "80 gigs"}}},
        ["hardware.hbm.capacity", "'80 gigs'", "expected a size in bytes such as '80GiB'"],
    ),
    "negative": (
        {**BASE, "hardware": {"profile": "h100-sxm", "dram": {"capacity": "-1TB"}}},
        ["hardware.dram.capacity", "greater than or equal to 0", "'-1TB'"],
    ),
    "too_large": (
        {**BASE, "model": "llama-3-70b"},
        ["model 'llama-3-70b' does not fit", "131.42 GiB", "79.65 GiB"],
    ),
    "yaml": ("seed: 0\nmodel: [unclosed\n", ["invalid YAML"]),
    "mode": ({**BASE, "kv": {"mode": "dram-centric"}}, ["kv.mode", "hbm, offload, dram_centric"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_is_one_message_and_exit_2(tmp_path, capsys, case):
    data, fragments = BAD[case]
    path = write(tmp_path, data, f"{case}.yaml")
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsim: error: ")
    assert "Traceback" not in err
    assert str(path) in err
    for fragment in fragments:
        assert fragment in err, err
    assert not (tmp_path / "out").exists()


def test_console_script_and_module_entry_points(tmp_path):
    path = write(tmp_path, {**BASE, "engine": {"max_num_seq": 4}})
    for command in (["kvsim"], [sys.executable, "-m", "sim"]):
        proc = subprocess.run([*command, "run", str(path)], capture_output=True, text=True)
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_quickstart_runs_and_plots(tmp_path):
    out = tmp_path / "quickstart"
    assert main(["run", str(QUICKSTART), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests_finished"] == 400
    # the README's first experiment fills the KV pool without overloading the engine
    assert summary["hbm_kv_peak_bytes"] >= 0.99 * summary["kv_pool_bytes"]
    assert summary["overloaded"] is False
    assert main(["plot", str(out), "--kind", "hbm-pressure", "--out", str(out / "p.png")]) == 0
    assert (out / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
