"""Results stay bit-identical: a few small runs' output files against committed digests.

Each case runs one small config through ``simulate`` and ``write_run``, reads the files back
and hashes their contents: ``requests.parquet`` and ``timeline.parquet`` (column names,
dtypes and every value, via ``pd.util.hash_pandas_object``) and ``summary.json`` without
``wall_time_s``. The digests are compared with ``tests/data/golden_digests.json``.

Small copies of each case's outputs are kept beside the digests, in
``tests/data/golden/<case>/`` (``requests.parquet``, ``timeline.parquet``, ``summary.json``),
so that a mismatch says where: the frame, the column and the first differing row with both
values, or the summary's first differing key. A test checks that they hash to the digests.

A change that is *meant* to change results regenerates the golden files on purpose:

    KVSIM_REGEN_GOLDEN=1 python -m pytest -q tests/test_bit_identity.py
    # or: python -m tests.test_bit_identity            (every case)
    #     python -m tests.test_bit_identity CASE ...   (those cases; the others' entries stay)

and the diff of ``tests/data/golden_digests.json`` (and ``tests/data/golden/``) goes into the
same commit, with the reason. ``python -m tests.test_bit_identity --references-only [CASE ...]``
rewrites only reference outputs, of cases whose runs still give their golden digests.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sim.config import RunConfig, build_config
from sim.run import simulate
from sim.rundir import write_run
from tests.conftest import synthetic

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "golden_digests.json"
REFERENCE = DATA / "golden"  # <case>/requests.parquet, timeline.parquet, summary.json
FRAMES = ("requests", "timeline")
REGEN = os.environ.get("KVSIM_REGEN_GOLDEN") == "1"

# this file's own base (not conftest's, which other tests may change)
BASE = {
    "seed": 0,
    "model": "llama-3-8b",
    "hardware": "h100-sxm",
    "engine": {"max_num_seqs": 64, "max_batched_tokens": 4096},
    "kv": {"mode": "hbm"},
}


def make_config(*overrides: str, **sections: dict) -> RunConfig:
    """:data:`BASE` with whole sections replaced and ``--set``-style overrides."""
    data = copy.deepcopy(BASE)
    data.update(copy.deepcopy(sections))
    return build_config(data, "<bit-identity>", overrides)


def _lognormal(mean: float, sigma: float, low: int, high: int) -> dict:
    return {"kind": "lognormal", "mean": mean, "sigma": sigma, "min": low, "max": high}


def _multi_turn(
    sessions: int, rate: float = 2.0, think: str = "5s", max_context: int = 8192
) -> dict:
    return {
        "kind": "multi_turn",
        "num_sessions": sessions,
        "session_arrival": {"kind": "poisson", "rate": rate},
        "turns": _lognormal(4, 0.5, 1, 8),
        "think_time": {"kind": "exponential", "mean": think},
        "user_tokens": _lognormal(200, 0.8, 8, 1024),
        "output_tokens": _lognormal(120, 0.6, 4, 512),
        "system_prompt_tokens": 512,
        "system_prompts": 2,
        "max_context_tokens": max_context,
    }


_PROMPTS = _lognormal(1500, 0.7, 64, 6000)
_OUTPUTS = _lognormal(150, 0.6, 4, 600)

# name -> (overrides, sections); each runs in well under 3 s
CASES: dict[str, tuple[tuple[str, ...], dict]] = {
    "hbm_prefix_recompute": (
        ("engine.kv_pool_blocks=500", "engine.max_num_seqs=32"),
        {"workload": synthetic(60, _PROMPTS, _OUTPUTS, rate=20.0, shared=768)},
    ),
    "hbm_swap_preemption": (
        ("engine.kv_pool_blocks=700", "engine.preemption=swap", "kv.prefix_caching=false"),
        {"workload": synthetic(40, _PROMPTS, _OUTPUTS, rate=20.0)},
    ),
    # sessions share system prompts and earlier turns: a swapped-out request's prefix stays in
    # HBM for the running requests sharing it, and leaves when only swapped-out ones hold it
    "hbm_swap_prefix_caching": (
        ("engine.kv_pool_blocks=300", "engine.preemption=swap", "kv.prefix_caching=true"),
        {"workload": _multi_turn(15, rate=4.0, think="2s", max_context=4096)},
    ),
    "offload_s3fifo_multi_turn": (
        (
            "kv.mode=offload",
            "kv.eviction=s3fifo",
            "engine.kv_pool_blocks=1200",
            "kv.dram_capacity=2GiB",
            "kv.ssd_capacity=64GiB",
        ),
        {"workload": _multi_turn(25)},
    ),
    "offload_write_back_lru": (
        ("kv.mode=offload", "kv.write_policy=write_back", "engine.kv_pool_blocks=400"),
        {"workload": _multi_turn(15)},
    ),
    "dram_centric_sparse_layerwise": (
        (
            "kv.mode=dram_centric",
            "hardware.hbm.capacity=20GiB",
            "engine.max_num_seqs=16",
        ),
        {
            "workload": synthetic(24, _lognormal(4000, 0.5, 512, 12000), 120, shared=512),
            "kv": {
                "mode": "dram_centric",
                "access": {"kind": "sparse", "window_blocks": 8, "topk_blocks": 16},
                "layerwise": True,
            },
        },
    ),
    "dram_centric_full_write_back": (
        ("hardware.hbm.capacity=20GiB", "engine.max_num_seqs=16"),
        {
            "workload": synthetic(16, _lognormal(3000, 0.5, 256, 8000), 60),
            "kv": {"mode": "dram_centric", "layerwise": False, "write_policy": "write_back"},
        },
    ),
    "dram_centric_layer_events": (
        ("hardware.hbm.capacity=20GiB", "engine.max_num_seqs=8", "engine.layer_events=true"),
        {
            "workload": synthetic(8, 2000, 30),
            "kv": {"mode": "dram_centric", "access": {"kind": "sparse", "topk_blocks": 8}},
        },
    ),
}


@dataclass
class Outputs:
    """What a case's digests cover: its two frames as read back from the run directory and its
    summary without ``wall_time_s``."""

    requests: pd.DataFrame
    timeline: pd.DataFrame
    summary: dict[str, Any]

    def frame(self, name: str) -> pd.DataFrame:
        """The frame ``name`` (one of :data:`FRAMES`)."""
        return {"requests": self.requests, "timeline": self.timeline}[name]

    def digests(self) -> dict[str, Any]:
        """The golden file's entry for these outputs."""
        return {
            **{name: _frame_digest(self.frame(name)) for name in FRAMES},
            "summary": _summary_digest(self.summary),
            "steps": self.summary["steps"],
        }


