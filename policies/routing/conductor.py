"""Mooncake's conductor for prefill instances: the lowest estimated time to first token."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from policies.routing.base import InstanceSnapshot, Router, RouteRequest


def ttft_estimate(request: RouteRequest, instance: InstanceSnapshot) -> float:
    """Queue time (its prompt tokens still to compute) + the prefill of ``request``'s part
    ``instance`` has not cached + bringing the cached part from the tiers it lies in."""
    tiers = instance.prefix_tiers(request.block_hashes)
    cached = min(len(tiers) * request.block_tokens, request.prompt_tokens)
    fetch = float(np.asarray(instance.block_fetch_s)[tiers].sum()) if len(tiers) else 0.0
    prefill = instance.prefill_tokens + request.prompt_tokens - cached
    return prefill * instance.prefill_s_per_token + fetch


class TtftEstimate(Router):
    """Mooncake's conductor (Qin et al., FAST '25, section 5): per instance, queue time +
    prefill time of the uncached prompt + transfer of the cached prefix from where it lies
    (:func:`ttft_estimate`); the lowest wins, ties to the lowest index. Uses the snapshot's
    ``prefill_tokens``, ``prefill_s_per_token`` and ``block_fetch_s``."""

    name = "ttft_estimate"

    def route(self, request: RouteRequest, instances: Sequence[InstanceSnapshot]) -> int:
        """The argmin of the estimate."""
        estimates = [ttft_estimate(request, s) for s in instances]
        return instances[int(np.argmin(estimates))].index
