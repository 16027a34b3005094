"""``kvsim replay --block-tokens B --max-requests N``: the engine's blocks and requests.

A hand-made trace gives hand-counted hits; on the Mooncake conversation trace the replay's
keys are the engine's hashes, its lookups are the engine's ``prefix_lookup_blocks`` and,
with a pool that never fills, its hits are the engine's.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from policy_helpers import CONVERSATION, shared_trace

from sim.cli import main
from sim.config import build_config
from sim.errors import KvsimError
from sim.replay import read_replay_trace, read_trace, replay_table
from sim.run import simulate
from sim.workload import build_requests

# Trace blocks of 512 tokens; replayed in engine blocks of 256 (two per trace block), a
# trace id i's halves are written i0, i1 below. Arrival order: R0, R1, R2 (a tie with R1,
# later in the file), R3, R4 (earlier in the file than R1).
ROWS = [
    {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]},  # R0
    {"timestamp": 5000, "input_length": 1100, "output_length": 4, "hash_ids": [5]},  # R4
    {"timestamp": 1000, "input_length": 1300, "output_length": 4, "hash_ids": [1, 2, 3]},  # R1
    {"timestamp": 1000, "input_length": 600, "output_length": 4, "hash_ids": [1, 9]},  # R2
    {"timestamp": 3000, "input_length": 1100, "output_length": 4, "hash_ids": [5]},  # R3
]
# R0: 1024 tokens = 4 full blocks 10 11 20 21; the engine looks up 1023 // 256 = 3 of them
#     (21 is written, never looked up).
# R1: 1300 tokens = 5 full blocks 10 11 20 21 30, all looked up (1299 // 256 = 5): 4 hits
#     with room for all (21 thanks to R0's write), 30 misses.
# R2: 600 tokens = 2 full blocks 10 11 (id 9 holds 88 tokens, no full block): 2 hits.
# R3: 1100 tokens = 4 blocks: 50 51 and two past its only id, unique to the row: 4 misses.
# R4: as R3 from another line: 50 51 hit, its own two unique blocks miss.
LOOKUPS = [3, 5, 2, 4, 4]
HITS_UNBOUNDED = [0, 4, 2, 0, 2]


def write_trace(path: Path, rows=ROWS) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def tiny(tmp_path) -> Path:
    return write_trace(tmp_path / "t.jsonl")


@pytest.mark.parametrize("first", [1, 2, 3, 5])
def test_hand_counted_hits_with_room_for_every_block(tiny, first):
    trace = read_replay_trace(tiny, block_tokens=256, max_requests=first)
    (row,) = replay_table(trace, {"lru": "lru"}, [1000], progress=False)
    assert (row.accesses, row.hits) == (sum(LOOKUPS[:first]), sum(HITS_UNBOUNDED[:first]))
    assert (row.block_tokens, row.requests) == (256, first)


def test_hand_counted_lru_hits_in_a_pool_of_four_blocks(tiny):
    # LRU order after R0: 10 11 20 21. R1 hits 10 11 20 21 (order 10 11 20 21), then 30
    # evicts 10. R2: 10 misses (evicts 11), 11 misses (evicts 20). Counted: 4 hits of 10.
    trace = read_replay_trace(tiny, block_tokens=256, max_requests=3)
    assert trace.accesses.requests()[0] == trace.accesses.requests()[1][:4]
    rows = replay_table(trace, {"lru": "lru", "fifo": "fifo"}, [4], progress=False)
    assert [(r.policy, r.accesses, r.hits) for r in rows] == [("lru", 10, 4), ("fifo", 10, 4)]


def test_trace_blocks_with_max_requests_take_the_first_in_arrival_order(tiny):
    assert read_trace(tiny, max_requests=3).requests() == [[1, 2], [1, 2, 3], [1, 9]]
    trace = read_replay_trace(tiny, max_requests=3)
    (row,) = replay_table(trace, {"lru": "lru"}, [100], progress=False)
    assert (row.accesses, row.hits, row.block_tokens, row.requests) == (7, 3, None, 3)


def engine_requests(path: Path, first: int, block_tokens: int):
    spec = {"kind": "trace", "format": "mooncake", "path": str(path), "max_requests": first,
            "on_unsorted": "sort"}  # fmt: skip
    config = build_config({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": spec}, "<t>")
    return build_requests(config.workload, 0, path.parent, block_tokens)


def test_keys_are_the_engines_block_hashes_and_lookups_its_lookup_limit(tiny):
    trace = read_replay_trace(tiny, block_tokens=256, max_requests=4)
    requests = engine_requests(tiny, 4, 256)
    assert requests.prefix_hashes is not None
    # by hand (module comment): 10 11 20 21 | 10 11 20 21 30 | 10 11 | 50 51 R3's R3's
    assert trace.accesses.requests() == [[0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1], [5, 6, 7, 8]]
    hashes = np.concatenate(requests.prefix_hashes).tolist()
    keys = trace.accesses.keys.tolist()
    assert len(keys) == len(hashes)  # one key per engine block, in the same places
    assert len(set(zip(keys, hashes, strict=True))) == len(set(keys)) == len(set(hashes))
    assert list(dict.fromkeys(keys)) == list(range(len(set(keys))))  # numbered as first seen
    engine_order = np.split(np.asarray(hashes), trace.accesses.starts[1:])
    assert [len(h) for h in engine_order] == [len(r) for r in trace.accesses.requests()]
    assert trace.accesses.times.tolist() == requests.arrival_s.tolist()
    assert trace.counted is not None
    counted = np.split(trace.counted, trace.accesses.starts[1:])
    assert [int(c.sum()) for c in counted] == LOOKUPS[:4]
    assert all(c[: int(c.sum())].all() for c in counted)  # the leading blocks count


def test_block_tokens_must_divide_the_trace_block(tiny):
    with pytest.raises(KvsimError, match=r"--block-tokens 48: expected a divisor of the 512"):
        read_replay_trace(tiny, block_tokens=48)
    with pytest.raises(KvsimError, match=r"--max-requests 0: expected an integer >= 1"):
        read_replay_trace(tiny, max_requests=0)


def test_command_writes_engine_units_to_the_csv(tiny, tmp_path, capsys):
    out = tmp_path / "hits.csv"
    argv = ["replay", str(tiny), "--block-tokens", "256", "--max-requests", "3",
            "--capacities", "4,1000", "--policies", "lru,opt", "--jobs", "1", "--quiet",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "3 requests, 10 accesses of 256-token engine blocks" in printed
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["policy"], r["capacity_blocks"], r["accesses"], r["hits"], r["block_tokens"],
             r["requests"]) for r in rows] == [
        ("lru", "4", "10", "4", "256", "3"), ("lru", "1000", "10", "6", "256", "3"),
        ("opt", "4", "10", "6", "256", "3"), ("opt", "1000", "10", "6", "256", "3"),
    ]  # fmt: skip
    # OPT at 4: 30 evicts 20 or 21 (never used again), so R2 hits 10 and 11 as with room.


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--block-tokens", "0"], "argument --block-tokens: '0': expected an integer >= 1"),
        (["--max-requests", "x"], "argument --max-requests: 'x': expected an integer >= 1"),
        (["--block-tokens", "100"], "--block-tokens 100: expected a divisor of the 512"),
    ],
)
def test_command_refuses_bad_units(tiny, capsys, flags, message):
    argv = ["replay", str(tiny), "--capacities", "4", "--quiet", "--jobs", "1", *flags]
    assert exit_status(argv) == 2
    assert message in capsys.readouterr().err


def exit_status(argv: list[str]) -> int:
    """``kvsim ARGV``'s exit status, argparse's refusals (SystemExit) included."""
    try:
        return main(argv)
    except SystemExit as stop:
        return int(stop.code or 0)


# The engine on the first Mooncake conversation requests: one request at a time (each
# prompt's blocks are registered before the next request looks up), a pool that never fills.
FIRST = 100


def engine_run(path: Path, max_num_seqs: int):
    workload = {"kind": "trace", "format": "mooncake", "path": str(path), "max_requests": FIRST}
    engine = {"max_num_seqs": max_num_seqs, "max_batched_tokens": 8192, "block_tokens": 16}
    data = {"model": "llama-3-8b", "hardware": "h200-sxm", "workload": workload,
            "engine": engine, "kv": {"mode": "hbm", "dtype": "fp8", "eviction": "lru"}}  # fmt: skip
    config = build_config(data, "<test>")
    result = simulate(config)
    timeline = result.timeline
    assert result.summary["preemptions"] == 0
    assert result.summary["requests_finished"] == FIRST
    assert timeline.hbm_kv_bytes.max() < timeline.hbm_kv_pool_bytes.min()  # never full
    return result.summary


@pytest.fixture(scope="module")
def conversation_head():
    path = shared_trace(CONVERSATION)
    trace = read_replay_trace(path, block_tokens=16, max_requests=FIRST)
    room = len(np.unique(trace.accesses.keys))
    (row,) = replay_table(trace, {"lru": "lru"}, [room], progress=False)
    return path, row


def test_mooncake_replay_counts_the_engines_lookups_and_hits(conversation_head):
    path, row = conversation_head
    summary = engine_run(path, max_num_seqs=1)
    assert row.accesses == summary["prefix_lookup_blocks"]
    assert row.hits * 16 == summary["prefix_hit_tokens"]
    assert row.hits / row.accesses == pytest.approx(summary["hbm_hit_rate"])


def test_concurrent_requests_hit_less_than_the_replay_never_more(conversation_head):
    # A request admitted while another computes the same prefix misses the blocks not yet
    # written: the lookups are the same, the hits at most the replay's.
    path, row = conversation_head
    summary = engine_run(path, max_num_seqs=256)
    assert row.accesses == summary["prefix_lookup_blocks"]
    assert summary["prefix_hit_tokens"] <= row.hits * 16


def test_fused_loops_equal_the_generic_ones_on_engine_blocks():
    # Keys are non-negative (first-seen numbers), as the fused loops' sentinels need.
    trace = read_replay_trace(shared_trace(CONVERSATION), block_tokens=16, max_requests=20)
    assert trace.accesses.keys.min() == 0
    policies = {name: name for name in ("fifo", "lru", "lfu", "arc", "s3fifo", "sieve", "opt")}
    fused = replay_table(trace, policies, [500, 5000], progress=False)
    assert replay_table(trace, policies, [500, 5000], fast=False, progress=False) == fused
