"""Trace workloads: find the file, read it, select rows, and map prefix ids to blocks.

Selection, in this order: ``filter`` (raw column values), ``time_window`` (seconds since
the file's first timestamp, start inclusive, end exclusive), ``sample`` (each file row kept
with probability ``fraction``), a stable sort by time, ``max_requests`` (the first N).
Arrivals then start from the window's start (or the trace's first timestamp), get
``jitter_s`` of uniform noise (trace seconds), and are divided by ``rate_scale``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.config.workload import TraceSource, TraceWorkload
from sim.errors import ConfigError, KvsimError
from sim.workload import hashing
from sim.workload.context import WorkloadContext, spawn_generators
from sim.workload.rawcolumns import isin
from sim.workload.requests import LoadReport, Requests
from sim.workload.tracefile import layout_of
from sim.workload.tracetable import TraceTable, read_trace

TRACES_ENV = "KVSIM_TRACES"
SELECTION_STREAM = 0x7472_6163  # "trac": selection draws never share a stream with generators


def traces_root() -> Path | None:
    """``$KVSIM_TRACES``, else the ``shared/traces`` folder beside this checkout, if any."""
    env = os.environ.get(TRACES_ENV)
    if env:
        return Path(env).expanduser()
    beside = Path(__file__).resolve().parents[3] / "shared" / "traces"
    return beside if beside.is_dir() else None


def resolve_trace_path(path: str, base_dir: Path, key: str = "workload.path") -> Path:
    """``path`` if absolute, else under ``base_dir``, else under :func:`traces_root`."""
    given = Path(path).expanduser()
    candidates = [given] if given.is_absolute() else [Path(base_dir) / given]
    env = traces_root()
    if env and not given.is_absolute():
        candidates.append(env / given)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    hint = "" if given.is_absolute() else f"; set ${TRACES_ENV} to the traces folder"
    raise ConfigError(f"trace file {path!r} not found (looked at {looked}){hint}", key=key)


def load_source(source: TraceSource, base_dir: Path, key: str = "workload") -> TraceTable:
    """Resolve and read a trace source's file (every row checked, none selected yet)."""
    path = resolve_trace_path(source.path, base_dir, f"{key}.path")
    return read_trace(path, layout_of(source), skip_bad=source.on_bad_rows == "skip")


@dataclass(frozen=True)
class Selection:
    """The rows a source selects, in arrival order, with their final arrival times."""

    table: TraceTable
    arrival_s: np.ndarray
    report: LoadReport


def _filter_mask(table: TraceTable, source: TraceSource, key: str) -> np.ndarray:
    keep = np.ones(len(table), dtype=bool)
    for column, wanted in (source.filter or {}).items():
        if column not in table.columns:
            found = ", ".join(map(repr, table.columns.names))
            raise ConfigError(
                f"{table.path} has no column {column!r}; found: {found}",
                key=f"{key}.filter.{column}",
            )
        keep &= isin(table.columns, column, wanted if isinstance(wanted, list) else [wanted])
    return keep


def _check_sorted(table: TraceTable, rows: np.ndarray, key: str) -> None:
    """Refuse a trace whose timestamps go back in time, naming the first such line."""
    t = table.arrival_s[rows]
    back = np.flatnonzero(t[1:] < t[:-1])
    if len(back) == 0:
        return
    i, j = int(rows[back[0] + 1]), int(rows[back[0]])
    raise KvsimError(
        f"{table.path}:{int(table.line[i])}: arrival {table.arrival_s[i]:g} s is earlier than "
        f"line {int(table.line[j])}'s {table.arrival_s[j]:g} s; expected timestamps in "
        f"non-decreasing order ({len(back)} rows go back in time); set "
        f"{key}.on_unsorted: sort to sort the rows by time (stable: ties keep file order)"
    )


def select_rows(
    table: TraceTable, source: TraceSource, seed: int, key: str = "workload"
) -> Selection:
    """Apply a source's selection and time options (module docstring) to a read table."""
    jitter_rng, sample_rng = spawn_generators(seed, 2, SELECTION_STREAM)
    keep = _filter_mask(table, source, key)
    if source.on_unsorted == "error":
        _check_sorted(table, np.flatnonzero(keep), key)
    filtered = len(table) - int(keep.sum())
    start = 0.0
    outside = 0
    if source.time_window is not None:
        start, end = source.time_window
        inside = keep & (table.arrival_s >= start) & (table.arrival_s < end)
        outside, keep = int(keep.sum() - inside.sum()), inside
    sampled = 0
    if source.sample is not None:
        if source.sample.seed is not None:
            sample_rng = np.random.default_rng(source.sample.seed)
        drawn = keep & (sample_rng.random(len(table)) < source.sample.fraction)
        sampled, keep = int(keep.sum() - drawn.sum()), drawn
    rows = np.flatnonzero(keep)
    rows = rows[np.argsort(table.arrival_s[rows], kind="stable")]
    beyond = 0
    if source.max_requests is not None and len(rows) > source.max_requests:
        beyond, rows = len(rows) - source.max_requests, rows[: source.max_requests]
    if len(rows) == 0:
        raise KvsimError(
            f"{table.path}: no requests left after selection ({filtered} filtered out, "
            f"{outside} outside time_window, {sampled} sampled out)"
        )
    arrival = table.arrival_s[rows] - start
    if source.jitter_s > 0:
        arrival = arrival + jitter_rng.uniform(0.0, source.jitter_s, size=len(rows))
    arrival = arrival / source.rate_scale
    order = np.argsort(arrival, kind="stable")
    report = LoadReport(
        path=str(table.path),
        rows_in_file=table.rows_in_file,
        bad_rows_skipped=table.bad_rows,
        failed_requests_dropped=table.failed_rows,
        filtered_out=filtered,
        outside_time_window=outside,
        sampled_out=sampled,
        beyond_max_requests=beyond,
        requests=len(rows),
    )
    return Selection(table.take(rows[order]), arrival[order], report)


def _divisors(n: int) -> list[int]:
    """The four largest power-of-two block sizes that divide ``n`` (at most 512 tokens)."""
    return [d for d in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if n % d == 0][-4:]


def block_hashes(table: TraceTable, block_tokens: int) -> list[np.ndarray] | None:
    """Per row, simulator-block hashes from the trace's prefix-block ids (None without ids)."""
    if table.hash_ids is None or table.hash_offsets is None or table.hash_block_tokens is None:
        return None
    trace_block = table.hash_block_tokens
    if trace_block % block_tokens:
        raise ConfigError(
            f"engine.block_tokens = {block_tokens} does not divide the {trace_block}-token "
            f"prefix blocks of {table.path}; use a divisor of {trace_block} "
            f"({', '.join(str(d) for d in _divisors(trace_block))})",
            key="engine.block_tokens",
        )
    flat = hashing.trace_block_hashes(
        table.hash_ids,
        table.hash_offsets,
        table.prompt_tokens,
        trace_block // block_tokens,
        table.line,
        block_tokens,
    )
    return hashing.split(flat, hashing.offsets_of(table.prompt_tokens // block_tokens))


def load_trace_requests(spec: TraceWorkload, context: WorkloadContext) -> Requests:
    """The requests of a ``kind: trace`` workload."""
    selection = select_rows(load_source(spec, context.base_dir), spec, context.seed)
    table = selection.table
    return Requests(
        arrival_s=selection.arrival_s,
        prompt_tokens=table.prompt_tokens,
        output_tokens=table.output_tokens,
        session=table.session,
        prefix_hashes=block_hashes(table, context.block_tokens),
        report=selection.report,
    )
