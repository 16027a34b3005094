"""A run's per-request table and its summary (from the timeline and the requests).

Tables are columns by name (:data:`Columns`: numpy arrays; a DataFrame reads the same way),
so a run needs no pandas; the statistics are pandas' own to the bit (:func:`mean`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sim.instance.instance import Instance
from sim.kv.parts import Counters
from sim.memory.blocks import DRAM, HBM, SSD
from sim.workload.requests import Requests

OVERLOAD_GROWTH = 0.1  # queue growth per request arrived above which a run is overloaded

Columns = dict[str, np.ndarray]  # a table as columns by name, in order
Table = Mapping[str, Any]  # what the summaries read: Columns, or a DataFrame


def column(table: Table, name: str) -> np.ndarray:
    """A column of ``table`` as a numpy array (strings as objects)."""
    return np.asarray(table[name])


def mean(values: np.ndarray) -> float:
    """The mean of the non-NaN values (NaN if none), summed as pandas' ``Series.mean`` sums
    them (NaNs as zeros, in float64), so the summary's figures stay the same to the bit."""
    if values.dtype.kind == "f":
        missing = np.isnan(values)
        count = np.float64(values.size - int(missing.sum()))
        total = np.where(missing, 0.0, values).sum(dtype=values.dtype)
    else:
        count, total = np.float64(values.size), values.sum(dtype=np.float64)
    return float(total / count) if count > 0 else float("nan")


def request_columns(
    requests: Requests,
    scheduled_s: np.ndarray,
    first_token_s: np.ndarray,
    finish_s: np.ndarray,
    preemptions: np.ndarray,
    reject_reason: dict[int, str],
) -> Columns:
    """One row per request: times, lengths, TTFT, TPOT, E2E, preemptions, status."""
    out = requests.output_tokens
    ttft = first_token_s - requests.arrival_s
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (finish_s - first_token_s) / (out - 1), np.nan)
    status = np.where(np.isnan(finish_s), "rejected", "finished").astype(object)
    reason = np.full(len(requests), "", dtype=object)
    for rid, why in reject_reason.items():
        reason[rid] = why
    return {
        "request_id": np.arange(len(requests), dtype=np.int64),
        "arrival_s": requests.arrival_s,
        "scheduled_s": scheduled_s,
        "first_token_s": first_token_s,
        "finish_s": finish_s,
        "prompt_tokens": requests.prompt_tokens,
        "output_tokens": out,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": finish_s - requests.arrival_s,
        "preemptions": preemptions,
        "status": status,
        "reject_reason": reason,
    }


def _percentile(values: np.ndarray, q: float) -> float | None:
    values = values[~np.isnan(values)]
    return float(np.percentile(values, q)) if len(values) else None


HBM_USED = ("hbm_weights_bytes", "hbm_reserve_bytes", "hbm_activation_bytes", "hbm_kv_bytes")


def summarize(requests: Table, timeline: Table, sim_time_s: float) -> dict:
    """The figures of ``summary.json`` (latency percentiles over finished requests)."""
    status, reason = column(requests, "status"), column(requests, "reject_reason")
    done = status == "finished"
    steps = len(column(timeline, "time_s"))
    span = sim_time_s if sim_time_s > 0 else float("nan")
    finished = int(done.sum())
    summary: dict = {
        "requests_finished": finished,
        "requests_rejected": int((status == "rejected").sum()),
        "rejected_reasons": dict(Counter(reason[reason != ""].tolist())),
        "output_tokens_per_s": float(column(requests, "output_tokens")[done].sum() / span),
        "input_tokens_per_s": float(column(requests, "prompt_tokens")[done].sum() / span),
        "requests_per_s": float(finished / span),
    }
    for metric in ("ttft", "tpot", "e2e"):
        values = column(requests, f"{metric}_s")[done]
        known = bool((~np.isnan(values)).any())
        summary[f"{metric}_mean_s"] = mean(values) if known else None
        for q in (50, 90, 99):
            summary[f"{metric}_p{q}_s"] = _percentile(values, q)
        if metric == "tpot":
            summary.update(decode_steps(timeline))
    summary.update(_memory(timeline, steps))
    summary.update(
        preemptions=int(column(requests, "preemptions").sum()),
        steps=steps,
        mean_batch_size=mean(column(timeline, "batch_size")) if steps else 0.0,
        sim_time_s=float(sim_time_s),
    )
    summary.update(overload(requests, timeline, sim_time_s))
    return summary


def _memory(timeline: Table, steps: int) -> dict:
    """HBM's peak use (weights, reserve, activations, KV), KV's peak and the KV pool."""
    if not steps:
        return {"hbm_peak_bytes": 0.0, "hbm_kv_peak_bytes": 0.0, "kv_pool_bytes": 0.0}
    used = column(timeline, HBM_USED[0])
    for name in HBM_USED[1:]:
        used = used + column(timeline, name)
    return {
        "hbm_peak_bytes": float(used.max()),
        "hbm_kv_peak_bytes": float(column(timeline, "hbm_kv_bytes").max()),
        "kv_pool_bytes": float(column(timeline, "hbm_kv_pool_bytes")[0]),
    }


def goodput(requests: Table, sim_time_s: float, ttft: float | None, tpot: float | None) -> dict:
    """Requests that finished within both targets (a missing target always holds; a request
    with one output token has no TPOT and meets any): per second of simulated time
    (``goodput_rps``) and as a share of all requests, rejected ones included
    (``slo_attainment``)."""
    met = column(requests, "status") == "finished"
    if ttft is not None:
        met &= column(requests, "ttft_s") <= ttft
    if tpot is not None:
        tpots = column(requests, "tpot_s")
        met &= np.isnan(tpots) | (tpots <= tpot)
    good, count = int(met.sum()), len(met)
    return {
        "goodput_rps": good / sim_time_s if sim_time_s > 0 else None,
        "slo_attainment": good / count if count else None,
    }


