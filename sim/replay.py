"""Fast cache replay: a trace's prompt blocks through one demand-cached pool, no engine.

An access is one prompt block of one request; requests are taken in arrival order (a
stable sort by timestamp, so ties keep file order), the first ``max_requests`` of them if
given (the engine's selection, :func:`sim.workload.trace.select_rows`). A hit means the
block was in the pool; a miss is always inserted, for every policy (OPT included: Belady's
MIN for demand caching).

Two units. By default a block is the trace's own (one Mooncake hash id, 512 tokens, the
partial last one included) and every access counts. With ``block_tokens`` a block is the
engine's: each trace block splits into engine blocks hashed by the workload's own code
(:func:`sim.workload.trace.block_hashes`; a key is a hash's number in order of first access,
as trace ids are), a request accesses its prompt's full blocks,
and only those the engine looks up count (its full blocks but the last token,
``(prompt - 1) // block_tokens``, as ``PrefixIndex.lookup_blocks``): the last full block of
a prompt that fills it exactly is written to the pool, never looked up.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from policies import AccessTrace, make_eviction, replay
from policies.registry import Spec, split_spec
from sim.config.workload import TraceSource
from sim.errors import KvsimError
from sim.workload.hashing import offsets_of
from sim.workload.trace import Selection, block_hashes, resolve_trace_path, select_rows
from sim.workload.tracefile import LAYOUTS
from sim.workload.tracetable import TraceTable
from sim.workload.tracetable import read_trace as read_table

FORMATS = ("mooncake",)
CSV_COLUMNS = (
    "policy", "capacity_blocks", "accesses", "hits", "hit_rate", "block_tokens", "requests",
)  # fmt: skip


@dataclass(frozen=True)
class ReplayRow:
    """Hits of one policy at one capacity; ``block_tokens`` None: the trace's own blocks."""

    policy: str
    capacity_blocks: int
    accesses: int
    hits: int
    block_tokens: int | None = None
    requests: int = 0

    @property
    def hit_rate(self) -> float:
        """hits / accesses (0 for an empty trace)."""
        return self.hits / self.accesses if self.accesses else 0.0


@dataclass(frozen=True)
class ReplayTrace:
    """What a replay runs: every access (the pool sees them all) and which ones count.

    Attributes:
        accesses: the block keys, grouped in requests, in arrival order.
        counted: per access, whether its hit or miss counts (None: every access counts).
        block_tokens: tokens per block (None: the trace's own blocks).
    """

    accesses: AccessTrace
    counted: np.ndarray | None = None
    block_tokens: int | None = None

    @property
    def requests(self) -> int:
        """Requests replayed."""
        return len(self.accesses.starts)

    @property
    def lookups(self) -> int:
        """Accesses that count (the hit rate's denominator)."""
        if self.counted is None:
            return len(self.accesses.keys)
        return int(self.counted.sum())

    def counted_hits(self, mask: np.ndarray) -> int:
        """Counted hits of a replay's hit mask."""
        return int(mask.sum() if self.counted is None else mask[self.counted].sum())


def select_trace(
    path: str | Path, fmt: str = "mooncake", max_requests: int | None = None
) -> Selection:
    """The trace's rows in arrival order, the first ``max_requests`` (the engine's selection)."""
    if fmt not in FORMATS:
        expected = ", ".join(FORMATS)
        raise KvsimError(f"trace format '{fmt}' is not supported by replay; expected {expected}")
    if max_requests is not None and max_requests < 1:
        raise KvsimError(f"--max-requests {max_requests}: expected an integer >= 1")
    table = read_table(resolve_trace_path(str(path), Path("."), key="trace"), LAYOUTS[fmt], False)
    source = TraceSource.model_validate(
        {"format": fmt, "path": str(path), "max_requests": max_requests, "on_unsorted": "sort"}
    )
    return select_rows(table, source, seed=0, key="trace")


def read_replay_trace(
    path: str | Path,
    fmt: str = "mooncake",
    *,
    block_tokens: int | None = None,
    max_requests: int | None = None,
) -> ReplayTrace:
    """A trace's accesses in trace blocks, or in engine blocks of ``block_tokens`` tokens."""
    selection = select_trace(path, fmt, max_requests)
    table, times = selection.table, selection.arrival_s
    assert table.hash_ids is not None and table.hash_offsets is not None
    if block_tokens is None:
        starts = table.hash_offsets[:-1].astype(np.int64)
        return ReplayTrace(AccessTrace(table.hash_ids.astype(np.int64), starts, times))
    return _engine_blocks(table, times, block_tokens)


