"""HBM budget: how start-up carves HBM into weights, reserve, activations and the KV pool, as
vLLM V1 (0.10 to 0.20: CUDA graphs outside the budget) computes it (docs/cost-model.md)."""

from __future__ import annotations

from dataclasses import dataclass

from sim.config.loader import set_by_run
from sim.config.parallel import kv_share
from sim.config.run import RunConfig
from sim.cost.roofline import CostModel
from sim.errors import ConfigError
from sim.units import format_bytes


@dataclass(frozen=True)
class HbmPlan:
    """How one GPU's HBM is carved at start-up, as vLLM V1 does it (all bytes, per GPU).

    ``capacity`` is the total torch sees (``torch.cuda.mem_get_info``: ``hardware.hbm.capacity``
    less ``hardware.hbm.driver_reserve``); ``runtime_reserve`` is vLLM's ``non_torch_memory``;
    ``activation_peak`` the profiled peak of a dummy forward of ``max_batched_tokens`` tokens
    and of the sampler for ``max_num_seqs`` sequences. ``kv_pool = gpu_memory_utilization x
    capacity - weights - runtime_reserve - activation_peak``, rounded down to whole blocks.
    CUDA graphs are captured after the pool is allocated, outside the budget (vLLM before
    0.21). Under tensor parallelism every figure
    is one GPU's (its weight shard, its activations, its KV heads: ``block_bytes`` is its
    part of a block, ``kv_share`` of the whole block the KV manager counts), and the pool in
    blocks (tokens) is every GPU's.
    """

    capacity: float
    usable: float
    weights: float
    runtime_reserve: float
    activation_peak: float
    block_bytes: float
    pool_blocks: int
    gpus: int = 1
    kv_share: float = 1.0

    def room(self, activations: float) -> float:
        """Bytes left for KV (one GPU's) once weights, reserve and ``activations`` are in."""
        return self.usable - self.weights - self.runtime_reserve - activations

    @property
    def kv_room(self) -> float:
        """Bytes left for KV once weights, reserve and the profiled activations are in."""
        return self.room(self.activation_peak)

    @property
    def kv_pool(self) -> float:
        """Bytes of the KV pool."""
        return self.pool_blocks * self.block_bytes

    def carve(self, config: RunConfig) -> str:
        """How the pool is carved, each term named by its key: ``engine.gpu_memory_utilization
        0.9 x torch-visible HBM 79.22 GiB (...) - weights 14.96 GiB - ...``."""
        engine = config.engine
        return (
            f"{_usable_terms(config, self)} - model weights "
            f"{format_bytes(self.weights)} - {_reserve_keys(config)} "
            f"{format_bytes(self.runtime_reserve)} - activations "
            f"{format_bytes(self.activation_peak)} (engine.max_batched_tokens "
            f"{engine.max_batched_tokens}, engine.max_num_seqs {engine.max_num_seqs})"
        )

    def pool_key(self, config: RunConfig) -> str:
        """The key to blame for the pool's size: the first the run wrote of
        ``engine.kv_pool_blocks``, ``hardware.hbm.capacity``, ``engine.gpu_memory_utilization``,
        then ``engine.max_batched_tokens`` or ``hardware.hbm.runtime_reserve`` where it takes
        more HBM than the weights; else ``model`` (its weights on this hardware)."""
        if config.engine.kv_pool_blocks is not None:
            return "engine.kv_pool_blocks"
        candidates = [
            ("hardware.hbm.capacity", True),
            ("engine.gpu_memory_utilization", True),
            ("engine.max_batched_tokens", self.activation_peak > self.weights),
            ("hardware.hbm.runtime_reserve", self.runtime_reserve > self.weights),
        ]
        written = (key for key, large in candidates if large and set_by_run(config, key))
        return next(written, "model")


