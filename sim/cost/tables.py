"""The table cost model: operator times interpolated in measured tables, as Vidur does.

With ``hardware.cost_model: table`` a step's operators are priced from measurements
(``hardware.cost_table``: the raw table ``kvsim calibrate --device`` writes, or a folder of
Vidur ``mlp.csv`` tables) instead of the roofline. Each operator is a :class:`Curve` of
measured time against its size: exact at a measured point, linear in log-log between two,
flat below the first and linear in the size (so in FLOPs and bytes) beyond the last.

Operators are found by shape, never by model name: a GEMM by ``(fan_in, fan_out)``, a kernel
by ``(kind, row bytes)``, attention by its FLOPs per (query, key) pair and KV bytes per key.
The table must hold every per-layer operator of the model (the four GEMMs, norm, rope,
activation, residual add); the LM head, the embedding and attention come from the table
when it holds them at the model's shapes, else from the profile's roofline. Equations:
``docs/cost-model.md``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from sim.config.hardware import HardwareSpec
from sim.config.model import ModelSpec
from sim.config.paths import resolve_table_path
from sim.cost.roofline import KERNELS_PER_LAYER, CostModel, CostParams
from sim.errors import KvsimError

if TYPE_CHECKING:
    import pandas as pd

    from sim.cost.collectives import Collectives

LAYER_KERNELS = {**KERNELS_PER_LAYER, "activation": 1}  # dense models: one MLP per layer
GEMM_NAMES = ("QKV projection", "output projection", "MLP up(+gate)", "MLP down")


@dataclass(frozen=True)
class Curve:
    """Measured time against a size ``x`` (tokens, FLOPs or context), ``x`` increasing.

    Exact at the points, log-log linear between two, flat below the first point, and
    proportional to ``x`` beyond the last (time per token, FLOP or byte held constant).
    """

    x: tuple[float, ...]
    t: tuple[float, ...]

    def __call__(self, x: float) -> float:
        xs, ts = self.x, self.t
        if x <= 0.0:
            return 0.0
        if x >= xs[-1]:
            return ts[-1] if x == xs[-1] else ts[-1] * (x / xs[-1])
        if x <= xs[0]:
            return ts[0]
        i = bisect_left(xs, x)
        if xs[i] == x:
            return ts[i]
        f = math.log(x / xs[i - 1]) / math.log(xs[i] / xs[i - 1])
        return ts[i - 1] * (ts[i] / ts[i - 1]) ** f

    @classmethod
    def of(cls, rows: pd.DataFrame, x: str) -> Curve:
        """The curve of ``rows`` against column ``x``; repeated points are averaged."""
        means = rows[rows[x] > 0].groupby(x, sort=True).time_s.mean()
        return cls(tuple(means.index.astype(float)), tuple(means.to_numpy(dtype=float)))


@dataclass(frozen=True)
class DecodeGrid:
    """Decode attention against (batch, context): a context curve per measured batch size.

    Between two batch sizes log-log linear; beyond the largest, proportional to the batch
    (the KV bytes read); below the smallest, that batch's time.
    """

    batches: tuple[float, ...]
    curves: tuple[Curve, ...]

    def __call__(self, batch: float, context: float) -> float:
        bs = self.batches
        if batch >= bs[-1]:
            edge = self.curves[-1](context)
            return edge if batch == bs[-1] else edge * (batch / bs[-1])
        if batch <= bs[0]:
            return self.curves[0](context)
        i = bisect_left(bs, batch)
        if bs[i] == batch:
            return self.curves[i](context)
        lo, hi = self.curves[i - 1](context), self.curves[i](context)
        f = math.log(batch / bs[i - 1]) / math.log(bs[i] / bs[i - 1])
        return lo * (hi / lo) ** f


@dataclass(frozen=True)
class OperatorTable:
    """One model's operators, as measured curves (None: not in the table, priced as roofline)."""

    gemms: dict[tuple[int, int], Curve]
    kernels: dict[str, Curve]
    lm_head: Curve | None
    embedding: Curve | None
    prefill: Curve | None  # one layer's prefill attention against its FLOPs
    decode: DecodeGrid | None  # one layer's decode attention against (batch, mean context)
    source: str

    @property
    def from_roofline(self) -> list[str]:
        """The operators the table does not hold (priced by the profile's roofline)."""
        parts = {"LM head": self.lm_head, "embedding": self.embedding,
                 "prefill attention": self.prefill, "decode attention": self.decode}  # fmt: skip
        return [name for name, curve in parts.items() if curve is None]


