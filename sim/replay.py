"""Fast cache replay: a trace's prompt blocks through one demand-cached pool, no engine.

An access is one prompt block of one request; requests are taken in arrival order (a
stable sort by timestamp, so ties keep file order) at the trace's own block granularity
(one Mooncake hash id is one block). A hit means the block was in the pool; a miss is
always inserted, for every policy (OPT included: Belady's MIN for demand caching).
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
from sim.errors import KvsimError
from sim.workload.trace import resolve_trace_path
from sim.workload.tracefile import LAYOUTS
from sim.workload.tracetable import read_trace as read_table

FORMATS = ("mooncake",)
CSV_COLUMNS = ("policy", "capacity_blocks", "accesses", "hits", "hit_rate")


@dataclass(frozen=True)
class ReplayRow:
    """Hits of one policy at one capacity."""

    policy: str
    capacity_blocks: int
    accesses: int
    hits: int

    @property
    def hit_rate(self) -> float:
        """hits / accesses (0 for an empty trace)."""
        return self.hits / self.accesses if self.accesses else 0.0


def read_trace(path: str | Path, fmt: str = "mooncake") -> AccessTrace:
    """A trace's prompt-block accesses in arrival order (the workload's reader and checks)."""
    if fmt not in FORMATS:
        expected = ", ".join(FORMATS)
        raise KvsimError(f"trace format '{fmt}' is not supported by replay; expected {expected}")
    table = read_table(resolve_trace_path(str(path), Path("."), key="trace"), LAYOUTS[fmt], False)
    assert table.hash_ids is not None and table.hash_offsets is not None
    order = np.argsort(table.arrival_s, kind="stable").tolist()
    ids, offsets = table.hash_ids, table.hash_offsets.tolist()
    requests = [ids[offsets[i] : offsets[i + 1]].tolist() for i in order]
    return AccessTrace.from_requests(requests, table.arrival_s[order].tolist())


def build_policy(spec: Spec, capacity: int, trace: AccessTrace, seed: int = 0) -> Any:
    """The policy for one replay; registry errors become ``KvsimError``."""
    try:
        return make_eviction(
            spec, capacity=capacity, future=trace.keys, rng=np.random.default_rng(seed)
        )
    except ValueError as error:
        raise KvsimError(str(error)) from None


_TRACE: AccessTrace | None = None  # the trace a worker process replays


def _init_worker(trace: AccessTrace) -> None:
    global _TRACE
    _TRACE = trace


def _count_hits(spec: Spec, capacity: int, fast: bool, seed: int) -> int:
    assert _TRACE is not None
    policy = build_policy(spec, capacity, _TRACE, seed)
    return int(replay(policy, _TRACE, capacity, fast=fast).sum())


def replay_table(
    trace: AccessTrace,
    policies: dict[str, Spec],
    capacities: Sequence[int],
    *,
    jobs: int = 1,
    fast: bool = True,
    seed: int = 0,
    progress: bool = True,
) -> list[ReplayRow]:
    """One row per (policy, capacity), in the order given; ``jobs`` processes share the work."""
    for spec in policies.values():
        build_policy(spec, max(capacities), trace, seed)  # fail fast on a bad spec
    tasks = [(label, cap) for label in policies for cap in capacities]
    accesses = len(trace.keys)
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
    return [ReplayRow(label, cap, accesses, hits[label, cap]) for label, cap in tasks]


def write_csv(rows: Sequence[ReplayRow], path: Path) -> None:
    """Write the rows with the columns ``CSV_COLUMNS``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            writer.writerow(
                [row.policy, row.capacity_blocks, row.accesses, row.hits, f"{row.hit_rate:.6f}"]
            )


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
