"""``kvsim replay``: the trace reader, the table, the CSV, and the real Mooncake trace."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
import pytest
from policy_helpers import CONVERSATION, shared_trace

from policies import make_eviction, replay, replay_generic
from sim.commands import replay as replay_cmd
from sim.errors import KvsimError
from sim.replay import (
    parse_capacities,
    parse_policies,
    read_trace,
    replay_table,
)

FUSED = ["fifo", "lru", "lfu", "arc", "s3fifo", "sieve", "opt", "prefix_lru"]


def write_trace(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


ROWS = [
    {"timestamp": 3000, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1]},
    {"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [0, 2]},
    {"timestamp": 3000, "input_length": 1536, "output_length": 5, "hash_ids": [0, 1, 3]},
    {"timestamp": 0, "input_length": 512, "output_length": 5, "hash_ids": [4]},
]


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kvsim")
    replay_cmd.add_command(top.add_subparsers(dest="command", required=True))
    return top


def test_reader_sorts_by_time_stably(tmp_path):
    trace = read_trace(write_trace(tmp_path / "t.jsonl", ROWS))
    assert trace.requests() == [[0, 2], [4], [0, 1], [0, 1, 3]]
    assert trace.times.tolist() == [0.0, 0.0, 3.0, 3.0]


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
         '{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1,]}\n',
         r"t\.jsonl:2: .*JSON"),
        ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, -2]}\n',
         r"t\.jsonl:1: field 'hash_ids'"),
        ('{"hash_ids": [1]}\n', r"t\.jsonl: no row has the key 'timestamp'"),
        ("[1, 2]\n", r"t\.jsonl:1: not a JSON object"),
    ],
)  # fmt: skip
def test_reader_errors_name_file_and_line(tmp_path, text, pattern):
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(KvsimError, match=pattern):
        read_trace(path)


def test_trace_path_resolves_as_given_then_under_kvsim_traces(tmp_path, monkeypatch):
    write_trace(tmp_path / "t.jsonl", ROWS)
    monkeypatch.delenv("KVSIM_TRACES", raising=False)
    monkeypatch.setattr("sim.workload.trace.traces_root", lambda: None)
    with pytest.raises(KvsimError, match=r"trace file 't.jsonl' not found .*set \$KVSIM_TRACES"):
        read_trace("t.jsonl")
    monkeypatch.undo()
    monkeypatch.delenv("KVSIM_TRACES", raising=False)
    monkeypatch.setenv("KVSIM_TRACES", str(tmp_path))
    assert len(read_trace("t.jsonl").keys) == 8
    with pytest.raises(KvsimError, match="trace format 'csv' is not supported"):
        read_trace("t.jsonl", "csv")


def test_argument_errors():
    with pytest.raises(KvsimError, match="--capacities '10,x'"):
        parse_capacities("10,x")
    with pytest.raises(KvsimError, match="--capacities '0'"):
        parse_capacities("0")
    specs = parse_policies("lru,s3fifo", ["s3fifo.small_fraction=0.25", "s3fifo.move_threshold=1"])
    assert specs == {
        "lru": "lru",
        "s3fifo": {"name": "s3fifo", "small_fraction": 0.25, "move_threshold": 1},
    }
    with pytest.raises(KvsimError, match=r"expected POLICY\.KEY=VALUE"):
        parse_policies("lru", ["arc.p=1"])


def test_bad_policy_is_a_user_error(tmp_path):
    trace = read_trace(write_trace(tmp_path / "t.jsonl", ROWS))
    with pytest.raises(KvsimError, match="unknown eviction policy 'lfru'"):
        replay_table(trace, {"lfru": "lfru"}, [2], progress=False)
    with pytest.raises(KvsimError, match=r"'small_fraction' = 2\.0"):
        replay_table(trace, {"s3": {"name": "s3fifo", "small_fraction": 2.0}}, [2], progress=False)


def test_command_writes_one_row_per_policy_and_capacity(tmp_path, capsys):
    path = write_trace(tmp_path / "t.jsonl", ROWS)
    out = tmp_path / "hits.csv"
    args = parser().parse_args(
        ["replay", str(path), "--capacities", "1,2,100", "--policies", "lru,opt,fifo",
         "--out", str(out), "--jobs", "1", "--quiet"]
    )  # fmt: skip
    assert args.func(args) == 0
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == [
        "policy", "capacity_blocks", "accesses", "hits", "hit_rate", "block_tokens", "requests"
    ]  # fmt: skip
    assert {(r["block_tokens"], r["requests"]) for r in rows} == {("", "4")}  # trace blocks
    assert [(r["policy"], int(r["capacity_blocks"])) for r in rows] == [
        (p, c) for p in ("lru", "opt", "fifo") for c in (1, 2, 100)
    ]
    by_key = {(r["policy"], int(r["capacity_blocks"])): r for r in rows}
    # accesses 0 2 4 0 1 0 1 3: with room for all, 0, 0, 1 repeat.
    assert by_key["lru", 100]["accesses"] == "8" and by_key["lru", 100]["hits"] == "3"
    assert float(by_key["lru", 100]["hit_rate"]) == pytest.approx(3 / 8)
    assert int(by_key["opt", 2]["hits"]) >= int(by_key["lru", 2]["hits"])
    assert "lru" in capsys.readouterr().out


def test_parallel_generic_and_fused_runs_agree(tmp_path):
    rng = np.random.default_rng(1)
    rows = [
        {
            "timestamp": i,
            "input_length": 512 * 6,
            "output_length": 1,
            "hash_ids": sorted(set(rng.zipf(1.5, 6).tolist())),
        }
        for i in range(300)
    ]
    trace = read_trace(write_trace(tmp_path / "z.jsonl", rows))
    policies = {name: name for name in [*FUSED, "length_aware", "gds"]}
    serial = replay_table(trace, policies, [3, 20], jobs=1, progress=False)
    assert replay_table(trace, policies, [3, 20], jobs=2, progress=False) == serial
    assert replay_table(trace, policies, [3, 20], fast=False, progress=False) == serial


@pytest.fixture(scope="module")
def conversation():
    return read_trace(shared_trace(CONVERSATION))


def test_mooncake_conversation_counts(conversation):
    keys = conversation.keys
    assert len(keys) == 288_500
    seen, repeated = set(), 0
    path = shared_trace(CONVERSATION)
    with open(path) as handle:
        for line in handle:
            for block in json.loads(line)["hash_ids"]:
                repeated += block in seen
                seen.add(block)
    assert repeated == 105_710 and round(repeated / 288_500, 4) == 0.3664  # the README's figure
    for name in ("lru", "arc", "s3fifo", "opt"):
        policy = make_eviction(name, capacity=len(seen), future=keys)
        assert replay(policy, conversation, len(seen)).sum() == repeated, name


@pytest.mark.parametrize("name", FUSED)
def test_fused_equals_generic_on_mooncake(conversation, name):
    head = conversation.starts[conversation.starts < 20_000][-1]
    from policies import AccessTrace

    part = AccessTrace(conversation.keys[:head], conversation.starts[conversation.starts < head],
                       conversation.times[: int((conversation.starts < head).sum())])  # fmt: skip
    for capacity in (300, 3000):
        fast = replay(make_eviction(name, capacity=capacity, future=part.keys), part, capacity)
        slow = replay_generic(
            make_eviction(name, capacity=capacity, future=part.keys), part, capacity
        )
        assert np.array_equal(fast, slow), (name, capacity)


def test_through_the_kvsim_main_entry_point(tmp_path, monkeypatch, capsys):
    import sim.cli

    if "sim.commands.replay" not in sim.cli.BUILTIN_COMMANDS:
        monkeypatch.setattr(
            sim.cli, "BUILTIN_COMMANDS", (*sim.cli.BUILTIN_COMMANDS, "sim.commands.replay")
        )
    path = write_trace(tmp_path / "t.jsonl", ROWS)
    assert sim.cli.main(["replay", str(path), "--capacities", "2", "--quiet", "--jobs", "1"]) == 0
    assert "opt" in capsys.readouterr().out
    code = sim.cli.main(["replay", str(path), "--capacities", "2", "--policies", "lur", "--quiet"])
    assert code == 2
    assert "unknown eviction policy 'lur' (did you mean 'lru'?)" in capsys.readouterr().err
