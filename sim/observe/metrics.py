"""A run's per-request table and its summary (from the timeline and the requests)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from sim.instance.instance import Instance
from sim.memory.blocks import DRAM, HBM, SSD
from sim.workload.requests import Requests


def request_frame(
    requests: Requests,
    scheduled_s: np.ndarray,
    first_token_s: np.ndarray,
    finish_s: np.ndarray,
    preemptions: np.ndarray,
    reject_reason: dict[int, str],
) -> pd.DataFrame:
    """One row per request: times, lengths, TTFT, TPOT, E2E, preemptions, status."""
    out = requests.output_tokens
    ttft = first_token_s - requests.arrival_s
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (finish_s - first_token_s) / (out - 1), np.nan)
    status = np.where(np.isnan(finish_s), "rejected", "finished").astype(object)
    reason = np.full(len(requests), "", dtype=object)
    for rid, why in reject_reason.items():
        reason[rid] = why
    return pd.DataFrame(
        {
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
    )


def _percentile(values: pd.Series, q: float) -> float | None:
    values = values.dropna()
    return float(np.percentile(values, q)) if len(values) else None


def summarize(requests: pd.DataFrame, timeline: pd.DataFrame, sim_time_s: float) -> dict:
    """The figures of ``summary.json`` (latency percentiles over finished requests)."""
    done = requests[requests.status == "finished"]
    hbm_used = timeline[
        ["hbm_weights_bytes", "hbm_reserve_bytes", "hbm_activation_bytes", "hbm_kv_bytes"]
    ].sum(axis=1)
    span = sim_time_s if sim_time_s > 0 else float("nan")
    summary: dict = {
        "requests_finished": len(done),
        "requests_rejected": int((requests.status == "rejected").sum()),
        "rejected_reasons": dict(Counter(requests.reject_reason[requests.reject_reason != ""])),
        "output_tokens_per_s": float(done.output_tokens.sum() / span),
        "input_tokens_per_s": float(done.prompt_tokens.sum() / span),
        "requests_per_s": float(len(done) / span),
    }
    for metric in ("ttft", "tpot", "e2e"):
        column = done[f"{metric}_s"]
        summary[f"{metric}_mean_s"] = float(column.mean()) if column.notna().any() else None
        for q in (50, 90, 99):
            summary[f"{metric}_p{q}_s"] = _percentile(column, q)
    summary.update(
        hbm_peak_bytes=float(hbm_used.max()) if len(timeline) else 0.0,
        hbm_kv_peak_bytes=float(timeline.hbm_kv_bytes.max()) if len(timeline) else 0.0,
        kv_pool_bytes=float(timeline.hbm_kv_pool_bytes.iloc[0]) if len(timeline) else 0.0,
        preemptions=int(requests.preemptions.sum()),
        steps=len(timeline),
        mean_batch_size=float(timeline.batch_size.mean()) if len(timeline) else 0.0,
        sim_time_s=float(sim_time_s),
    )
    return summary


def tier_summary(instance: Instance) -> dict:
    """The summary's hit rates, link bytes, stalls and swaps of one instance."""
    c, links = instance.kv.counters, instance.links
    lookups = max(c.lookup_blocks, 1)
    return {
        "hbm_hit_rate": c.hits[HBM] / lookups,
        "dram_hit_rate": c.hits[DRAM] / lookups,
        "ssd_hit_rate": c.hits[SSD] / lookups,
        "prefix_lookup_blocks": c.lookup_blocks,
        "prefix_hit_tokens": c.prefix_hit_tokens,
        "recomputed_tokens": instance.scheduler.recomputed_tokens,
        "hbm_access_hit_rate": c.access_hbm_hits / max(c.access_blocks, 1),
        "h2d_bytes": links.h2d.bytes_delivered,
        "d2h_bytes": links.d2h.bytes_delivered,
        "ssd_read_bytes": links.ssd_read.bytes_delivered,
        "ssd_write_bytes": links.ssd_write.bytes_delivered,
        "stall_s": instance.stall_s,
        "swaps": c.swaps,
    }
