"""Summary statistics of a trace: rate, lengths, and the hit rate an infinite cache gets."""

from __future__ import annotations

import numpy as np

from sim.workload.tracetable import TraceTable

STAT_KEYS = (
    "requests",
    "duration_s",
    "arrival_rate_per_s",
    "input_mean",
    "input_p50",
    "input_p99",
    "output_mean",
    "output_p50",
    "output_p99",
    "repeated_block_fraction",
)


def repeated_block_fraction(ids: np.ndarray, offsets: np.ndarray) -> float | None:
    """Fraction of block references whose id an earlier row already referenced.

    Rows are taken in order; an id counts once per row. This is the block hit rate of an
    infinite prefix cache (None when there are no ids).
    """
    if ids.size == 0:
        return None
    rows = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    order = np.lexsort((rows, ids))  # by id, then row
    sorted_ids, sorted_rows = ids[order], rows[order]
    same_id = np.concatenate([[False], sorted_ids[1:] == sorted_ids[:-1]])
    same_row = np.concatenate([[False], sorted_rows[1:] == sorted_rows[:-1]])
    references = ~(same_id & same_row)  # (row, id) pairs counted once
    repeated = same_id & ~same_row  # an earlier row had this id
    return float(repeated.sum() / references.sum())


def trace_stats(table: TraceTable) -> dict[str, float | int | None]:
    """The ``kvsim trace stats`` figures (keys :data:`STAT_KEYS`), rows in arrival order."""
    table = table.take(np.argsort(table.arrival_s, kind="stable"))
    n = len(table)
    duration = float(table.arrival_s[-1] - table.arrival_s[0])
    prompt = table.prompt_tokens.astype(np.float64)
    output = table.output_tokens.astype(np.float64)
    repeated = None
    if table.hash_ids is not None and table.hash_offsets is not None:
        repeated = repeated_block_fraction(table.hash_ids, table.hash_offsets)
    return {
        "requests": n,
        "duration_s": duration,
        "arrival_rate_per_s": n / duration if duration > 0 else None,
        "input_mean": float(prompt.mean()),
        "input_p50": float(np.percentile(prompt, 50)),
        "input_p99": float(np.percentile(prompt, 99)),
        "output_mean": float(output.mean()),
        "output_p50": float(np.percentile(output, 50)),
        "output_p99": float(np.percentile(output, 99)),
        "repeated_block_fraction": repeated,
    }


def format_stats(stats: dict[str, float | int | None], block_tokens: int | None) -> str:
    """The stats as the aligned table ``kvsim trace stats`` prints."""

    def number(value: float | int | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    blocks = f" ({block_tokens}-token blocks)" if block_tokens else ""
    rows = [
        ("requests", number(stats["requests"], ",d")),
        ("duration", f"{number(stats['duration_s'], ',.1f')} s"),
        ("arrival rate", f"{number(stats['arrival_rate_per_s'], '.3f')} req/s"),
        (
            "input tokens mean / p50 / p99",
            " / ".join(number(stats[f"input_{k}"], ",.1f") for k in ("mean", "p50", "p99")),
        ),
        (
            "output tokens mean / p50 / p99",
            " / ".join(number(stats[f"output_{k}"], ",.1f") for k in ("mean", "p50", "p99")),
        ),
        (f"repeated-block fraction{blocks}", number(stats["repeated_block_fraction"], ".4f")),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
