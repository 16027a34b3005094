"""The fused-MoE kernel's speed relative to the fused roofline (``efficiency.moe_gemm``) and
its fixed time per call (``efficiency.moe_latency``), fitted from published kernel benchmarks.

``validation/data/moe_kernels.csv`` holds the points (each row with its source and quote):
the time of one ``fused_moe`` call by number of tokens, as vLLM's
``benchmarks/kernels/benchmark_moe.py`` prints it. One call is what the cost model prices as
one layer's routed experts (``CostModel.routed_experts_time``: the touched experts' GEMMs as
one roofline, no per-GEMM latency, over ``e_x``), the SiLU-and-mul over the routed rows (the
calibrated activation kernel) and the call's fixed time ``l_x`` (routing top-k, token sort,
the top-k sum), so

    ``t = roofline / e_x + activation + l_x``

with ``roofline`` and ``activation`` from the GPU's own profile at ``moe_gemm: 1``, each row's
experts at its ``dtype``. ``(1 / e_x, l_x)`` is a linear least squares in relative error over
all of a GPU's fitted rows (every shape at once; one shape over 1 .. 1536 tokens already
separates the two: ``l_x`` is most of a one-token call); ``latency=False`` fits ``1 / e_x``
alone (``l_x = 0``). Rows run with a tuned kernel
config (``kernel`` ending ``-tuned``, what vLLM serves when a config file exists) are fitted;
the others (a default config) are printed as checks against the profile's own values.
``python -m validation.moefit`` prints each GPU's fit and its error shape by shape.
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
FITTED = "-tuned"  # kernel suffix of the rows fitted


@dataclass(frozen=True)
class MoeFit:
    """``efficiency.moe_gemm`` and ``efficiency.moe_latency`` of one GPU and the errors on the
    points fitted."""

    gpu: str
    efficiency: float
    latency: float  # seconds per fused-MoE call (one layer)
    shapes: np.ndarray  # "model tp N dtype" of each point
    tokens: np.ndarray
    errors: np.ndarray  # relative, predicted / measured - 1
    dense_errors: np.ndarray  # the same at moe_gemm 1, moe_latency 0 (the bare roofline)


def load_points(path: Path = DATA) -> pd.DataFrame:
    """The benchmark rows (comment lines skipped)."""
    return pd.read_csv(path, comment="#")


def _cost_model(gpu: str, model: str, tp: int, dtype: str) -> CostModel:
    """The profile's cost model of one GPU's shard, the experts' weights at ``dtype``, routed
    experts priced as the bare fused roofline (``moe_gemm`` 1, no fixed call time)."""
    params = CostParams.from_hardware(load_hardware(gpu))
    spec = load_model(model)
    if spec.dtype != dtype:
        spec = spec.model_copy(update={"dtype": dtype})
    dense = dataclasses.replace(params, moe_gemm_efficiency=1.0, moe_latency_s=0.0)
    return CostModel(shard_model(spec, tp), dense)


def _check_shape(cm: CostModel, row: pd.Series) -> None:
    m, moe = cm.model, cm.model.moe
    assert moe is not None, f"{row.model} has no experts"
    shape = (moe.experts, moe.top_k, m.hidden, moe.expert_intermediate)
    want = (row.experts, row.top_k, row.hidden, row.expert_intermediate)
    if shape != want:
        raise ValueError(f"{row.model} at tp {row.tp} is {shape}, the row says {want}")


def shape_names(rows: pd.DataFrame) -> np.ndarray:
    """One label per row: model, TP, expert width and dtype."""
    return np.asarray(
        [f"{r.model} tp{r.tp} N={r.expert_intermediate} {r.dtype}" for r in rows.itertuples()]
    )


def parts(rows: pd.DataFrame, gpu: str) -> tuple[np.ndarray, np.ndarray]:
    """(routed-expert GEMM seconds, activation seconds) of each row, as the cost model
    prices one layer at ``moe_gemm: 1``."""
    dense, activation = [], []
    for _, row in rows.iterrows():
        cm = _cost_model(gpu, row.model, int(row.tp), str(row["dtype"]))  # not row.dtype
        _check_shape(cm, row)
        m, moe = cm.model, cm.model.moe
        assert moe is not None
        width = (3.0 if m.gated_mlp else 2.0) * moe.expert_intermediate * m.act_bytes
        kernels = cm.params.kernels
        act = 0.0 if kernels is None else kernels.activation
        dense.append(cm.routed_experts_time(int(row.tokens)))
        activation.append(cm.kernel_time(act, row.tokens * moe.top_k, width) if act else 0.0)
    return np.asarray(dense), np.asarray(activation)


def solve(
    dense: np.ndarray, activation: np.ndarray, t: np.ndarray, latency: bool = True
) -> tuple[float, float]:
    """(1 / e_x, l_x) minimising Σ ((activation + dense·s + l) / t - 1)², l ≥ 0; ``latency``
    False (or a negative optimum) fits s alone at l = 0."""
    y = 1.0 - activation / t
    x = dense / t
    if latency:
        (s, lat), *_ = np.linalg.lstsq(np.column_stack([x, 1.0 / t]), y, rcond=None)
        if lat >= 0.0:
            return float(s), float(lat)
    return float(np.dot(x, y) / np.dot(x, x)), 0.0


def fit(gpu: str = "h100-sxm", path: Path = DATA, latency: bool = True) -> MoeFit:
    """Fit ``gpu``'s tuned-config rows, all shapes at once, against its own profile's fused
    roofline; ``latency`` False: ``moe_gemm`` alone."""
    rows = load_points(path)
    rows = rows[(rows.gpu == gpu) & rows.kernel.str.endswith(FITTED)]
    if rows.empty:
        raise ValueError(f"{path.name} has no tuned-config rows for {gpu}")
    shapes = shape_names(rows)
    t = rows.time_us.to_numpy(dtype=np.float64) * 1e-6
    dense, activation = parts(rows, gpu)
    s, lat = solve(dense, activation, t, latency)
    errors = (activation + dense * s + lat) / t - 1.0
    return MoeFit(
        gpu, 1.0 / s, lat, shapes, rows.tokens.to_numpy(), errors, (activation + dense) / t - 1.0
    )


def checks(gpu: str, path: Path = DATA) -> pd.DataFrame:
    """``gpu``'s rows that are not fitted, against the profile's own ``moe_gemm`` and
    ``moe_latency``: shape, tokens, measured and predicted microseconds, relative error."""
    rows = load_points(path)
    rows = rows[(rows.gpu == gpu) & ~rows.kernel.str.endswith(FITTED)]
    if rows.empty:
        return pd.DataFrame(columns=["shape", "tokens", "measured_us", "predicted_us", "error"])
    eff = load_hardware(gpu).efficiency
    dense, activation = parts(rows, gpu)
    predicted = dense / eff.moe_gemm + activation + eff.moe_latency
    t = rows.time_us.to_numpy(dtype=np.float64) * 1e-6
    return pd.DataFrame(
        {
            "shape": shape_names(rows),
            "tokens": rows.tokens.to_numpy(),
            "measured_us": t * 1e6,
            "predicted_us": predicted * 1e6,
            "error": predicted / t - 1.0,
        }
    )


def _summary(errors: np.ndarray) -> str:
    a = np.abs(errors)
    return f"max {a.max():.1%}, median {np.median(a):.1%}"


def main() -> None:
    """Print the fit of every GPU with tuned-config rows, its error shape by shape and point by
    point, then the other rows as checks against each profile's values."""
    points = load_points()
    for gpu in sorted(points[points.kernel.str.endswith(FITTED)].gpu.unique()):
        f = fit(gpu)
        print(
            f"{gpu}: moe_gemm {f.efficiency:.4f}, moe_latency {f.latency * 1e6:.2f} us "
            f"({_summary(f.errors)}; bare roofline: {_summary(f.dense_errors)})"
        )
        for shape in dict.fromkeys(f.shapes):
            pick = f.shapes == shape
            print(f"  {shape}: {_summary(f.errors[pick])} over {pick.sum()} points")
            for n, e, d in zip(f.tokens[pick], f.errors[pick], f.dense_errors[pick], strict=True):
                print(f"    {n:>5} tokens: {e:+.1%} (dense {d:+.1%})")
    for gpu in sorted(points.gpu.unique()):
        c = checks(gpu)
        if c.empty:
            continue
        eff = load_hardware(gpu).efficiency
        print(
            f"{gpu} checks (not fitted; profile moe_gemm {eff.moe_gemm}, "
            f"moe_latency {eff.moe_latency * 1e6:.2f} us):"
        )
        for shape in dict.fromkeys(c["shape"]):
            part = c[c["shape"] == shape]
            print(f"  {shape}: {_summary(part.error.to_numpy())} over {len(part)} points")
            for r in part.itertuples():
                print(
                    f"    {r.tokens:>5} tokens: {r.measured_us:8.2f} us measured, "
                    f"{r.predicted_us:8.2f} predicted ({r.error:+.1%})"
                )


if __name__ == "__main__":
    main()