def _frame_digest(frame: pd.DataFrame) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([[c, str(t)] for c, t in frame.dtypes.items()]).encode())
    h.update(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())
    return h.hexdigest()


def _summary_digest(summary: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest()


def run_case(name: str) -> Outputs:
    """Run case ``name``, write its run directory and read the compared files back."""
    overrides, sections = CASES[name]
    result = simulate(make_config(*overrides, **sections))
    with tempfile.TemporaryDirectory() as tmp:
        out = write_run(result, Path(tmp) / name)
        summary = json.loads((out / "summary.json").read_text())
        summary.pop("wall_time_s")
        frames = {frame: pd.read_parquet(out / f"{frame}.parquet") for frame in FRAMES}
        return Outputs(**frames, summary=summary)


def run_digests(name: str) -> dict[str, Any]:
    """Run case ``name`` and hash its outputs."""
    return run_case(name).digests()


# --- reference outputs ------------------------------------------------------------------------


def write_reference(name: str, outputs: Outputs) -> None:
    """Store ``outputs`` as case ``name``'s reference (compressed parquet, sorted JSON)."""
    folder = REFERENCE / name
    folder.mkdir(parents=True, exist_ok=True)
    for frame in FRAMES:
        path = folder / f"{frame}.parquet"
        outputs.frame(frame).to_parquet(path, index=False, compression="zstd", compression_level=19)
    (folder / "summary.json").write_text(json.dumps(outputs.summary, indent=1, sort_keys=True))
    stored = read_reference(name).digests()
    assert stored == outputs.digests(), f"{name}: the stored reference does not read back equal"


def read_reference(name: str) -> Outputs:
    """Case ``name``'s stored reference outputs."""
    folder = REFERENCE / name
    frames = {frame: pd.read_parquet(folder / f"{frame}.parquet") for frame in FRAMES}
    return Outputs(**frames, summary=json.loads((folder / "summary.json").read_text()))


def _value(x: Any) -> Any:
    return x.item() if isinstance(x, np.generic) else x


def _row_hashes(column: pd.Series) -> np.ndarray:
    """Each value's hash, as the frame digest sees it (NaN equals NaN there, as -0.0 does 0.0)."""
    return pd.util.hash_pandas_object(column, index=False).to_numpy()


def describe_frame_mismatch(frame: str, expected: pd.DataFrame, actual: pd.DataFrame) -> str | None:
    """Where ``actual`` first differs from ``expected`` in what the digest covers (column
    names and order, dtypes, values, index): the column and the first differing row with
    both values, in one readable message; None where they agree."""
    want, got = list(expected.columns), list(actual.columns)
    missing = [c for c in want if c not in got]
    extra = [c for c in got if c not in want]
    if missing or extra:
        return f"{frame}: columns differ: missing {missing}, unexpected {extra}"
    if want != got:
        i = next(i for i, (w, g) in enumerate(zip(want, got, strict=True)) if w != g)
        return (
            f"{frame}: column order differs at position {i}: expected {want[i]!r}, got {got[i]!r}"
        )
    for c in want:
        dtypes = expected[c].dtype, actual[c].dtype
        if str(dtypes[0]) != str(dtypes[1]):
            return f"{frame}: column {c!r}: dtype expected {dtypes[0]}, actual {dtypes[1]}"
    rows = min(len(expected), len(actual))
    first: dict[str, np.ndarray] = {}  # column -> its differing rows
    for c in want:
        diff = _row_hashes(expected[c].iloc[:rows]) != _row_hashes(actual[c].iloc[:rows])
        if diff.any():
            first[c] = np.flatnonzero(diff)
    if first:
        column = min(first, key=lambda c: first[c][0])  # the earliest row; then column order
        row = int(first[column][0])
        want_value, got_value = (_value(f[column].iloc[row]) for f in (expected, actual))
        others = [c for c in first if c != column]
        return (
            f"{frame}: column {column!r}, row {row}: expected {want_value!r},"
            f" actual {got_value!r} ({len(first[column])} of {rows} rows"
            f" differ in {column!r}; other columns differing: {others or 'none'};"
            f" rows {len(expected)} expected, {len(actual)} actual)"
        )
    if len(expected) != len(actual):
        return (
            f"{frame}: {len(expected)} rows expected, {len(actual)} actual (the first {rows} agree)"
        )
    if not expected.index.equals(actual.index) or expected.index.dtype != actual.index.dtype:
        return f"{frame}: index differs: expected {expected.index!r}, actual {actual.index!r}"
    return None


def describe_summary_mismatch(
    expected: dict[str, Any], actual: dict[str, Any], path: str = ""
) -> str | None:
    """The first key (in sorted order, nested keys dotted) where the summaries differ, with
    both values; None where they agree. Values compare as JSON, as the digest does."""
    for key in sorted(expected.keys() | actual.keys()):
        where = f"{path}{key}"
        if key not in actual:
            return f"summary: key {where!r} missing (expected {expected[key]!r})"
        if key not in expected:
            return f"summary: unexpected key {where!r} (actual {actual[key]!r})"
        want, got = expected[key], actual[key]
        if isinstance(want, dict) and isinstance(got, dict):
            found = describe_summary_mismatch(want, got, f"{where}.")
            if found:
                return found
        elif json.dumps(want, sort_keys=True) != json.dumps(got, sort_keys=True):
            return f"summary: key {where!r}: expected {want!r}, actual {got!r}"
    return None


def explain_mismatch(name: str, outputs: Outputs, golden: dict[str, Any]) -> str:
    """Why case ``name``'s ``outputs`` miss its golden digests, part by part, against its
    stored reference."""
    lines = [f"{name}: outputs differ from the golden digests"]
    got = outputs.digests()
    folder = REFERENCE / name
    reference = read_reference(name) if folder.is_dir() else None
    for part in (*FRAMES, "summary"):
        if got[part] == golden[part]:
            continue
        if reference is None:
            lines.append(f"{part}: digest differs; no reference outputs in {folder} to say where")
        elif reference.digests()[part] != golden[part]:
            lines.append(f"{part}: digest differs; the stored reference misses the digest too")
        elif part == "summary":
            found = describe_summary_mismatch(reference.summary, outputs.summary)
            lines.append(found or "summary: digest differs, yet no difference found")
        else:
            found = describe_frame_mismatch(part, reference.frame(part), outputs.frame(part))
            lines.append(found or f"{part}: digest differs, yet no difference found")
    if got["steps"] != golden["steps"]:
        lines.append(f"steps: expected {golden['steps']}, actual {got['steps']}")
    return "\n".join(lines)


# --- regenerating -----------------------------------------------------------------------------


def _load_golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


def _write_golden(golden: dict[str, Any]) -> None:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n")


def regenerate(names: Sequence[str] | None = None) -> dict[str, Any]:
    """Rerun cases ``names`` (default: every case, dropping entries and references of cases
    gone), writing their digests and reference outputs; other cases' entries stay as they are.
    """
    golden = _load_golden() if names is not None else {}
    if names is None:
        names = list(CASES)
        for stale in REFERENCE.iterdir() if REFERENCE.is_dir() else ():
            if stale.is_dir() and stale.name not in CASES:
                shutil.rmtree(stale)
    for name in names:
        outputs = run_case(name)
        write_reference(name, outputs)
        golden[name] = outputs.digests()
    _write_golden(golden)
    return golden


def write_references(names: Sequence[str] | None = None) -> None:
    """Write the reference outputs of cases ``names`` (default: those with golden digests)
    whose runs still give their golden digests, leaving the golden file untouched; refuse
    any other case."""
    golden = _load_golden()
    for name in names or [name for name in CASES if name in golden]:
        outputs = run_case(name)
        if outputs.digests() != golden.get(name):
            raise SystemExit(f"{name}: the run misses its golden digests; regenerate it instead")
        write_reference(name, outputs)


# --- the tests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    if REGEN:
        return regenerate()
    return _load_golden()


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_match_golden_digests(name: str, golden: dict[str, Any]) -> None:
    assert name in golden, f"{name} has no golden digest: regenerate (see module docstring)"
    outputs = run_case(name)
    if outputs.digests() != golden[name]:
        pytest.fail(explain_mismatch(name, outputs, golden[name]), pytrace=False)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_outputs_hash_to_the_golden_digests(name: str, golden: dict[str, Any]) -> None:
    """The stored reference outputs and the digests cannot drift apart."""
    assert read_reference(name).digests() == golden[name]


def test_every_golden_case_still_exists(golden: dict[str, Any]) -> None:
    assert sorted(golden) == sorted(CASES)
    assert sorted(p.name for p in REFERENCE.iterdir()) == sorted(CASES)


def test_the_swap_prefix_case_swaps_and_hits_the_prefix_cache() -> None:
    """The case guards swap preemption *with* prefix caching: both must really happen."""
    summary = read_reference("hbm_swap_prefix_caching").summary
    assert summary["swaps"] > 0
    assert summary["prefix_hit_tokens"] > 0


def test_a_mismatch_says_where_against_the_stored_reference(golden: dict[str, Any]) -> None:
    name = "hbm_swap_prefix_caching"
    outputs = read_reference(name)
    outputs.timeline.loc[100, "stall_s"] += 1e-9
    outputs.summary["swaps"] += 1
    message = explain_mismatch(name, outputs, golden[name])
    assert "timeline: column 'stall_s', row 100: expected" in message
    assert f"summary: key 'swaps': expected {outputs.summary['swaps'] - 1}" in message
    assert "requests:" not in message


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    expected = pd.DataFrame(
        {"id": [0, 1, 2, 3], "finish_s": [1.0, 2.0, 3.0, 4.0], "kind": ["a", "b", "c", "d"]}
    )
    return expected, expected.copy()


def test_frame_mismatch_names_the_column_row_and_values() -> None:
    expected, actual = _frames()
    assert describe_frame_mismatch("requests", expected, actual) is None
    actual.loc[2, "finish_s"] = 3.5
    message = describe_frame_mismatch("requests", expected, actual)
    assert message is not None
    assert "requests" in message and "'finish_s'" in message and "row 2" in message
    assert "expected 3.0" in message and "actual 3.5" in message
    actual.loc[1, "kind"] = "z"  # an earlier row, in another column: reported first
    message = describe_frame_mismatch("requests", expected, actual) or ""
    assert "'kind', row 1" in message and "'b'" in message and "'z'" in message
    assert "'finish_s'" in message  # among the other columns differing


def test_frame_mismatch_names_a_dtype_change_a_missing_column_and_a_length() -> None:
    expected, actual = _frames()
    actual["id"] = actual["id"].astype("float64")  # the same values, another dtype
    message = describe_frame_mismatch("timeline", expected, actual) or ""
    assert "timeline" in message and "'id'" in message
    assert "int64" in message and "float64" in message
    message = describe_frame_mismatch("timeline", expected, expected.drop(columns="kind")) or ""
    assert "missing ['kind']" in message
    message = describe_frame_mismatch("timeline", expected, expected.iloc[:3]) or ""
    assert "4 rows expected, 3 actual" in message
    actual = expected.copy()
    actual.loc[0, "finish_s"] = 1.0 + 2**-52  # one unit in the last place
    message = describe_frame_mismatch("timeline", expected, actual) or ""
    assert "row 0" in message and "1.0000000000000002" in message  # full precision


def test_summary_mismatch_names_the_first_differing_key() -> None:
    expected = {"steps": 10, "swaps": 2, "tiers": {"dram": 1.0, "hbm": 0.5}}
    assert describe_summary_mismatch(expected, copy.deepcopy(expected)) is None
    actual = copy.deepcopy(expected)
    actual["tiers"]["hbm"] = 0.25
    actual["swaps"] = 3
    message = describe_summary_mismatch(expected, actual) or ""
    assert "'swaps'" in message and "expected 2" in message and "actual 3" in message
    del actual["swaps"]
    assert "'swaps' missing" in (describe_summary_mismatch(expected, actual) or "")
    actual["swaps"] = 2
    message = describe_summary_mismatch(expected, actual) or ""
    assert "'tiers.hbm'" in message and "0.5" in message and "0.25" in message
    assert "'steps'" in (describe_summary_mismatch(expected, {**expected, "steps": 10.0}) or "")


def main(argv: Sequence[str] | None = None) -> None:
    """Regenerate golden digests and reference outputs (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m tests.test_bit_identity")
    parser.add_argument("cases", nargs="*", metavar="CASE", help="default: every case")
    parser.add_argument("--references-only", action="store_true")
    args = parser.parse_args(argv)
    if unknown := sorted(set(args.cases) - set(CASES)):
        parser.error(f"unknown cases {unknown}; the cases: {sorted(CASES)}")
    names = args.cases or None
    if args.references_only:
        write_references(names)
        print(f"wrote reference outputs under {REFERENCE}")
        return
    golden = regenerate(names)
    for case in names or golden:
        print(f"{case:32s} steps={golden[case]['steps']}")
    print(f"wrote {GOLDEN} and {REFERENCE}")


if __name__ == "__main__":
    main()
