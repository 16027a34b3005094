"""Routers: which instance of a cluster serves each request (policies over snapshots)."""

from policies.routing.base import (
    TIERS,
    InstanceSnapshot,
    PrefixLookup,
    Router,
    RouteRequest,
    lookup_from_mapping,
)
from policies.routing.conductor import TtftEstimate, ttft_estimate
from policies.routing.routers import (
    ROUTERS,
    KvAware,
    LeastLoaded,
    PrefixAware,
    RandomRouter,
    RoundRobin,
    SessionAffinity,
    Weighted,
)

__all__ = [
    "ROUTERS",
    "TIERS",
    "InstanceSnapshot",
    "KvAware",
    "LeastLoaded",
    "PrefixAware",
    "PrefixLookup",
    "RandomRouter",
    "RoundRobin",
    "RouteRequest",
    "Router",
    "SessionAffinity",
    "TtftEstimate",
    "Weighted",
    "lookup_from_mapping",
    "ttft_estimate",
]
