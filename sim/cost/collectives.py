"""Tensor-parallel collectives: an alpha-beta model with a size-dependent efficiency.

One all-reduce of ``M`` bytes over ``N`` GPUs on the profile's interconnect takes

    t(M, N) = latency + (2(N-1)/N)^g · (M + h) / (bandwidth · e)

``2(N-1)/N`` is the bytes a ring all-reduce moves through each GPU's links per byte of
message (NCCL's "bus bandwidth" factor), softened by the fitted exponent ``g`` (NVSwitch
all-reduces slow down less with N than a ring); ``M / (M + h)`` is the size-dependent
efficiency (protocol and pipeline fill: small messages reach a fraction of the link). The
four parameters are fitted on measured NCCL times (``kvsim calibrate --comm``). Where the
profile gives ``custom_allreduce``, the small messages vLLM's own kernel takes are priced by
that kernel instead (:meth:`CollectiveParams.all_reduce_s`). A gather to one rank moves
``(N-1)/N`` of the message, half an all-reduce's bytes: it is priced as an NCCL all-reduce of
``M / 2``. Collectives do not overlap compute (vLLM runs them on the compute
stream between the layers that need them). Equations: ``docs/cost-model.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sim.config.hardware import CustomAllReduce, Interconnect
from sim.config.model import ModelSpec

ONE_STAGE_UP_TO_4 = 512 * 1024  # vLLM's one-stage kernel: under this on up to 4 GPUs,
ONE_STAGE_UP_TO_8 = 256 * 1024  # under this on 6 or 8 (and always on 2)


@dataclass(frozen=True)
class CollectiveParams:
    """The fitted all-reduce model of one interconnect (SI units)."""

    bandwidth: float
    latency_s: float = 0.0
    efficiency: float = 1.0
    half_efficiency_bytes: float = 0.0
    workers_exponent: float = 1.0
    custom: CustomAllReduce | None = None

    @classmethod
    def from_interconnect(cls, link: Interconnect) -> CollectiveParams:
        """The parameters a hardware profile's ``interconnect`` section holds."""
        return cls(
            bandwidth=link.bandwidth,
            latency_s=link.latency,
            efficiency=link.efficiency,
            half_efficiency_bytes=link.half_efficiency_bytes,
            workers_exponent=link.workers_exponent,
            custom=link.custom_allreduce,
        )

    def all_reduce_s(self, nbytes: float, workers: int) -> float:
        """One all-reduce of ``nbytes`` over ``workers`` GPUs (0 for one GPU or no bytes):
        vLLM's custom kernel where it takes the message, else NCCL's."""
        c = self.custom
        if c is None or nbytes <= 0 or nbytes >= c.max_bytes.get(workers, 0.0):
            return self.nccl_s(nbytes, workers)
        if one_stage(nbytes, workers):
            return c.one_stage.latency + (workers - 1) * nbytes / c.one_stage.bandwidth
        factor = 2.0 * (workers - 1) / workers
        return c.two_stage.latency + factor * nbytes / c.two_stage.bandwidth

    def nccl_s(self, nbytes: float, workers: int) -> float:
        """One NCCL all-reduce of ``nbytes`` over ``workers`` GPUs (0 for one GPU or no
        bytes)."""
        if workers <= 1 or nbytes <= 0:
            return 0.0
        factor = (2.0 * (workers - 1) / workers) ** self.workers_exponent
        wire = nbytes + self.half_efficiency_bytes
        return self.latency_s + factor * wire / (self.bandwidth * self.efficiency)

    def gather_s(self, nbytes: float, workers: int) -> float:
        """One gather of ``nbytes`` (the gathered whole) to one rank, NCCL's: half an
        all-reduce's bytes."""
        return self.nccl_s(nbytes / 2.0, workers)


def one_stage(nbytes: float, workers: int) -> bool:
    """Whether vLLM's custom all-reduce runs its one-stage kernel (``custom_all_reduce.cuh``:
    always on 2 GPUs; under 512 KiB on up to 4, under 256 KiB on 6 or 8)."""
    if workers == 2:
        return True
    return nbytes < (ONE_STAGE_UP_TO_4 if workers <= 4 else ONE_STAGE_UP_TO_8)


class Collectives:
    """A step's collectives under tensor parallelism, as vLLM runs them.

    Per step of ``T`` tokens: one all-reduce of ``T x hidden`` after the vocab-parallel
    embedding, two per layer (after the attention output projection and after the MLP down
    projection), and a gather of the ``S x vocab`` logits of the sampled sequences at the LM
    head; all in the model dtype.
    """

    def __init__(self, model: ModelSpec, params: CollectiveParams, workers: int):
        self.model, self.params, self.workers = model, params, workers
        self.step_s = lru_cache(maxsize=1 << 16)(self._step_s)

    def all_reduces(self) -> int:
        """All-reduces of ``T x hidden`` in one step."""
        return 2 * self.model.layers + 1

    def _step_s(self, tokens: int, sampled: int) -> float:
        if tokens <= 0:
            return 0.0
        m, p, n = self.model, self.params, self.workers
        activations = tokens * m.hidden * m.act_bytes
        logits = sampled * m.vocab * m.act_bytes
        return self.all_reduces() * p.all_reduce_s(activations, n) + p.gather_s(logits, n)
