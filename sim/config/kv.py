"""The ``kv`` section: where KV lives, how attention reads it, which policies manage it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from sim.config.base import PLAUSIBLE, Bytes, Strict, plausible
from sim.config.errors import KeyedValueError
from sim.config.model import Dtype
from sim.units import BYTES

KV_MODES = ("hbm", "offload", "dram_centric")
LOOKAHEAD_REQUESTS = 8  # waiting requests whose prefix blocks scheduler-aware eviction spares
ENGINE_REFUSED = {
    "prefix_lru": "its prefix tree needs stable keys (use it in 'kvsim replay'); in the engine, "
    "lru already evicts leaves first because requests free their blocks tail first",
}


class FullAccess(Strict):
    """Decode attention reads every block of the sequence."""

    kind: Literal["full"] = "full"


class SparseAccess(Strict):
    """Decode attention reads sink blocks, a recent window and the top-k blocks by heat."""

    kind: Literal["sparse"]
    sink_blocks: int = Field(1, ge=0)
    window_blocks: int = Field(16, ge=0)
    topk_blocks: int | None = Field(64, ge=0)
    topk_fraction: float | None = Field(None, ge=0, le=1)
    drift: float = Field(0.05, ge=0, le=1)
    drift_kind: Literal["redraw", "walk"] = "redraw"

    @model_validator(mode="after")
    def _one_topk(self) -> SparseAccess:
        if self.topk_fraction is not None and "topk_blocks" in self.model_fields_set:
            raise KeyedValueError("topk_fraction", "give topk_blocks or topk_fraction, not both")
        return self


def _bare_kind(value: Any) -> Any:
    return {"kind": value} if isinstance(value, str) else value


Access = Annotated[
    FullAccess | SparseAccess, BeforeValidator(_bare_kind), Field(discriminator="kind")
]


def _check_policy(spec: Any) -> Any:
    """A valid eviction policy that can run online (the engine has no future to give)."""
    import inspect

    from policies.registry import check_spec, resolve, split_spec

    check_spec(spec)
    name, _ = split_spec(spec)
    if name in ENGINE_REFUSED:
        raise ValueError(f"{name!r} is not available in the engine: {ENGINE_REFUSED[name]}")
    future = inspect.signature(resolve(name)).parameters.get("future")
    if future is not None and future.default is inspect.Parameter.empty:
        raise ValueError(
            f"{name!r} is an offline policy (it needs the future accesses): use it as the "
            "bound in 'kvsim replay'; the engine runs online policies only"
        )
    return spec


PolicySpec = Annotated[str | dict[str, Any], BeforeValidator(_check_policy)]

LAYERWISE = (
    "layer-wise overlap is 'kv.layerwise: true' (the default), and it applies with every prefetcher"
)
PREFETCH_REFUSED = {"layerwise": LAYERWISE, "layer_wise": LAYERWISE}


def _check_prefetch(spec: Any) -> Any:
    """A valid prefetch policy spec: a name, ``{name: ..., param: value}`` or a dotted path."""
    from policies.base import PrefetchPolicy
    from policies.registry import check_spec, split_spec

    name, _ = split_spec(spec)
    if name in PREFETCH_REFUSED:
        raise ValueError(f"{name!r} is not a prefetch policy: {PREFETCH_REFUSED[name]}")
    check_spec(spec, PrefetchPolicy)
    return spec


PrefetchSpec = Annotated[str | dict[str, Any], BeforeValidator(_check_prefetch)]


class TierPolicy(Strict):
    """Per-tier overrides (``kv.hbm.eviction``)."""

    eviction: PolicySpec | None = None


def _hbm_cache_size(value: Any) -> float | str:
    """``auto``, or a size of 0 or more in the plausible range of an HBM cache (one error)."""
    if value == "auto":
        return value
    try:
        number = BYTES.parse(value)
    except ValueError:
        raise ValueError(
            f"got {value!r}: expected a size such as '16GiB' (0: cache nothing), or auto"
        ) from None
    if number < 0:
        raise ValueError(f"got {value!r}: expected a size of 0 or more, or auto")
    return PLAUSIBLE["HBM cache for KV"].check(value, lambda _: number)


class HbmTier(TierPolicy):
    """HBM's overrides: its eviction policy and, in ``dram_centric``, the size of its cache."""

    capacity: Annotated[float | Literal["auto"], BeforeValidator(_hbm_cache_size)] = Field(
        "auto",
        description="dram_centric only: HBM bytes per GPU that cache KV blocks, a size such as "
        "`16GiB` (0: stream every block every step, cache none; auto: all the HBM left after "
        "weights, reserve and the step's activations)",
    )