def decode_steps(timeline: Table) -> dict:
    """Step time of the decode-only steps (no prefill token in the batch): mean, p50, p99.

    TPOT also pays for the prefill chunks that share a decoding request's steps; these steps
    show what decoding alone costs."""
    steps = column(timeline, "step_s")[column(timeline, "prefill_tokens") == 0]
    return {
        "decode_step_mean_s": mean(steps) if len(steps) else None,
        "decode_step_p50_s": _percentile(steps, 50),
        "decode_step_p99_s": _percentile(steps, 99),
    }


def overload(requests: Table, timeline: Table, sim_time_s: float) -> dict:
    """Offered and served request rates, and whether the run is overloaded: its waiting queue
    grew with the arrivals (``queue_growth`` above :data:`OVERLOAD_GROWTH`). A closed batch
    (every request arrives at one instant) has no arrival rate and is never overloaded."""
    arrival = column(requests, "arrival_s")
    span = float(arrival.max() - arrival.min()) if len(arrival) else 0.0
    finished = int((column(requests, "status") == "finished").sum())
    growth = queue_growth(arrival, timeline) if span > 0 else None
    return {
        "overloaded": growth is not None and growth > OVERLOAD_GROWTH,
        "offered_rate_rps": len(arrival) / span if span > 0 else None,
        "served_rate_rps": finished / float(sim_time_s) if sim_time_s > 0 else None,
        "queue_growth": growth,
    }


def queue_growth(arrival: np.ndarray, timeline: Table) -> float:
    """How much the waiting queue grew over the arrival period, per request arrived: the
    time-mean of ``waiting`` over the period's second half minus that over its first half,
    over the requests that arrived in the second half.

    A queue that keeps pace with the arrivals stays level (about 0); one that falls behind
    grows by (offered - served rate) x time, so this is about ``1 - served / offered``.
    """
    start, end = float(arrival.min()), float(arrival.max())
    mid = (start + end) / 2
    starts = column(timeline, "time_s").astype(np.float64, copy=False)
    waiting = column(timeline, "waiting").astype(np.float64, copy=False)
    rise = _time_mean(starts, waiting, mid, end) - _time_mean(starts, waiting, start, mid)
    return rise / int(np.count_nonzero(arrival > mid))


def _time_mean(starts: np.ndarray, values: np.ndarray, a: float, b: float) -> float:
    """Mean over ``[a, b]`` of the step function worth ``values[i]`` from ``starts[i]`` to
    the next start (0 before the first): each step's queue, held until the next step."""
    if not len(starts):
        return 0.0
    stops = np.append(starts[1:], np.inf)
    overlap = np.clip(np.minimum(stops, b) - np.maximum(starts, a), 0.0, None)
    return float(np.sum(values * overlap)) / (b - a)  # (not a BLAS dot: its threads split the sum)


def tier_summary(instances: Sequence[Instance], pool: bool = False) -> dict:
    """The summary's hit rates, link bytes, stalls and swaps over ``instances`` (one, or a
    cluster's: counts summed); ``pool``: with the KV pool's hit rates."""
    c = Counters()
    for instance in instances:
        _add_counts(c, instance.kv.counters)
    bt = instances[0].kv.bt
    lookups, reuse = max(c.lookup_blocks, 1), max(c.reuse_lookup_blocks, 1)

    def delivered(name: str) -> float:
        return sum(getattr(i.links, name).bytes_delivered for i in instances)

    summary = {
        "hbm_hit_rate": c.hits[HBM] / lookups,
        "dram_hit_rate": c.hits[DRAM] / lookups,
        "ssd_hit_rate": c.hits[SSD] / lookups,
        "prefix_lookup_blocks": c.lookup_blocks,
        "prefix_hit_tokens": c.prefix_hit_tokens,
        "hbm_reuse_hit_rate": c.reuse_hits[HBM] / reuse,
        "dram_reuse_hit_rate": c.reuse_hits[DRAM] / reuse,
        "ssd_reuse_hit_rate": c.reuse_hits[SSD] / reuse,
        "prefix_reuse_lookup_blocks": c.reuse_lookup_blocks,
        "prefix_reuse_hit_tokens": (sum(c.reuse_hits) + c.reuse_pool_hits) * bt,
        "prefix_rehit_tokens": c.rehit_blocks * bt,
        "recomputed_tokens": sum(i.scheduler.recomputed_tokens for i in instances),
        "hbm_access_hit_rate": c.access_hbm_hits / max(c.access_blocks, 1),
        "h2d_bytes": delivered("h2d"),
        "d2h_bytes": delivered("d2h"),
        "ssd_read_bytes": delivered("ssd_read"),
        "ssd_write_bytes": delivered("ssd_write"),
        "stall_s": sum(i.stall_s for i in instances),
        "swaps": c.swaps,
        "tensor_parallel_size": max(i.plan.gpus for i in instances),
        "gpus": sum(i.plan.gpus for i in instances),
    }
    if pool:
        summary["pool_hit_rate"] = c.pool_hits / lookups
        summary["pool_reuse_hit_rate"] = c.reuse_pool_hits / reuse
    return summary


def _add_counts(total: Counters, more: Counters) -> None:
    """Add ``more``'s counts into ``total`` (per-tier lists element by element)."""
    for name, value in vars(more).items():
        mine = getattr(total, name)
        if isinstance(value, list):
            setattr(total, name, [a + b for a, b in zip(mine, value, strict=True)])
        else:
            setattr(total, name, mine + value)
