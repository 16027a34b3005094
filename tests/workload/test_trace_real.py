"""The real traces in ../shared/traces: loaders agree with plain-Python readings of the files."""

from __future__ import annotations

import csv
import json
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from sim.workload.trace import load_source
from sim.workload.tracestats import trace_stats
from tests.workload.workload_helpers import build, percentile, workload

MOONCAKE = ("mooncake_fast25_conversation_trace.jsonl", "mooncake_fast25_synthetic_trace.jsonl")
AZURE = ("azure_llm_2023_conv.csv", "azure_llm_2023_code.csv")
README_ROWS = {
    "mooncake_fast25_conversation_trace.jsonl": 12031,
    "mooncake_fast25_synthetic_trace.jsonl": 3993,
    "azure_llm_2023_conv.csv": 19366,
    "azure_llm_2023_code.csv": 8819,
}


def plain_mooncake(path: Path) -> dict:
    """Stats of a Mooncake file from json.loads per line, lists and a set."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    times = [r["timestamp"] / 1000 for r in rows]
    seen: set[int] = set()
    references = repeated = 0
    for row in sorted(rows, key=lambda r: r["timestamp"]):  # stable: ties keep file order
        for block in dict.fromkeys(row["hash_ids"]):
            references += 1
            repeated += block in seen
        seen.update(row["hash_ids"])
    return _summary(
        times, [r["input_length"] for r in rows], [r["output_length"] for r in rows]
    ) | {"repeated_block_fraction": repeated / references}


def _seconds(text: str) -> Decimal:
    """An Azure TIMESTAMP (100 ns digits) as exact seconds since the epoch."""
    whole, _, fraction = text.partition(".")
    return Decimal(int(datetime.fromisoformat(whole).timestamp())) + Decimal(f"0.{fraction}")


def plain_azure(path: Path) -> dict:
    """Stats of an Azure CSV from the csv module and exact decimal times."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    times = [_seconds(r["TIMESTAMP"]) for r in rows]
    prompt = [int(r["ContextTokens"]) for r in rows]
    output = [int(r["GeneratedTokens"]) for r in rows]
    origin = min(times)
    return _summary([float(t - origin) for t in times], prompt, output) | {
        "repeated_block_fraction": None
    }


def _summary(times: list[float], prompt: list[int], output: list[int]) -> dict:
    duration = max(times) - min(times)
    return {
        "requests": len(prompt),
        "duration_s": duration,
        "arrival_rate_per_s": len(prompt) / duration,
        "input_mean": sum(prompt) / len(prompt),
        "input_p50": percentile(prompt, 50),
        "input_p99": percentile(prompt, 99),
        "output_mean": sum(output) / len(output),
        "output_p50": percentile(output, 50),
        "output_p99": percentile(output, 99),
    }


def read(traces_dir: Path, name: str, fmt: str):
    """The loader's table of a shared trace."""
    return load_source(workload({"kind": "trace", "format": fmt, "path": name}), traces_dir)


@pytest.mark.parametrize(
    ("name", "fmt", "plain"),
    [(n, "mooncake", plain_mooncake) for n in MOONCAKE]
    + [(n, "azure", plain_azure) for n in AZURE],
)
def test_stats_match_plain_python(traces_dir: Path, name: str, fmt: str, plain) -> None:
    expected = plain(traces_dir / name)
    got = trace_stats(read(traces_dir, name, fmt))
    assert got["requests"] == expected["requests"] == README_ROWS[name]
    for key, value in expected.items():
        if value is None:
            assert got[key] is None, key
        else:
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-6), key


def test_readme_figures(traces_dir: Path) -> None:
    """The figures the traces README states (rounded there)."""
    conversation = trace_stats(read(traces_dir, MOONCAKE[0], "mooncake"))
    synthetic = trace_stats(read(traces_dir, MOONCAKE[1], "mooncake"))
    assert round(conversation["repeated_block_fraction"], 4) == 0.3664
    assert round(synthetic["repeated_block_fraction"], 4) == 0.6396
    assert round(conversation["input_mean"]) == 12035 and conversation["input_p50"] == 6909


def test_mooncake_loads_every_row(traces_dir: Path) -> None:
    # load time is measured in benchmarks/trace_load_bench.py, not asserted here
    spec = {"kind": "trace", "format": "mooncake", "path": MOONCAKE[0]}
    assert len(build(spec, traces_dir, block_tokens=16)) == 12031


def test_mooncake_block_mapping_on_real_trace(traces_dir: Path) -> None:
    """Sub-block hashes partition exactly like (trace id, sub-block) pairs; 1:1 at 512."""
    raw = [json.loads(line) for line in (traces_dir / MOONCAKE[0]).read_text().splitlines()][:2000]
    spec = {"kind": "trace", "format": "mooncake", "path": MOONCAKE[0], "max_requests": 2000}
    for block_tokens in (64, 512):
        ratio = 512 // block_tokens
        requests = build(spec, traces_dir, block_tokens=block_tokens)
        pairs: dict[tuple[int, int], int] = {}
        hashes: dict[int, tuple[int, int]] = {}
        for row, got in zip(raw, requests.prefix_hashes, strict=True):
            assert len(got) == row["input_length"] // block_tokens
            for i, value in enumerate(got.tolist()):
                key = (row["hash_ids"][i // ratio], i % ratio)
                assert pairs.setdefault(key, value) == value
                assert hashes.setdefault(value, key) == key


def test_jitter_spreads_quantised_arrivals(traces_dir: Path) -> None:
    """The conversation trace's 3-s steps spread out with jitter_s: 3, order preserved."""
    spec = {"kind": "trace", "format": "mooncake", "path": MOONCAKE[0], "max_requests": 3000}
    plain = build(spec, traces_dir)
    jittered = build(spec | {"jitter_s": 3.0}, traces_dir)
    assert len(np.unique(plain.arrival_s)) < 400
    assert len(np.unique(jittered.arrival_s)) == 3000
    assert np.all(np.diff(jittered.arrival_s) >= 0)
    shift = jittered.arrival_s - plain.arrival_s  # both sorted: each moved by [0, 3)
    assert np.all(shift >= 0) and np.all(shift < 3.0)
    assert sorted(jittered.prompt_tokens.tolist()) == sorted(plain.prompt_tokens.tolist())
