"""A cluster run's tables and summary: each instance's rows put together, with the instance
(and the tier of each request's prefix hit) named, and the cross-instance invariants."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.cluster.cluster import Cluster
from sim.observe.invariants import InvariantViolation
from sim.observe.metrics import request_frame, summarize, tier_summary

HIT_TIERS = np.array(["none", "hbm", "dram", "ssd", "pool"], dtype=object)  # farthest + 1


def cluster_results(cluster: Cluster, end: float) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Requests (``instance``, ``prefix_tier`` added), the timeline (a row per
    instance-step, ``instance`` added) and the summary (cluster totals, and ``instances``)."""
    assert cluster.dispatcher is not None
    routed = cluster.dispatcher.instance_of
    instances = cluster.instances
    requests = _requests(cluster, routed)
    timelines = []
    for i, instance in enumerate(instances):
        frame = instance.kv.prefetch.extend_timeline(instance.timeline.to_frame())
        timelines.append(frame.assign(instance=np.int64(i)))
    timeline = pd.concat(timelines, ignore_index=True)
    timeline = timeline.sort_values(["time_s", "instance"], kind="stable", ignore_index=True)
    pool = cluster.pool is not None
    summary = summarize(requests, timeline, end)
    summary.update(tier_summary(instances, pool))
    summary.update(_traffic(cluster))
    summary["instances"] = [
        _instance_summary(cluster, i, requests, timelines[i], end) for i in range(len(instances))
    ]
    return requests, timeline, summary


def _requests(cluster: Cluster, routed: np.ndarray) -> pd.DataFrame:
    """Each request's row from the instance that served it."""
    rows = np.arange(len(routed))
    at = np.maximum(routed, 0)  # (every request is routed once the run is over)

    def pick(arrays: list[np.ndarray]) -> np.ndarray:
        return np.stack(arrays)[at, rows]

    schedulers = [i.scheduler for i in cluster.instances]
    reasons = {rid: why for s in schedulers for rid, why in s.reject_reason.items()}
    frame = request_frame(
        cluster.requests,
        pick([s.scheduled_s for s in schedulers]),
        pick([s.first_token_s for s in schedulers]),
        pick([s.finish_s for s in schedulers]),
        pick([s.preemptions for s in schedulers]),
        reasons,
    )
    farthest = pick([i.kv.loads.farthest for i in cluster.instances]).astype(np.int64)
    return frame.assign(instance=routed, prefix_tier=HIT_TIERS[farthest + 1])


def _traffic(cluster: Cluster) -> dict:
    """Bytes over the NICs and through the pool, and the pool's block counts."""
    nics = [f.nic for f in cluster.fabrics if f.nic is not None]
    out = {
        "nic_in_bytes": sum(n[0].bytes_delivered for n in nics),
        "nic_out_bytes": sum(n[1].bytes_delivered for n in nics),
    }
    if cluster.pool is not None:
        out.update(
            kv_pool_bytes_moved=cluster.pool.link.bytes_delivered,
            kv_pool_blocks=cluster.pool.resident,
            kv_pool_blocks_written=cluster.pool.blocks_written,
            kv_pool_blocks_evicted=cluster.pool.blocks_evicted,
        )
    return out


def _instance_summary(
    cluster: Cluster, i: int, requests: pd.DataFrame, timeline: pd.DataFrame, end: float
) -> dict:
    """One instance's figures, as a plain run's summary gives them."""
    instance, member = cluster.instances[i], cluster.members[i]
    own = requests[requests.instance == i]
    summary = {
        "index": i,
        "group": member.group,
        "hardware": member.config.hardware.name,
        "requests": len(own),
    }
    summary.update(summarize(own, timeline, end))
    summary.update(tier_summary([instance], cluster.pool is not None))
    nic = cluster.fabrics[i].nic
    if nic is not None:
        summary.update(nic_in_bytes=nic[0].bytes_delivered, nic_out_bytes=nic[1].bytes_delivered)
    return summary


def check_cluster(cluster: Cluster) -> None:
    """Across the cluster: every request on exactly one instance; the pool's link conserves
    bytes, and what crossed it is what the NICs carried to and from it."""
    assert cluster.dispatcher is not None
    routed = cluster.dispatcher.instance_of
    arrived = np.stack([i.scheduler.status != 0 for i in cluster.instances])
    if (routed < 0).any() or (arrived.sum(axis=0) != 1).any():
        bad = int(np.flatnonzero((routed < 0) | (arrived.sum(axis=0) != 1))[0])
        raise InvariantViolation(
            f"invariant violated at the end of the run: request #{bad} is not on exactly one "
            f"instance (routed to {int(routed[bad])}, on {int(arrived[:, bad].sum())})"
        )
    if cluster.pool is None:
        return
    link = cluster.pool.link
    nics = sum(n[0].bytes_delivered + n[1].bytes_delivered for f in cluster.fabrics if (n := f.nic))
    moved = link.bytes_delivered
    if abs(link.bytes_submitted - moved) > 1e-9 * max(moved, 1) or abs(nics - moved) > 1e-6 * max(
        moved, 1
    ):
        raise InvariantViolation(
            "invariant violated at the end of the run: the KV pool's bytes do not conserve "
            f"(submitted {link.bytes_submitted:.0f}, delivered {moved:.0f}, over the NICs "
            f"{nics:.0f})"
        )
