"""A cluster run's tables and summary: each instance's rows put together, with the instance
(and the tier of each request's prefix hit) named, and the cross-instance invariants.

The tables are put together with pandas, imported here when a cluster's run ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sim.cluster.cluster import Cluster
from sim.cluster.handoff import Handoffs
from sim.observe.invariants import InvariantViolation
from sim.observe.metrics import Columns, request_columns, summarize, tier_summary

if TYPE_CHECKING:
    import pandas as pd

HIT_TIERS = np.array(["none", "hbm", "dram", "ssd", "pool"], dtype=object)  # farthest + 1


def cluster_results(cluster: Cluster, end: float) -> tuple[Columns, Columns, dict]:
    """Requests (``instance``, ``prefix_tier`` added), the timeline (a row per
    instance-step, ``instance`` added) and the summary (cluster totals, and ``instances``)."""
    import pandas as pd

    assert cluster.dispatcher is not None
    routed = cluster.dispatcher.instance_of
    instances = cluster.instances
    requests = _requests(cluster, routed)
    timelines = []
    for i, instance in enumerate(instances):
        frame = pd.DataFrame(instance.kv.prefetch.extend_timeline(instance.timeline.arrays()))
        frame = frame.assign(**cluster.nic_columns[i].columns())
        timelines.append(frame.assign(instance=np.int64(i)))
    timeline = pd.concat(timelines, ignore_index=True)
    timeline = timeline.sort_values(["time_s", "instance"], kind="stable", ignore_index=True)
    pool = cluster.pool is not None
    summary = summarize(requests, timeline, end)
    summary.update(tier_summary(instances, pool))
    summary.update(_traffic(cluster))
    if cluster.handoffs is not None:
        summary.update(_handoff_summary(requests))
    summary["instances"] = [
        _instance_summary(cluster, i, requests, timelines[i], end) for i in range(len(instances))
    ]
    return _columns(requests), _columns(timeline), summary


def _columns(frame: pd.DataFrame) -> Columns:
    """A frame's columns as numpy arrays (strings as objects)."""
    return {str(name): frame[name].to_numpy() for name in frame.columns}


def _requests(cluster: Cluster, routed: np.ndarray) -> pd.DataFrame:
    """Each request's row from the instance that served it."""
    import pandas as pd

    rows = np.arange(len(routed))
    at = np.maximum(routed, 0)  # (every request is routed once the run is over)

    def pick(arrays: list[np.ndarray]) -> np.ndarray:
        return np.stack(arrays)[at, rows]

    schedulers = [i.scheduler for i in cluster.instances]
    reasons = {rid: why for s in schedulers for rid, why in s.reject_reason.items()}
    own = request_columns(
        cluster.requests,
        pick([s.scheduled_s for s in schedulers]),
        pick([s.first_token_s for s in schedulers]),
        pick([s.finish_s for s in schedulers]),
        np.stack([s.preemptions for s in schedulers]).sum(axis=0),  # on both, if split
        reasons,
    )
    frame = pd.DataFrame(own)
    farthests = np.stack([i.kv.loads.farthest for i in cluster.instances]).astype(np.int64)
    handoffs = cluster.handoffs
    prefill = routed.copy()
    columns = dict.fromkeys(("kv_transfer_bytes", "kv_transfer_s", "kv_transfer_exposed_s"), 0.0)
    if handoffs is not None:
        split = handoffs.prefill_of >= 0
        prefill[split] = handoffs.prefill_of[split]
        columns = {
            "kv_transfer_bytes": handoffs.bytes,
            "kv_transfer_s": np.where(split, handoffs.arrived_s - handoffs.sent_s, 0.0),
            "kv_transfer_exposed_s": np.where(split, handoffs.landed_s - handoffs.prefilled_s, 0.0),
        }
    farthest = farthests[np.maximum(prefill, 0), rows]  # the prefill's prefix hit
    return frame.assign(
        instance=routed, prefix_tier=HIT_TIERS[farthest + 1], prefill_instance=prefill,
        decode_instance=routed, **columns,
    )  # fmt: skip


