"""Policies by name: ``lru``, ``{name: s3fifo, small_fraction: 0.1}`` or ``pkg.module:Class``.

Four kinds share it: eviction, admission, prefetch and router policies.

Parameters are checked up front against each class's ``params``; context arguments that
only the caller knows (``capacity``, ``rng``, ``future``, ``cost``) are passed to the
constructor when it takes them. Every error is a ``ValueError`` naming the policy, the
parameter, the value and what was expected.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

from policies.admission import AlwaysAdmit, SecondHit, Threshold
from policies.arc import ARC
from policies.base import AdmissionPolicy, EvictionPolicy, PrefetchPolicy
from policies.fifo import FIFO
from policies.gds import GreedyDualSize
from policies.heat import HeatEMA
from policies.length_aware import LengthAware
from policies.lfu import LFU
from policies.lru import LRU
from policies.opt import OPT
from policies.prefetch import PREFETCHERS
from policies.prefix_lru import PrefixLRU
from policies.routing import ROUTERS, Router
from policies.s3fifo import S3FIFO
from policies.scheduler_aware import SchedulerAware
from policies.sieve import SIEVE

P = TypeVar("P", EvictionPolicy, AdmissionPolicy, PrefetchPolicy, Router)
Spec = str | Mapping[str, Any]

EVICTION: dict[str, type[EvictionPolicy]] = {
    cls.name: cls
    for cls in (
        FIFO, LRU, LFU, ARC, S3FIFO, SIEVE, GreedyDualSize, HeatEMA,
        PrefixLRU, LengthAware, SchedulerAware, OPT,
    )
}  # fmt: skip
ADMISSION: dict[str, type[AdmissionPolicy]] = {
    cls.name: cls for cls in (AlwaysAdmit, SecondHit, Threshold)
}
PREFETCH: dict[str, type[PrefetchPolicy]] = {cls.name: cls for cls in PREFETCHERS}
ROUTER: dict[str, type[Router]] = {cls.name: cls for cls in ROUTERS}
ALIASES = {"belady": "opt", "min": "opt", "greedydual": "gds", "heat_ema": "heat"}

CONTEXT = {
    "capacity": "capacity (the pool size in keys)",
    "rng": "rng (a numpy random Generator)",
    "future": "future (the whole access sequence; an offline policy)",
    "cost": "cost (a cost function or array indexed by key)",
}


def _tables(kind: type) -> tuple[str, dict[str, Any]]:
    if kind is PrefetchPolicy:
        return "prefetch", PREFETCH
    if kind is Router:
        return "router", ROUTER
    return ("eviction", EVICTION) if kind is EvictionPolicy else ("admission", ADMISSION)


def register(cls: type[P]) -> type[P]:
    """Add a policy class under its ``name`` (usable as a decorator); names are unique."""
    kinds = (EvictionPolicy, AdmissionPolicy, PrefetchPolicy, Router)
    kind = next(k for k in kinds if issubclass(cls, k))
    label, table = _tables(kind)
    if not cls.name or cls.name in table or cls.name in ALIASES:
        raise ValueError(
            f"cannot register {label} policy {cls.__name__}: name {cls.name!r} is empty or taken"
        )
    table[cls.name] = cls
    return cls


def split_spec(spec: Spec) -> tuple[str, dict[str, Any]]:
    """``(name, params)`` of a spec: a name, or a mapping with ``name`` and parameters."""
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
        params = dict(spec)
        return params.pop("name"), params
    raise ValueError(f"a policy spec is a name or a mapping with a 'name' key; got {spec!r}")


def _import(path: str, kind: type, label: str) -> type:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # NOTE: any failure while importing is the user's to fix
        message = f"{label} policy {path!r}: cannot import {module_name!r}: {error}"
        raise ValueError(message) from None
    cls = getattr(module, attr, None) if attr else None
    if cls is None:
        raise ValueError(
            f"{label} policy {path!r}: module {module_name!r} has no attribute {attr!r}"
        )
    if not (inspect.isclass(cls) and issubclass(cls, kind)):
        raise ValueError(f"{label} policy {path!r}: {attr} is not a subclass of {kind.__name__}")
    return cls


def resolve(name: str, kind: type = EvictionPolicy) -> type:
    """The class registered as ``name`` (or an alias), or imported from ``pkg.module:Class``."""
    label, table = _tables(kind)
    if ":" in name:
        return _import(name, kind, label)
    name = ALIASES.get(name, name) if kind is EvictionPolicy else name
    if name in table:
        return table[name]
    close = difflib.get_close_matches(name, [*table, *ALIASES], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(
        f"unknown {label} policy {name!r}{hint}; known: {', '.join(sorted(table))}, "
        f"or a dotted path 'package.module:Class'"
    )


def check_params(
    cls: type[EvictionPolicy] | type[AdmissionPolicy] | type[PrefetchPolicy] | type[Router],
    name: str,
    params: Mapping[str, Any],
    label: str,
) -> dict[str, Any]:
    """Validated parameters with defaults filled in."""
    allowed = cls.params
    out = {key: p.default for key, p in allowed.items()}
    for key, value in params.items():
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            known = ", ".join(sorted(allowed)) or "none"
            raise ValueError(
                f"{label} policy {name!r}: unknown parameter {key!r}{hint}; "
                f"known parameters: {known}"
            )
        if not allowed[key].check(value):
            raise ValueError(
                f"{label} policy {name!r}: parameter {key!r} = {value!r} is invalid; "
                f"expected {allowed[key].expected}"
            )
        out[key] = value
    return out


def check_spec(spec: Spec, kind: type = EvictionPolicy) -> None:
    """Validate a spec's name and parameters without building it (for config loading)."""
    name, params = split_spec(spec)
    cls = resolve(name, kind)
    label, _ = _tables(kind)
    checked = check_params(cls, name, params, label)
    if cls is SchedulerAware:
        check_spec(checked["base"], EvictionPolicy)


