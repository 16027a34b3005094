"""Per-step timeline, per-request table and the run summary."""

from __future__ import annotations

from collections import Counter
from operator import itemgetter

import numpy as np
import pandas as pd

from sim.workload.requests import Requests

TIMELINE_COLUMNS = (
    "time_s",
    "step_s",
    "batch_size",
    "step_tokens",
    "prefill_tokens",
    "decode_tokens",
    "sampled",
    "linear_s",
    "attention_s",
    "overhead_s",
    "stall_s",
    "running",
    "waiting",
    "preempted",
    "hbm_weights_bytes",
    "hbm_reserve_bytes",
    "hbm_activation_bytes",
    "hbm_kv_running_bytes",
    "hbm_kv_cached_bytes",
    "hbm_staging_bytes",
    "hbm_kv_bytes",
    "hbm_kv_pool_bytes",
    "hbm_free_bytes",
    "dram_kv_bytes",
    "ssd_kv_bytes",
    "h2d_bytes",
    "d2h_bytes",
    "ssd_read_bytes",
    "ssd_write_bytes",
    "h2d_util",
    "d2h_util",
    "hbm_hit_blocks",
    "dram_hit_blocks",
    "ssd_hit_blocks",
    "access_hbm_hits",
)
FLOAT_COLUMNS = frozenset(
    ("time_s", "step_s", "linear_s", "attention_s", "overhead_s", "stall_s", "h2d_util", "d2h_util")
)


class Timeline:
    """Collects one row per engine step into float64 chunks (a DataFrame at the end).

    A row costs 8 bytes per column, not a tuple of Python floats: a long run's timeline
    stays small (bounded memory for million-request runs).
    """

    CHUNK_ROWS = 4096

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._fill = self.CHUNK_ROWS
        self._row = itemgetter(*TIMELINE_COLUMNS)

    def record(self, **row: float) -> None:
        """Append one step; keys are exactly :data:`TIMELINE_COLUMNS`."""
        if self._fill == self.CHUNK_ROWS:
            self._chunks.append(np.empty((self.CHUNK_ROWS, len(TIMELINE_COLUMNS))))
            self._fill = 0
        self._chunks[-1][self._fill] = self._row(row)
        self._fill += 1

    def record_many(self, rows: int, **columns: float | np.ndarray) -> None:
        """Append ``rows`` steps at once; a column is one value per row, or one for all."""
        block = np.empty((len(TIMELINE_COLUMNS), rows))
        for i, value in enumerate(self._row(columns)):
            block[i] = value
        block = block.T
        done = 0
        while done < rows:
            if self._fill == self.CHUNK_ROWS:
                self._chunks.append(np.empty((self.CHUNK_ROWS, len(TIMELINE_COLUMNS))))
                self._fill = 0
            take = min(rows - done, self.CHUNK_ROWS - self._fill)
            self._chunks[-1][self._fill : self._fill + take] = block[done : done + take]
            self._fill += take
            done += take

    def __len__(self) -> int:
        return (len(self._chunks) - 1) * self.CHUNK_ROWS + self._fill if self._chunks else 0

    def to_frame(self) -> pd.DataFrame:
        """The timeline as a DataFrame (integer columns stay integers)."""
        if self._chunks:
            data = np.concatenate(self._chunks)[: len(self)]
        else:
            data = np.zeros((0, len(TIMELINE_COLUMNS)))
        frame = pd.DataFrame(data, columns=list(TIMELINE_COLUMNS))
        for column in TIMELINE_COLUMNS:
            if column not in FLOAT_COLUMNS:
                frame[column] = frame[column].astype(np.int64)
        return frame


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