def _handoff_summary(requests: pd.DataFrame) -> dict:
    """The disaggregated requests: how many, their KV bytes, their exposed transfer time."""
    split = requests[requests.prefill_instance != requests.decode_instance]
    exposed = split.kv_transfer_exposed_s
    return {
        "disaggregated_requests": len(split),
        "kv_transfer_bytes": float(split.kv_transfer_bytes.sum()),
        "kv_transfer_exposed_s_p50": float(exposed.median()) if len(split) else None,
        "kv_transfer_exposed_s_p99": float(np.percentile(exposed, 99)) if len(split) else None,
    }


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
    if cluster.handoffs is not None:
        summary["prefills"] = int((cluster.handoffs.prefill_of == i).sum())
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
    expected = np.ones(len(routed), dtype=np.int64)
    if cluster.handoffs is not None:
        check_handoffs(cluster.handoffs, arrived)
        expected += cluster.handoffs.prefill_of >= 0  # its prefill instance, then its decode
    if (routed < 0).any() or (arrived.sum(axis=0) != expected).any():
        bad = int(np.flatnonzero((routed < 0) | (arrived.sum(axis=0) != expected))[0])
        raise InvariantViolation(
            f"invariant violated at the end of the run: request #{bad} is not on exactly "
            f"{expected[bad]} instance(s) (routed to {int(routed[bad])}, on "
            f"{int(arrived[:, bad].sum())})"
        )
    _check_nics(cluster)
    if cluster.pool is None:
        return
    link = cluster.pool.link
    nics = sum(n[0].bytes_delivered + n[1].bytes_delivered for f in cluster.fabrics if (n := f.nic))
    if cluster.handoffs is not None:  # (bytes sent NIC to NIC cross two NICs, not the pool)
        nics -= 2 * cluster.handoffs.network_bytes
    moved = link.bytes_delivered
    if abs(link.bytes_submitted - moved) > 1e-9 * max(moved, 1) or abs(nics - moved) > 1e-6 * max(
        moved, 1
    ):
        raise InvariantViolation(
            "invariant violated at the end of the run: the KV pool's bytes do not conserve "
            f"(submitted {link.bytes_submitted:.0f}, delivered {moved:.0f}, over the NICs "
            f"{nics:.0f})"
        )


def check_handoffs(handoffs: Handoffs, arrived: np.ndarray) -> None:
    """Each disaggregated request went to its prefill instance and decode instance only,
    one after the other: its KV landed after its prefill ended and before its decode
    instance's first token; none is held or in flight at the end."""
    split = np.flatnonzero(handoffs.prefill_of >= 0)
    p, d = handoffs.prefill_of[split], handoffs.decode_of[split]
    first = np.stack([i.scheduler.first_token_s for i in handoffs.instances])[d, split]
    bad = (
        ~arrived[p, split] | ~arrived[d, split] | (p == d)
        | ~(handoffs.landed_s[split] >= handoffs.prefilled_s[split])
        | ~(first > handoffs.landed_s[split])
    )  # fmt: skip
    if bad.any() or handoffs.pending or handoffs.in_flight:
        rid = int(split[np.argmax(bad)]) if bad.any() else -1
        raise InvariantViolation(
            "invariant violated at the end of the run: a disaggregated request did not go "
            f"prefill -> transfer -> decode (request #{rid}; {handoffs.pending} not sent to "
            f"a prefill instance, {handoffs.in_flight} transfers not landed)"
        )


def _check_nics(cluster: Cluster) -> None:
    """Every byte a NIC was given arrived: what the handoffs sent NIC to NIC went out of
    prefill NICs and into decode NICs, and all NIC traffic is those and the pool's (a
    handoff through the pool is pool traffic)."""
    nics = [f.nic for f in cluster.fabrics if f.nic]
    for nic in nics:
        for link in nic:
            given = link.bytes_submitted
            if abs(given - link.bytes_delivered) > 1e-6 * max(given, 1):
                raise InvariantViolation(
                    f"invariant violated at the end of the run: {link.name} was given "
                    f"{link.bytes_submitted:.0f} B and delivered {link.bytes_delivered:.0f} B"
                )
    sent = cluster.handoffs.network_bytes if cluster.handoffs is not None else 0.0
    pool = cluster.pool.link.bytes_delivered if cluster.pool is not None else 0.0
    total = sum(n[0].bytes_delivered + n[1].bytes_delivered for n in nics)
    if abs(total - (2 * sent + pool)) > 1e-6 * max(total, 1):
        raise InvariantViolation(
            "invariant violated at the end of the run: the NICs carried "
            f"{total:.0f} B, not the handoffs' {sent:.0f} B out and in plus the pool's "
            f"{pool:.0f} B"
        )