class KvConfig(Strict):
    """Where KV lives: ``hbm`` (PagedAttention), ``offload`` or ``dram_centric``."""

    mode: str = "hbm"
    dtype: Dtype | None = None
    dram_capacity: Annotated[Bytes, plausible("DRAM budget for KV")] | None = None
    ssd_capacity: Annotated[Bytes, plausible("SSD budget for KV")] | None = None
    access: Access = FullAccess()
    layerwise: bool = True
    write_policy: Literal["write_through", "write_back"] = "write_through"
    prefix_loads: Literal["async", "in_step"] = "async"
    direct_read: bool = False
    dram_dtype: Dtype | None = None
    ssd_dtype: Dtype | None = None
    prefix_caching: bool = True
    hbm_prefix_caching: bool = True
    eviction: PolicySpec = "lru"
    prefetch: PrefetchSpec = "none"
    hbm: HbmTier = HbmTier()
    dram: TierPolicy = TierPolicy()
    ssd: TierPolicy = TierPolicy()

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, mode: str) -> str:
        if mode not in KV_MODES:
            raise ValueError(
                f"unknown KV mode {mode!r}; the modes that exist: {', '.join(KV_MODES)}"
            )
        return mode

    @model_validator(mode="after")
    def _direct_read_needs_dram_centric(self) -> KvConfig:
        if self.direct_read and self.mode != "dram_centric":
            raise KeyedValueError("direct_read", "direct_read: true needs mode: dram_centric")
        return self

    @model_validator(mode="after")
    def _in_step_loads_need_a_lower_tier(self) -> KvConfig:
        if self.prefix_loads == "in_step" and self.mode == "hbm":
            raise KeyedValueError(
                "prefix_loads",
                "prefix_loads: in_step times loads of prefix blocks from a lower tier; in mode "
                "hbm no prefix block lives below HBM: expected async, or mode offload or "
                "dram_centric",
            )
        return self

    @model_validator(mode="after")
    def _hbm_prefix_caching_off_needs_offload(self) -> KvConfig:
        if self.hbm_prefix_caching:
            return self
        if self.mode != "offload" or not self.prefix_caching:
            raise KeyedValueError(
                "hbm_prefix_caching",
                "hbm_prefix_caching: false turns off the engine's own prefix cache beside a "
                "DRAM one (vLLM's --no-enable-prefix-caching with a KV connector): expected "
                f"mode offload with prefix_caching true, got mode {self.mode} with "
                f"prefix_caching {str(self.prefix_caching).lower()}",
            )
        if self.write_policy != "write_through":
            raise KeyedValueError(
                "hbm_prefix_caching",
                "hbm_prefix_caching: false drops a finished request's blocks from HBM at once, "
                "so they must be in DRAM already: expected write_policy write_through",
            )
        return self

    @model_validator(mode="after")
    def _hbm_cache_needs_dram_centric(self) -> KvConfig:
        if self.hbm.capacity != "auto" and self.mode != "dram_centric":
            raise KeyedValueError(
                "hbm.capacity",
                f"hbm.capacity sizes dram_centric's HBM cache; in mode {self.mode} HBM holds "
                "the KV pool, sized by the memory plan (engine.gpu_memory_utilization, "
                "engine.kv_pool_blocks): expected auto, or mode dram_centric",
            )
        return self

    @model_validator(mode="after")
    def _prefetch_has_a_lower_tier(self) -> KvConfig:
        name = self.prefetch_name
        if name == "queue_lookahead" and self.mode == "hbm":
            raise KeyedValueError(
                "prefetch",
                "prefetch queue_lookahead needs mode offload or dram_centric: in hbm mode no "
                "prefix block lives below HBM, so there is nothing to bring up",
            )
        if name == "heat" and self.mode != "dram_centric":
            raise KeyedValueError(
                "prefetch",
                "prefetch heat needs mode dram_centric: it stages the blocks the next decode "
                "step reads, which only dram_centric keeps outside HBM",
            )
        return self

    @property
    def prefetch_name(self) -> str:
        """The prefetch policy's name (``none`` = on demand)."""
        return self.prefetch if isinstance(self.prefetch, str) else self.prefetch["name"]

    def eviction_for(self, tier: str) -> str | dict[str, Any]:
        """The eviction policy of a tier (its own, else ``kv.eviction``)."""
        own = getattr(self, tier).eviction
        return own if own is not None else self.eviction
