"""Fitted workloads: lengths and inter-arrival gaps resampled from a trace (bootstrap).

(prompt, output) pairs are drawn jointly from the selected rows, so their correlation
survives; gaps are drawn from the trace's own gaps (``arrival: empirical``, scaled by the
source's ``rate_scale``) or come from an arrival process. Prefix identity is not kept.
"""

from __future__ import annotations

import numpy as np

from sim.config.workload import Empirical, FittedWorkload
from sim.errors import KvsimError
from sim.workload.context import WorkloadContext
from sim.workload.distributions import draw_arrivals
from sim.workload.requests import Requests
from sim.workload.trace import load_source, select_rows


def clip_total(prompt: np.ndarray, output: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Shrink prompt and output of requests over ``limit`` tokens in proportion (each >= 1)."""
    total = prompt + output
    over = total > limit
    if not over.any():
        return prompt, output
    new_prompt = prompt.copy()
    new_prompt[over] = np.clip(np.floor(prompt[over] * limit / total[over]), 1, limit - 1)
    new_output = output.copy()
    new_output[over] = limit - new_prompt[over]
    return new_prompt, new_output


def generate_fitted(spec: FittedWorkload, context: WorkloadContext) -> Requests:
    """``num_requests`` requests drawn from the source trace's empirical distributions."""
    key = "workload.from"
    table_all = load_source(spec.source, context.base_dir, key)
    selection = select_rows(table_all, spec.source, context.seed, key)
    table, arrival = selection.table, selection.arrival_s
    rows_rng, gaps_rng = context.generators(2)
    n = spec.num_requests or len(table)
    pick = rows_rng.integers(0, len(table), size=n)
    prompt, output = table.prompt_tokens[pick], table.output_tokens[pick]
    if spec.max_total_tokens is not None:
        prompt, output = clip_total(prompt, output, spec.max_total_tokens)
    if isinstance(spec.arrival, Empirical):
        if len(arrival) < 2:
            raise KvsimError(f"{table.path}: arrival: empirical needs at least 2 selected rows")
        gaps = np.diff(arrival)
        drawn = np.concatenate([[0.0], gaps[gaps_rng.integers(0, len(gaps), size=n - 1)]])
        times = np.cumsum(drawn)
    else:
        times = draw_arrivals(spec.arrival, n, gaps_rng)
    return Requests(
        arrival_s=times, prompt_tokens=prompt, output_tokens=output, report=selection.report
    )
