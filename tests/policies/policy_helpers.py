"""Helpers for the policy tests: building any registered policy, driving it, strategies."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import strategies as st

from policies import AccessTrace, Pool, make_eviction
from policies.registry import EVICTION

REPO = Path(__file__).resolve().parents[2]
CONVERSATION = "mooncake_fast25_conversation_trace.jsonl"
ALL = sorted(EVICTION)
FUSED = sorted(name for name, cls in EVICTION.items() if getattr(cls, "fast_replay", None))
# victims(n) may return fewer than the unpinned count: ancestors of pinned leaves stay
MAY_FALL_SHORT = {"prefix_lru"}


def cost(key: int) -> float:
    """A deterministic, uneven cost per key."""
    return float(key % 5 + 1)


def build(name, capacity: int, trace: AccessTrace, **params):
    """Any registered policy with every context argument it may want."""
    spec = {"name": name, **params} if params else name
    return make_eviction(
        spec, capacity=capacity, future=trace.keys, rng=np.random.default_rng(0), cost=cost
    )


def drive(policy, trace: AccessTrace, capacity: int, hook=None) -> list[tuple[bool, tuple]]:
    """(hit, victims) per access through a ``Pool``; ``hook(pool, key)`` runs before each."""
    pool = Pool(policy, capacity)
    out = []
    for keys, now in zip(trace.requests(), trace.times.tolist(), strict=True):
        policy.on_request(keys, now)
        for key in keys:
            if hook is not None:
                hook(pool, key)
            hit = pool.access(key, now)
            out.append((hit, tuple(pool.evicted)))
    return out


@st.composite
def traces(draw, max_key: int = 12, max_requests: int = 14, max_len: int = 5):
    """Requests of distinct keys, with non-decreasing times (seconds)."""
    n = draw(st.integers(1, max_requests))
    keys = st.integers(0, max_key)
    requests = [draw(st.lists(keys, min_size=1, max_size=max_len, unique=True)) for _ in range(n)]
    gaps = draw(st.lists(st.sampled_from([0.0, 0.5, 3.0, 20.0]), min_size=n, max_size=n))
    return AccessTrace.from_requests(requests, np.cumsum(gaps).tolist())


@st.composite
def prefix_traces(draw, documents: int = 4, depth: int = 6, max_requests: int = 14):
    """Requests that are prefixes of a few block chains (a prefix tree with shared roots)."""
    chains = [[0, *range(1 + d * depth, 1 + (d + 1) * depth)] for d in range(documents)]
    n = draw(st.integers(1, max_requests))
    requests = []
    for _ in range(n):
        chain = draw(st.sampled_from(chains))
        requests.append(chain[: draw(st.integers(1, len(chain)))])
    return AccessTrace.from_requests(requests)


def shared_trace(name: str) -> Path:
    """A file of the shared traces folder, or skip the test."""
    for root in (
        os.environ.get("KVSIM_TRACES"),
        "/work/shared/traces",
        REPO.parent / "shared/traces",
    ):
        if root and (Path(root) / name).is_file():
            return Path(root) / name
    pytest.skip(f"{name} not found in $KVSIM_TRACES, /work/shared/traces or ../shared/traces")
