"""Eviction, admission, prefetch and router policies behind small interfaces, and a registry.

``policies`` imports only numpy, the standard library and its own modules, never ``sim``.
"""

from policies.base import AdmissionPolicy, EvictionPolicy, Param, PrefetchPolicy
from policies.pool import AccessTrace, Pool, replay, replay_generic
from policies.registry import (
    admission_names,
    check_spec,
    eviction_names,
    make_admission,
    make_eviction,
    make_prefetch,
    make_router,
    prefetch_names,
    register,
    router_names,
)
from policies.routing import InstanceSnapshot, Router, RouteRequest

__all__ = [
    "AccessTrace",
    "AdmissionPolicy",
    "EvictionPolicy",
    "InstanceSnapshot",
    "Param",
    "Pool",
    "PrefetchPolicy",
    "RouteRequest",
    "Router",
    "admission_names",
    "check_spec",
    "eviction_names",
    "make_admission",
    "make_eviction",
    "make_prefetch",
    "make_router",
    "prefetch_names",
    "register",
    "replay",
    "replay_generic",
    "router_names",
]