@lru_cache(maxsize=8)
def _read(path: str, mtime: float) -> pd.DataFrame:
    """The long table at ``path`` (cached while the file is unchanged)."""
    from sim.cost.optables import read_measurements  # (pandas: loaded with a table only)

    return read_measurements(path)


def _rows_for(table: pd.DataFrame, model: ModelSpec, where: str, tp: int = 1) -> pd.DataFrame:
    """Rows of tensor-parallel degree ``tp`` (per-GPU shapes) measured in the model's dtype."""
    from sim.cost.optables import VIDUR_DTYPE_BYTES

    if "tp" in table.columns:
        rows = table[table.tp == tp]
    elif tp == 1:
        rows = table
    else:
        raise ValueError(f"{where} has no tensor-parallel degree column: it holds tp 1 only")
    if "dtype" in rows.columns and rows.dtype.notna().any():
        kept = rows[rows.dtype == model.dtype]
        if kept.empty:
            found = sorted(rows.dtype.dropna().unique())
            raise ValueError(
                f"{where} holds measurements in {found}, none in the model's dtype {model.dtype!r}"
            )
        return kept
    if model.dtype_bytes != VIDUR_DTYPE_BYTES:
        raise ValueError(
            f"{where} holds fp16/bf16 measurements (Vidur tables); model {model.name!r} is "
            f"{model.dtype}: expected a 2-byte dtype"
        )
    return rows


def _gemm_curve(rows: pd.DataFrame, shape: tuple[int, int]) -> Curve | None:
    part = rows[(rows.kind == "gemm") & (rows.fan_in == shape[0]) & (rows.fan_out == shape[1])]
    return Curve.of(part, "tokens") if len(part) else None


def _kernel_curve(rows: pd.DataFrame, kind: str, row_bytes: float) -> Curve | None:
    part = rows[(rows.kind == kind) & np.isclose(rows.row_bytes, row_bytes, rtol=1e-9)]
    return Curve.of(part, "tokens") if len(part) else None


def _attention(rows: pd.DataFrame, cost: CostModel) -> tuple[Curve | None, DecodeGrid | None]:
    """Attention curves whose shapes (FLOPs per pair, KV bytes per key) are the model's."""
    if not {"flops", "batch", "context", "bytes"} <= set(rows.columns):
        return None, None
    pre = rows[rows.kind == "attention_prefill"]
    pairs = pre.tokens * (pre.tokens + 1) / 2
    pre = pre[np.isclose(pre.flops / pairs, cost.attention_flops_per_pair, rtol=1e-6)]
    dec = rows[rows.kind == "attention_decode"]
    keys = dec.batch * (dec.context + 1)
    dec = dec[np.isclose(dec.bytes / keys, cost.kv_bytes_per_token_layer, rtol=1e-6)]
    prefill = Curve.of(pre, "flops") if len(pre) else None
    decode = None
    if len(dec):
        groups = sorted(dec.groupby("batch"), key=lambda g: g[0])
        decode = DecodeGrid(
            tuple(float(b) for b, _ in groups), tuple(Curve.of(g, "context") for _, g in groups)
        )
    return prefill, decode


def _missing(model: ModelSpec, gemms: dict, kernels: dict, row_bytes: dict) -> list[str]:
    out = [
        f"gemm {fan_in}x{fan_out} ({name})"
        for name, (fan_in, fan_out) in zip(GEMM_NAMES, _layer_gemms(model), strict=True)
        if gemms[(fan_in, fan_out)] is None
    ]
    return out + [
        f"{kind} kernel of {row_bytes[kind]:g} bytes per token row"
        for kind in LAYER_KERNELS
        if kernels[kind] is None
    ]


def _layer_gemms(model: ModelSpec) -> tuple[tuple[int, int], ...]:
    return model.attention_gemms + model.mlp_gemms(model.intermediate)


def _shapes_held(rows: pd.DataFrame) -> str:
    gemms = rows[rows.kind == "gemm"][["fan_in", "fan_out"]].drop_duplicates()
    shapes = sorted(f"{int(i)}x{int(o)}" for i, o in gemms.itertuples(index=False))
    return ", ".join(shapes[:12]) + (", ..." if len(shapes) > 12 else "") if shapes else "none"


