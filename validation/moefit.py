"""The fused-MoE kernel's speed relative to the dense GEMM model (``efficiency.moe_gemm``),
fitted from published kernel benchmarks.

``validation/data/moe_kernels.csv`` holds the points (each row with its source and quote):
the time of one ``fused_moe`` call by number of tokens, as vLLM's
``benchmarks/kernels/benchmark_moe.py`` prints it. One call is what the cost model prices as
one layer's routed experts (``CostModel.routed_experts_time``: the touched experts' dense
GEMMs over ``e_x``) plus the SiLU-and-mul over the routed rows (the calibrated activation
kernel), so

    ``t = dense / e_x + activation``

with ``dense`` and ``activation`` from the GPU's own profile at ``moe_gemm: 1``; ``1 / e_x``
is a linear least squares in relative error. ``python -m validation.moefit`` prints each
GPU's fit and its error on the points.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.config.loader import load_hardware, load_model
from sim.config.parallel import shard_model
from sim.cost.roofline import CostModel, CostParams

DATA = Path(__file__).parent / "data" / "moe_kernels.csv"


@dataclass(frozen=True)
class MoeFit:
    """``efficiency.moe_gemm`` of one GPU and its error on the points fitted."""

    gpu: str
    efficiency: float
    tokens: np.ndarray
    errors: np.ndarray  # relative, predicted / measured - 1
    dense_errors: np.ndarray  # the same at moe_gemm 1 (the dense GEMM model)


def load_points(path: Path = DATA) -> pd.DataFrame:
    """The benchmark rows (comment lines skipped)."""
    return pd.read_csv(path, comment="#")


def _cost_model(gpu: str, model: str, tp: int) -> CostModel:
    """The profile's cost model of one GPU's shard, routed experts priced as dense GEMMs."""
    params = CostParams.from_hardware(load_hardware(gpu))
    shard = shard_model(load_model(model), tp)
    return CostModel(shard, dataclasses.replace(params, moe_gemm_efficiency=1.0))


def _check_shape(cm: CostModel, row: pd.Series) -> None:
    m, moe = cm.model, cm.model.moe
    assert moe is not None, f"{row.model} has no experts"
    shape = (moe.experts, moe.top_k, m.hidden, moe.expert_intermediate)
    want = (row.experts, row.top_k, row.hidden, row.expert_intermediate)
    if shape != want:
        raise ValueError(f"{row.model} at tp {row.tp} is {shape}, the row says {want}")


def parts(rows: pd.DataFrame, gpu: str) -> tuple[np.ndarray, np.ndarray]:
    """(dense routed-expert GEMM seconds, activation seconds) of each row, as the cost model
    prices one layer at ``moe_gemm: 1``."""
    dense, activation = [], []
    for _, row in rows.iterrows():
        cm = _cost_model(gpu, row.model, int(row.tp))
        _check_shape(cm, row)
        m, moe = cm.model, cm.model.moe
        assert moe is not None
        width = (3.0 if m.gated_mlp else 2.0) * moe.expert_intermediate * m.act_bytes
        kernels = cm.params.kernels
        act = 0.0 if kernels is None else kernels.activation
        dense.append(cm.routed_experts_time(int(row.tokens)))
        activation.append(cm.kernel_time(act, row.tokens * moe.top_k, width) if act else 0.0)
    return np.asarray(dense), np.asarray(activation)


def fit(gpu: str = "h100-sxm", path: Path = DATA) -> MoeFit:
    """Fit ``gpu``'s rows against its own profile's dense GEMM model."""
    rows = load_points(path)
    rows = rows[rows.gpu == gpu]
    if rows.empty:
        raise ValueError(f"{path.name} has no rows for {gpu}")
    t = rows.time_us.to_numpy(dtype=np.float64) * 1e-6
    dense, activation = parts(rows, gpu)
    x = dense / t  # minimise Σ ((activation + dense·s) / t - 1)²
    s = float(np.dot(x, 1.0 - activation / t) / np.dot(x, x))
    tokens = rows.tokens.to_numpy()
    errors = (activation + dense * s) / t - 1.0
    return MoeFit(gpu, 1.0 / s, tokens, errors, (activation + dense) / t - 1.0)


def main() -> None:
    """Print the fit of every GPU in the data, and its error point by point."""
    for gpu in sorted(load_points().gpu.unique()):
        f = fit(gpu)
        print(
            f"{gpu}: moe_gemm {f.efficiency:.4f} (max error {np.abs(f.errors).max():.1%}, "
            f"median {np.median(np.abs(f.errors)):.1%}; at moe_gemm 1: max "
            f"{np.abs(f.dense_errors).max():.1%}, median {np.median(np.abs(f.dense_errors)):.1%})"
        )
        for n, e, d in zip(f.tokens, f.errors, f.dense_errors, strict=True):
            print(f"  {n:>5} tokens: {e:+.1%} (dense {d:+.1%})")


if __name__ == "__main__":
    main()
