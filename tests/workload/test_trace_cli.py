"""``kvsim trace stats``: the JSON keys, the table, and bad rows ending in exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import main
from tests.workload.test_trace_real import MOONCAKE, plain_mooncake

KEYS = [
    "requests",
    "duration_s",
    "arrival_rate_per_s",
    "input_mean",
    "input_p50",
    "input_p99",
    "output_mean",
    "output_p50",
    "output_p99",
    "repeated_block_fraction",
]


def stats_json(capsys, *argv: str) -> dict:
    assert main(["trace", "stats", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_keys_and_values(traces_dir: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(traces_dir)
    got = stats_json(capsys, MOONCAKE[0], "--format", "mooncake")
    assert list(got) == KEYS
    expected = plain_mooncake(traces_dir / MOONCAKE[0])
    assert got == pytest.approx(expected, rel=1e-9)
    azure = stats_json(capsys, "azure_llm_2023_code.csv", "--format", "azure")
    assert list(azure) == KEYS and azure["repeated_block_fraction"] is None
    assert azure["requests"] == 8819


def test_relative_path_falls_back_to_env(
    traces_dir: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVSIM_TRACES", str(traces_dir))
    assert stats_json(capsys, MOONCAKE[1], "--format", "mooncake")["requests"] == 3993


def test_table_and_generic_columns(write, capsys) -> None:
    path = write("t.csv", "ts,in,out\n0,10,1\n1000,30,3\n2000,20,2\n")
    argv = ["trace", "stats", str(path), "--format", "csv", "--time-unit", "ms"]
    assert main([*argv, "--columns", "arrival=ts,prompt_tokens=in,output_tokens=out"]) == 0
    table = capsys.readouterr().out
    assert "requests" in table and "20.0 / 20.0" in table and "repeated-block fraction" in table
    assert "2.0 s" in table and "1.500 req/s" in table


def test_bad_rows_exit_status_2(write, capsys) -> None:
    path = write(
        "bad.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 1\n',
    )
    assert main(["trace", "stats", str(path), "--format", "mooncake", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvsim: error: {path}:2: not valid JSON")
    assert main(["trace", "stats", str(path), "--format", "mooncake", "--on-bad-rows", "skip"]) == 0
    assert "skipped 1 bad rows" in capsys.readouterr().err


def test_usage_errors_exit_status_2(write, capsys) -> None:
    path = write("t.csv", "ts,in,out\n0,10,1\n")
    assert main(["trace", "stats", str(path), "--format", "csv"]) == 2
    assert "needs 'columns'" in capsys.readouterr().err
    assert main(["trace", "stats", str(path), "--format", "csv", "--columns", "when=ts"]) == 2
    assert "--columns expects FIELD=COLUMN" in capsys.readouterr().err
    assert main(["trace", "stats", "nowhere.csv", "--format", "azure"]) == 2
    assert "'nowhere.csv' not found" in capsys.readouterr().err
