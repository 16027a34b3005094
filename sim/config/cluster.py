"""The ``cluster`` section: several instances behind a router, and a cluster-wide KV pool.

No ``cluster`` key is one instance (exactly the plain run). ``instances: N`` is N identical
instances of the run's model, hardware, engine and kv; ``groups`` give heterogeneous
instances, each group overriding ``hardware`` (a profile name or mapping), ``engine`` and
``kv`` (partial mappings laid over the run's).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sim.config.base import Bandwidth, Bytes, PositiveBytes, Seconds, Strict
from sim.config.errors import KeyedValueError
from sim.config.hardware import HardwareSpec
from sim.config.kv import PolicySpec


class Network(Strict):
    """Each instance's NIC, per direction: bandwidth and per-transfer latency."""

    bandwidth: Bandwidth = 50e9
    latency: Seconds = 10e-6


class KvPool(Strict):
    """A cluster-wide KV store (Mooncake Store, LMCache remote, Dynamo KVBM's remote tier):
    blocks found by prefix hash from every instance, fetched over the instance's NIC."""

    capacity: PositiveBytes
    ssd_capacity: Bytes = 0.0
    eviction: PolicySpec = "lru"
    bandwidth: Bandwidth

    @model_validator(mode="after")
    def _no_pool_ssd(self) -> KvPool:
        if self.ssd_capacity > 0:
            raise KeyedValueError(
                "ssd_capacity",
                f"{self.ssd_capacity:.0f} B: the pool's SSD level is not modelled yet; expected "
                "0 (give the pool's DRAM as capacity)",
            )
        return self


class RouterSpec(Strict):
    """Which router, its parameters, and how stale the load it sees is."""

    kind: str = "round_robin"
    params: dict[str, Any] = Field(default_factory=dict)
    signal_interval: Seconds = 0.0  # load counts refresh at most this often (0: every request)

    @model_validator(mode="after")
    def _known_router(self) -> RouterSpec:
        from policies.registry import check_spec
        from policies.routing.base import Router

        try:
            check_spec(self.spec, Router)
        except (ValueError, TypeError) as error:
            key = "params" if "parameter" in str(error) else "kind"
            raise KeyedValueError(key, str(error)) from None
        return self

    @property
    def spec(self) -> dict[str, Any]:
        """The registry's spec: ``{name: kind, **params}``."""
        return {"name": self.kind, **self.params}


class RoleRouters(Strict):
    """A router per role: ``decode`` for where requests decode, ``prefill`` for prefills."""

    prefill: RouterSpec = RouterSpec()
    decode: RouterSpec = RouterSpec()


class Transfer(Strict):
    """How a disaggregated request's KV goes from its prefill to its decode instance."""

    via: Literal["network", "pool"] = "network"  # pool: written to cluster.kv_pool, read back
    layerwise: bool = True  # layer l's KV leaves when layer l's prefill is done


class PrefixThreshold(Strict):
    """llm-d's decider: split a request if its decode instance lacks a long part of it."""

    kind: Literal["prefix_threshold"]
    uncached_tokens: int = Field(512, ge=0)


class Disaggregation(Strict):
    """Prefill on ``prefill`` instances, decode on ``decode`` ones, the KV sent between."""

    transfer: Transfer = Transfer()
    decider: Literal["never", "always"] | PrefixThreshold = "always"

    @field_validator("decider", mode="before")
    @classmethod
    def _decider_form(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return PrefixThreshold.model_validate(value)
        if value not in ("never", "always"):
            raise ValueError(
                "expected never, always or {kind: prefix_threshold, uncached_tokens: N}"
            )
        return value


class Group(Strict):
    """``count`` identical instances overriding the run's ``hardware``, ``engine``, ``kv``."""

    name: str
    count: int = Field(1, gt=0)
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    hardware: HardwareSpec | None = None
    engine: dict[str, Any] = Field(default_factory=dict)
    kv: dict[str, Any] = Field(default_factory=dict)


class ClusterConfig(Strict):
    """Instances (``instances`` or ``groups``), the router, the NICs and the KV pool."""

    instances: int | None = Field(None, gt=0)
    groups: list[Group] | None = None
    router: RouterSpec | RoleRouters = RouterSpec()
    network: Network = Network()
    kv_pool: KvPool | None = None
    disaggregation: Disaggregation | None = None

    @field_validator("router", mode="before")
    @classmethod
    def _router_form(cls, value: Any) -> Any:
        """One router spec, or ``{prefill: ..., decode: ...}``: a mapping keyed by roles."""
        if isinstance(value, dict) and value and set(value) <= {"prefill", "decode"}:
            return RoleRouters.model_validate(value)
        return value

    @model_validator(mode="after")
    def _roles(self) -> ClusterConfig:
        roles = {g.role for g in self.groups or ()}
        if self.disaggregation is None:
            split = sorted(roles - {"mixed"})
            if split:
                raise KeyedValueError(
                    "disaggregation",
                    f"groups have role {split[0]!r} but there is no cluster.disaggregation; "
                    "expected one (or role: mixed)",
                )
            if isinstance(self.router, RoleRouters):
                raise KeyedValueError(
                    "router", "a router per role needs cluster.disaggregation; expected one spec"
                )
            return self
        if not {"prefill", "decode"} <= roles or "mixed" in roles:
            raise KeyedValueError(
                "disaggregation",
                f"a disaggregated cluster needs groups of role prefill and decode and no "
                f"mixed one; got roles {sorted(roles)}",
            )
        if self.disaggregation.transfer.via == "pool" and self.kv_pool is None:
            raise KeyedValueError(
                "disaggregation.transfer.via",
                "'pool' sends the KV through the cluster's KV pool, and there is no "
                "cluster.kv_pool; expected 'network', or a kv_pool",
            )
        return self

    @property
    def routers(self) -> RoleRouters:
        """The router of each role (one spec is both)."""
        r = self.router
        return r if isinstance(r, RoleRouters) else RoleRouters(prefill=r, decode=r)

    @model_validator(mode="after")
    def _one_way(self) -> ClusterConfig:
        if self.instances is not None and self.groups is not None:
            raise KeyedValueError("groups", "give instances or groups, not both")
        if self.groups is not None:
            if not self.groups:
                raise KeyedValueError("groups", "expected at least one group")
            names = [g.name for g in self.groups]
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup is not None:
                raise KeyedValueError("groups", f"group name {dup!r} given twice")
        return self

    @property
    def size(self) -> int:
        """Instances in all."""
        if self.groups is not None:
            return sum(g.count for g in self.groups)
        return self.instances or 1
