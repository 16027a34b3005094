"""Eviction, admission and prefetch policies behind small interfaces, and a registry by name.

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
    prefetch_names,
    register,
)

__all__ = [
    "AccessTrace",
    "AdmissionPolicy",
    "EvictionPolicy",
    "Param",
    "Pool",
    "PrefetchPolicy",
    "admission_names",
    "check_spec",
    "eviction_names",
    "make_admission",
    "make_eviction",
    "make_prefetch",
    "prefetch_names",
    "register",
    "replay",
    "replay_generic",
]