def _build(spec: Spec, kind: type, context: dict[str, Any]) -> Any:
    name, params = split_spec(spec)
    cls = resolve(name, kind)
    label, _ = _tables(kind)
    kwargs = check_params(cls, name, params, label)
    if cls is SchedulerAware:
        kwargs["base"] = _build(kwargs["base"], EvictionPolicy, context)
    signature = inspect.signature(cls)
    for key, what in CONTEXT.items():
        if key not in signature.parameters:
            continue
        if context.get(key) is not None:
            kwargs[key] = context[key]
        elif signature.parameters[key].default is inspect.Parameter.empty:
            raise ValueError(f"{label} policy {name!r} needs {what}, which was not given")
    return cls(**kwargs)


def make_eviction(spec: Spec, **context: Any) -> EvictionPolicy:
    """Build an eviction policy; ``context`` may hold capacity, rng, future and cost."""
    unknown = set(context) - set(CONTEXT)
    if unknown:
        raise TypeError(f"unknown context argument(s): {', '.join(sorted(unknown))}")
    return _build(spec, EvictionPolicy, context)


def make_admission(spec: Spec, **context: Any) -> AdmissionPolicy:
    """Build an admission policy; ``context`` may hold capacity, rng and cost."""
    unknown = set(context) - set(CONTEXT)
    if unknown:
        raise TypeError(f"unknown context argument(s): {', '.join(sorted(unknown))}")
    return _build(spec, AdmissionPolicy, context)


def make_prefetch(spec: Spec) -> PrefetchPolicy:
    """Build a prefetch policy (``none``, ``queue_lookahead``, ``heat``, ``next_turn`` ...)."""
    return _build(spec, PrefetchPolicy, {})


def make_router(spec: Spec, rng: np.random.Generator | None = None) -> Router:
    """Build a router (``round_robin``, ``kv_aware`` ...); ``rng`` is a numpy Generator.

    Without ``rng`` a router that draws uses a Generator seeded with 0.
    """
    return _build(spec, Router, {"rng": rng})


def router_names() -> list[str]:
    """Registered router names, sorted."""
    return sorted(ROUTER)


def prefetch_names() -> list[str]:
    """Registered prefetch policy names, sorted."""
    return sorted(PREFETCH)


def eviction_names() -> list[str]:
    """Registered eviction policy names, sorted."""
    return sorted(EVICTION)


def admission_names() -> list[str]:
    """Registered admission policy names, sorted."""
    return sorted(ADMISSION)