def _engine_blocks(table: TraceTable, times: np.ndarray, block_tokens: int) -> ReplayTrace:
    """Engine-block accesses: each prompt's full blocks; its lookup blocks count."""
    trace_block = table.hash_block_tokens
    assert trace_block is not None
    if block_tokens < 1 or trace_block % block_tokens:
        raise KvsimError(
            f"--block-tokens {block_tokens}: expected a divisor of the {trace_block}-token "
            f"blocks of {table.path} (16, 32, 64 ...), as engine.block_tokens must be"
        )
    hashes = block_hashes(table, block_tokens)
    assert hashes is not None
    blocks = np.array([len(h) for h in hashes], dtype=np.int64)  # prompt // block_tokens
    lookups = np.minimum(blocks, (table.prompt_tokens - 1) // block_tokens)
    offsets = offsets_of(blocks)
    rows = np.repeat(np.arange(len(blocks)), blocks)
    counted = np.arange(offsets[-1]) - offsets[rows] < lookups[rows]
    flat = np.concatenate(hashes) if len(hashes) else np.zeros(0, np.uint64)
    accesses = AccessTrace(first_seen_ids(flat), offsets[:-1], times)
    return ReplayTrace(accesses, counted, block_tokens)


def first_seen_ids(hashes: np.ndarray) -> np.ndarray:
    """Each hash as the number of distinct hashes seen before its first access (0, 1, ...).

    NOTE: policies take non-negative int keys (the fused loops use -1 as a sentinel), and a
    64-bit hash is negative as an int64 half the time; equal hashes keep equal keys.
    """
    unique, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    rank = np.empty(len(unique), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(unique))
    return rank[inverse.reshape(-1)]


def read_trace(
    path: str | Path, fmt: str = "mooncake", max_requests: int | None = None
) -> AccessTrace:
    """A trace's prompt-block accesses (trace blocks) in arrival order."""
    return read_replay_trace(path, fmt, max_requests=max_requests).accesses


def build_policy(spec: Spec, capacity: int, trace: AccessTrace, seed: int = 0) -> Any:
    """The policy for one replay; registry errors become ``KvsimError``."""
    try:
        return make_eviction(
            spec, capacity=capacity, future=trace.keys, rng=np.random.default_rng(seed)
        )
    except ValueError as error:
        raise KvsimError(str(error)) from None


_TRACE: ReplayTrace | None = None  # the trace a worker process replays


def _init_worker(trace: ReplayTrace) -> None:
    global _TRACE
    _TRACE = trace


def _count_hits(spec: Spec, capacity: int, fast: bool, seed: int) -> int:
    assert _TRACE is not None
    accesses = _TRACE.accesses
    policy = build_policy(spec, capacity, accesses, seed)
    return _TRACE.counted_hits(replay(policy, accesses, capacity, fast=fast))


def replay_table(
    trace: AccessTrace | ReplayTrace,
    policies: dict[str, Spec],
    capacities: Sequence[int],
    *,
    jobs: int = 1,
    fast: bool = True,
    seed: int = 0,
    progress: bool = True,
) -> list[ReplayRow]:
    """One row per (policy, capacity), in the order given; ``jobs`` processes share the work."""
    if isinstance(trace, AccessTrace):
        trace = ReplayTrace(trace)
    for spec in policies.values():
        build_policy(spec, max(capacities), trace.accesses, seed)  # fail fast on a bad spec
    tasks = [(label, cap) for label in policies for cap in capacities]
    accesses = len(trace.accesses.keys)
    hits: dict[tuple[str, int], int] = {}
    bar = tqdm(total=accesses * len(tasks), unit="acc", unit_scale=True, disable=not progress)
    with bar:
        if jobs <= 1:
            _init_worker(trace)
            for label, cap in tasks:
                bar.set_postfix_str(f"{label}@{cap}")
                hits[label, cap] = _count_hits(policies[label], cap, fast, seed)
                bar.update(accesses)
        else:
            with ProcessPoolExecutor(jobs, initializer=_init_worker, initargs=(trace,)) as pool:
                futures = {
                    pool.submit(_count_hits, policies[label], cap, fast, seed): (label, cap)
                    for label, cap in tasks
                }
                for future in as_completed(futures):
                    hits[futures[future]] = future.result()
                    bar.update(accesses)
    return [
        ReplayRow(label, cap, trace.lookups, hits[label, cap], trace.block_tokens, trace.requests)
        for label, cap in tasks
    ]


def write_csv(rows: Sequence[ReplayRow], path: Path) -> None:
    """Write the rows with the columns ``CSV_COLUMNS`` (block_tokens empty: trace blocks)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            writer.writerow(
                [row.policy, row.capacity_blocks, row.accesses, row.hits, f"{row.hit_rate:.6f}",
                 "" if row.block_tokens is None else row.block_tokens, row.requests]
            )  # fmt: skip


def format_table(rows: Sequence[ReplayRow]) -> str:
    """Hit rates as a policy x capacity text table."""
    capacities = list(dict.fromkeys(r.capacity_blocks for r in rows))
    labels = list(dict.fromkeys(r.policy for r in rows))
    rate = {(r.policy, r.capacity_blocks): r.hit_rate for r in rows}
    width = max(len("policy"), *(len(label) for label in labels))
    head = f"{'policy':<{width}}" + "".join(f"{c:>10}" for c in capacities)
    body = [
        f"{label:<{width}}" + "".join(f"{rate[label, c]:>10.4f}" for c in capacities)
        for label in labels
    ]
    return "\n".join([head, *body])


def parse_policies(names: str, params: Sequence[str]) -> dict[str, Spec]:
    """``lru,s3fifo`` plus ``--param s3fifo.small_fraction=0.2`` into labelled specs."""
    labels = [n.strip() for n in names.split(",") if n.strip()]
    if not labels:
        raise KvsimError("--policies: expected a comma-separated list of policy names")
    specs: dict[str, dict[str, Any]] = {label: {"name": label} for label in labels}
    for item in params:
        target, sep, value = item.partition("=")
        label, dot, key = target.rpartition(".")
        if not sep or not dot or label not in specs:
            raise KvsimError(
                f"--param {item!r}: expected POLICY.KEY=VALUE with POLICY one of {labels}"
            )
        specs[label][key.strip()] = _parse_value(value.strip())
    return {label: spec if len(spec) > 1 else split_spec(spec)[0] for label, spec in specs.items()}


def _parse_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    converters: tuple[Callable[[str], Any], ...] = (int, float)
    for convert in converters:
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def parse_capacities(text: str) -> list[int]:
    """``1000,10000`` into positive ints, with a clear error."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise KvsimError(f"--capacities {text!r}: expected a comma-separated list of integers >= 1")
    return values