def plan_hbm(config: RunConfig, cost: CostModel) -> HbmPlan:
    """Size the KV pool; a model that does not fit is a ConfigError naming the key that the
    run wrote and that leaves no room (:meth:`HbmPlan.pool_key`)."""
    hw, engine = config.hardware, config.engine
    n = config.tensor_parallel_size
    share = kv_share(config.model, n)
    block_bytes = config.block_bytes * share  # one GPU's part of a block (the whole at tp 1)
    capacity = hw.hbm.capacity - hw.hbm.driver_reserve  # what torch.cuda.mem_get_info sees
    usable = engine.gpu_memory_utilization * capacity
    weights = cost.model.weight_bytes  # one GPU's shard
    peak_seqs = min(engine.max_num_seqs, engine.max_batched_tokens)
    activation_peak = cost.activation_bytes(engine.max_batched_tokens, peak_seqs)
    reserve = runtime_reserve(config)
    fixed = weights + reserve + activation_peak
    pool_blocks = int((usable - fixed) // block_bytes)
    if engine.kv_pool_blocks is not None:
        most = int((capacity - fixed) // block_bytes)
        if engine.kv_pool_blocks > most:
            raise ConfigError(
                f"{engine.kv_pool_blocks} blocks of {format_bytes(block_bytes)} do not fit"
                f" beside weights, reserve and activations; expected at most {most}",
                key="engine.kv_pool_blocks",
            )
        pool_blocks = engine.kv_pool_blocks
    plan = HbmPlan(
        capacity=capacity,
        usable=usable,
        weights=weights,
        runtime_reserve=reserve,
        activation_peak=activation_peak,
        block_bytes=block_bytes,
        pool_blocks=pool_blocks,
        gpus=n,
        kv_share=share,
    )
    _check_weights_fit(config, plan)
    if pool_blocks < 1:
        missing = block_bytes - (usable - fixed)
        raise ConfigError(
            f"model {config.model.name!r} does not fit on {hw.name!r}{_per_gpu(n)}, as vLLM "
            f"refuses it: the KV pool, {plan.carve(config)}, has no room for one KV block of "
            f"{format_bytes(block_bytes)}: {format_bytes(missing)} missing; expected a larger "
            "engine.gpu_memory_utilization or HBM, a smaller model or dtype, a larger "
            "engine.tensor_parallel_size, or fewer engine.max_batched_tokens",
            key=plan.pool_key(config),
        )
    if engine.kv_pool_blocks is None:  # (a pool set in blocks is a what-if: no check)
        _check_max_model_len(config, plan)
    _check_hbm_cache(config, plan)
    return plan


def runtime_reserve(config: RunConfig) -> float:
    """One GPU's non-torch memory inside vLLM's budget: ``hardware.hbm.runtime_reserve``, plus
    ``hardware.hbm.runtime_reserve_tp`` when ``engine.tensor_parallel_size`` > 1 (the TP
    group's NCCL communicators and custom all-reduce buffers: one step, whatever the degree)."""
    hbm = config.hardware.hbm
    extra = hbm.runtime_reserve_tp if config.tensor_parallel_size > 1 else 0.0
    return hbm.runtime_reserve + extra


def max_model_len(config: RunConfig) -> tuple[str, int | None]:
    """The longest sequence vLLM sizes for, and its key: ``engine.max_model_len``, else the
    model's ``context_length`` (None: neither given)."""
    if config.engine.max_model_len:
        return "engine.max_model_len", config.engine.max_model_len
    return "model.context_length", config.model.context_length


def _check_max_model_len(config: RunConfig, plan: HbmPlan) -> None:
    """Refuse, as vLLM does, a pool that cannot hold one sequence of the max_model_len (a
    sliding window holds at most its window)."""
    key, longest = max_model_len(config)
    bt, window = config.engine.block_tokens, config.model.sliding_window
    if not longest:
        return
    kept = min(longest, window) if window else longest
    need = -(-kept // bt)
    if plan.pool_blocks >= need:
        return
    missing = (need - plan.pool_blocks) * plan.block_bytes
    raise ConfigError(
        f"a sequence of {key} {longest} tokens needs {need} KV blocks "
        f"({format_bytes(need * plan.block_bytes)} per GPU) and the KV pool holds "
        f"{plan.pool_blocks} ({plan.pool_blocks * bt} tokens; {plan.carve(config)}): "
        f"{format_bytes(missing)} missing, as vLLM refuses it; expected engine.max_model_len "
        f"at most {plan.pool_blocks * bt}, or a larger engine.gpu_memory_utilization, HBM or "
        "engine.tensor_parallel_size, or a smaller model or dtype",
        key=key if set_by_run(config, key) else plan.pool_key(config),
    )


def _check_hbm_cache(config: RunConfig, plan: HbmPlan) -> None:
    """Refuse a ``kv.hbm.capacity`` above the HBM left for KV once the plan is carved."""
    wanted, room = config.kv.hbm.capacity, plan.kv_room
    if wanted == "auto" or wanted <= room:
        return
    raise ConfigError(
        f"got {format_bytes(wanted)} per GPU for the HBM cache, but {plan.carve(config)} leaves "
        f"{format_bytes(room)}; expected at most {format_bytes(room)}, or auto",
        key="kv.hbm.capacity",
    )


def _reserve_keys(config: RunConfig) -> str:
    """The keys the plan's non-torch reserve comes from (:func:`runtime_reserve`)."""
    if config.tensor_parallel_size > 1 and config.hardware.hbm.runtime_reserve_tp:
        return "hardware.hbm.runtime_reserve + runtime_reserve_tp"
    return "hardware.hbm.runtime_reserve"


def _per_gpu(n: int) -> str:
    return "" if n == 1 else f" (per GPU, engine.tensor_parallel_size {n})"


def _weights_key(config: RunConfig, plan: HbmPlan) -> str:
    """The key to blame for weights that do not fit: the utilisation where the whole HBM
    would hold them, else a capacity or degree the run wrote, else the model."""
    if plan.weights <= plan.capacity and set_by_run(config, "engine.gpu_memory_utilization"):
        return "engine.gpu_memory_utilization"
    for key in ("hardware.hbm.capacity", "engine.tensor_parallel_size"):
        if set_by_run(config, key):
            return key
    return "model"


def _usable_terms(config: RunConfig, plan: HbmPlan) -> str:
    """The HBM a GPU's KV plan starts from, each term named by its key."""
    hbm = config.hardware.hbm
    return (
        f"engine.gpu_memory_utilization {config.engine.gpu_memory_utilization:g} x "
        f"torch-visible HBM {format_bytes(plan.capacity)} (hardware.hbm.capacity "
        f"{format_bytes(hbm.capacity)} - hardware.hbm.driver_reserve "
        f"{format_bytes(hbm.driver_reserve)})"
    )


def _check_weights_fit(config: RunConfig, plan: HbmPlan) -> None:
    """Refuse weights that alone exceed a GPU's usable HBM, saying so."""
    if plan.weights <= plan.usable:
        return
    n, hw = config.tensor_parallel_size, config.hardware
    key = _weights_key(config, plan)
    raise ConfigError(
        f"model {config.model.name!r} does not fit on {hw.name!r}{_per_gpu(n)}: the model "
        f"weights {format_bytes(plan.weights)} per GPU alone exceed "
        f"{_usable_terms(config, plan)} = {format_bytes(plan.usable)}; "
        "expected a larger HBM, a larger engine.tensor_parallel_size or a smaller dtype",
        key=key,
    )