def operator_table(model: ModelSpec, hardware: HardwareSpec, tp: int = 1) -> OperatorTable:
    """The model's operators from ``hardware.cost_table`` (``model``: one GPU's shard, priced
    from the rows measured at tensor-parallel degree ``tp``).

    Raises:
        ValueError: the table cannot be read, the model is not a dense one, or the table
            lacks a per-layer operator of the model (every one missing is named).
    """
    where = f"hardware.cost_table {hardware.cost_table!r}"
    if hardware.cost_table is None:
        raise ValueError("hardware.cost_model: table needs hardware.cost_table")
    if model.moe or model.mla:
        raise ValueError(
            f"hardware.cost_model: table prices dense models only; model {model.name!r} has "
            f"{'MoE experts' if model.moe else 'MLA attention'} (use cost_model: roofline)"
        )
    path = resolve_table_path(hardware.cost_table)
    try:
        table = _read(str(path), path.stat().st_mtime)
    except KvsimError as exc:
        raise ValueError(f"{where}: {exc}") from None
    rows = _rows_for(table, model, where, tp)
    cost = CostModel(model, CostParams.from_hardware(hardware))
    row_bytes = cost.kernel_row_bytes()
    gemms = {shape: _gemm_curve(rows, shape) for shape in _layer_gemms(model)}
    kernels = {kind: _kernel_curve(rows, kind, row_bytes[kind]) for kind in LAYER_KERNELS}
    missing = _missing(model, gemms, kernels, row_bytes)
    if missing:
        raise ValueError(
            f"{where} ({path}) has no measurements of {'; '.join(missing)} for model "
            f"{model.name!r} ({model.dtype}, tensor-parallel degree {tp}); it holds gemm "
            f"shapes [{_shapes_held(rows)}]; "
            "expected every per-layer operator at the model's shapes (docs/cost-model.md)"
        )
    prefill, decode = _attention(rows, cost)
    return OperatorTable(
        gemms={k: v for k, v in gemms.items() if v is not None},
        kernels={k: v for k, v in kernels.items() if v is not None},
        lm_head=_gemm_curve(rows, (model.hidden, model.vocab)),
        embedding=_kernel_curve(rows, "embedding", row_bytes["embedding"]),
        prefill=prefill,
        decode=decode,
        source=str(path),
    )


class TableCostModel(CostModel):
    """:class:`CostModel` with measured operator curves in place of the roofline."""

    def __init__(
        self, model: ModelSpec, params: CostParams, table: OperatorTable,
        kv_dtype_bytes: float | None = None, comm: Collectives | None = None,
    ):  # fmt: skip
        super().__init__(model, params, kv_dtype_bytes, comm)
        self.table = table
        self.layer_gemms = _layer_gemms(model)

    def layer_time(self, tokens: float) -> float:
        """One layer's measured GEMMs and elementwise kernels for ``tokens`` tokens."""
        t = self.table
        gemms = sum(t.gemms[shape](tokens) for shape in self.layer_gemms)
        return gemms + sum(n * t.kernels[k](tokens) for k, n in LAYER_KERNELS.items())

    def _linear_time(self, tokens: int, sampled: int) -> float:
        """All layers, the LM head and the embedding (roofline where the table has none)."""
        m, t = self.model, self.table
        if tokens == 0:
            return 0.0
        total = m.layers * self.layer_time(tokens)
        if t.lm_head is not None:
            total += t.lm_head(sampled)
        else:
            total += self.gemm_time(sampled, m.hidden, m.vocab, m.class_bytes("lm_head"))
        if t.embedding is not None:
            total += t.embedding(tokens)
        elif self.params.kernels is not None:
            rows = self.kernel_row_bytes()["embedding"]
            total += self.kernel_time(self.params.kernels.embedding, tokens, rows)
        return total

    def attention_time(self, new_tokens: np.ndarray, context: np.ndarray) -> float:
        """Prefill-like and decode kernels from the table (each its roofline if not held)."""
        m, t = self.model, self.table
        new = np.asarray(new_tokens, dtype=np.float64)
        ctx = np.asarray(context, dtype=np.float64)
        if m.sliding_window:
            ctx = np.minimum(ctx, m.sliding_window)
        total = 0.0
        prefill, decode = new > 1, new == 1
        if prefill.any():
            if t.prefill is None:
                total += super().attention_time(new[prefill], np.asarray(context)[prefill])
            else:
                pairs = (new * (ctx + (new + 1.0) / 2.0))[prefill].sum()
                total += m.layers * t.prefill(float(pairs) * self.attention_flops_per_pair)
        if decode.any():
            if t.decode is None:
                total += super().attention_time(new[decode], np.asarray(context)[decode])
            else:
                batch, mean_ctx = float(decode.sum()), float(ctx[decode].mean())
                total += m.layers * t.decode(batch, mean_ctx)
        return total
