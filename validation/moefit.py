"""The fused-MoE kernel's compute and weight-streaming speeds relative to the dense GEMM model
(``efficiency.moe_gemm``, ``efficiency.moe_gemm_memory``) and its fixed time per call
(``efficiency.moe_latency``), fitted from published kernel benchmarks.

``validation/data/moe_kernels.csv`` holds the points (each row with its source and quote):
the time of one ``fused_moe`` call by number of tokens, as vLLM's
``benchmarks/kernels/benchmark_moe.py`` prints it. One call is what the cost model prices as
one layer's routed experts (``CostModel.routed_experts_time``: each expert GEMM one roofline
over the touched experts, its FLOPs on the rows padded to the tile height, no per-GEMM
latency), the SiLU-and-mul over the routed rows (the calibrated activation kernel) and the
call's fixed time ``l_x`` (routing top-k, token sort, the top-k sum), so

    ``t = Σ_gemm blend(compute / e_x, memory / e_xm) + activation + l_x``

with ``compute``, ``memory`` (``CostModel.routed_experts_parts``) and ``activation`` from the
GPU's own profile, each row's experts at its ``dtype``. ``(e_x, e_xm, l_x)`` minimise the
squared relative error over all of a GPU's fitted rows (every shape at once; ``l_x`` is most of
a one-token call, ``e_xm`` the memory-bound decode sizes, ``e_x`` the compute-bound prefill
sizes); ``latency=False`` fixes ``l_x = 0``. Rows run with a tuned kernel config (``kernel``
ending ``-tuned``, what vLLM serves when a config file exists) are fitted; the others (a
default config, another kernel) are printed as checks against the profile's own values. A row
faster than its touched experts' weights take at the peak HBM bandwidth read them from the L2
cache (the benchmark replays one layer; serving cycles through all of them): it is neither
fitted nor checked, only listed. ``python -m validation.moefit`` prints each GPU's fit and its
errors, table by table.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from sim.config.loader import load_hardware, load_model
from sim.config.parallel import shard_model
from sim.cost.roofline import CostModel, CostParams, blend

DATA = Path(__file__).parent / "data" / "moe_kernels.csv"
FITTED = "-tuned"  # kernel suffix of the rows fitted


@dataclass(frozen=True)
class MoeFit:
    """``efficiency.moe_gemm``, ``moe_gemm_memory`` and ``moe_latency`` of one GPU and the errors
    on the points fitted."""

    gpu: str
    efficiency: float  # e_x, compute
    memory: float  # e_xm, weight streaming
    latency: float  # seconds per fused-MoE call (one layer)
    shapes: np.ndarray  # "model tpN N=... dtype kernel" of each point
    tokens: np.ndarray
    errors: np.ndarray  # relative, predicted / measured - 1
    dense_errors: np.ndarray  # the same at e_x = e_xm = 1, l_x = 0 (the bare roofline)


@dataclass(frozen=True)
class Parts:
    """What the cost model prices for each benchmark row, before the three parameters."""

    gemms: list[list[tuple[float, float]]]  # per row: (compute, memory) seconds per GEMM
    blend: float  # the profile's gemm_blend p (inf: the hard max)
    activation: np.ndarray  # seconds
    floor: np.ndarray  # the touched experts' weights at the peak HBM bandwidth, seconds

    def dense(self, efficiency: float = 1.0, memory: float = 1.0) -> np.ndarray:
        """The routed GEMMs' seconds of each row at ``e_x``, ``e_xm``."""
        return np.asarray(
            [
                sum(blend(c / efficiency, m / memory, self.blend) for c, m in row)
                for row in self.gemms
            ]
        )


def load_points(path: Path = DATA) -> pd.DataFrame:
    """The benchmark rows (comment lines skipped)."""
    return pd.read_csv(path, comment="#")


def _cost_model(gpu: str, model: str, tp: int, dtype: str) -> CostModel:
    """The profile's cost model of one GPU's shard, the experts' weights at ``dtype``, before
    the fused-MoE parameters (``moe_gemm``, ``moe_gemm_memory`` 1, no fixed call time)."""
    params = CostParams.from_hardware(load_hardware(gpu))
    spec = load_model(model)
    if spec.dtype != dtype:
        spec = spec.model_copy(update={"dtype": dtype})
    dense = dataclasses.replace(
        params, moe_gemm_efficiency=1.0, moe_memory_efficiency=1.0, moe_latency_s=0.0
    )
    return CostModel(shard_model(spec, tp), dense)


def _check_shape(cm: CostModel, row: pd.Series) -> None:
    m, moe = cm.model, cm.model.moe
    assert moe is not None, f"{row.model} has no experts"
    shape = (moe.experts, moe.top_k, m.hidden, moe.expert_intermediate)
    want = (row.experts, row.top_k, row.hidden, row.expert_intermediate)
    if shape != want:
        raise ValueError(f"{row.model} at tp {row.tp} is {shape}, the row says {want}")


def shape_names(rows: pd.DataFrame) -> np.ndarray:
    """One label per row: model, TP, expert width, dtype and kernel."""
    return np.asarray(
        [
            f"{r.model} tp{r.tp} N={r.expert_intermediate} {r.dtype} {r.kernel}"
            for r in rows.itertuples()
        ]
    )


def parts(rows: pd.DataFrame, gpu: str) -> Parts:
    """The cost model's pieces of each row on ``gpu`` (:class:`Parts`)."""
    gemms, activation, floor = [], [], []
    peak = load_hardware(gpu).hbm.bandwidth
    p_blend = math.inf
    for _, row in rows.iterrows():
        cm = _cost_model(gpu, row.model, int(row.tp), str(row["dtype"]))  # not row.dtype
        _check_shape(cm, row)
        m, moe = cm.model, cm.model.moe
        assert moe is not None
        tokens = int(row.tokens)
        width = (3.0 if m.gated_mlp else 2.0) * moe.expert_intermediate * m.act_bytes
        kernels = cm.params.kernels
        act = None if kernels is None else kernels.activation
        gemms.append(cm.routed_experts_parts(tokens))
        activation.append(cm.kernel_time(act, tokens * moe.top_k, width) if act else 0.0)
        touched = moe.experts * (1.0 - (1.0 - moe.top_k / moe.experts) ** tokens)
        weights = sum(i * o for i, o in m.mlp_gemms(moe.expert_intermediate)) * m.dtype_bytes
        floor.append(touched * weights / peak)
        p_blend = cm.params.gemm_blend
    return Parts(gemms, p_blend, np.asarray(activation), np.asarray(floor))


def _seconds(rows: pd.DataFrame) -> np.ndarray:
    return rows.time_us.to_numpy(dtype=np.float64) * 1e-6


def _latency(dense: np.ndarray, activation: np.ndarray, t: np.ndarray) -> float:
    """The l ≥ 0 minimising Σ ((activation + dense + l) / t - 1)² (closed form)."""
    x = 1.0 / t
    y = 1.0 - (activation + dense) / t
    return max(0.0, float(np.dot(x, y) / np.dot(x, x)))


def solve(pieces: Parts, t: np.ndarray, latency: bool = True) -> tuple[float, float, float]:
    """(e_x, e_xm, l_x) minimising Σ ((activation + Σ blend(c/e_x, m/e_xm) + l) / t - 1)²,
    l ≥ 0 (``latency`` False: l = 0). The efficiencies are searched in log space from the
    best of a coarse grid; l is the closed-form optimum at each."""

    def lat(e: float, em: float) -> float:
        return _latency(pieces.dense(e, em), pieces.activation, t) if latency else 0.0

    def residuals(x: np.ndarray) -> np.ndarray:
        e, em = np.exp(x)
        return (pieces.activation + pieces.dense(e, em) + lat(e, em)) / t - 1.0

    grid = np.log([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0])
    start = min(
        ((a, b) for a in grid for b in grid),
        key=lambda x: float(np.sum(residuals(np.asarray(x)) ** 2)),
    )
    best = least_squares(residuals, np.asarray(start), bounds=(np.log(0.05), np.log(10.0)))
    e, em = (float(v) for v in np.exp(best.x))
    return e, em, lat(e, em)


def fitted_rows(gpu: str, path: Path = DATA) -> pd.DataFrame:
    """``gpu``'s tuned-config rows."""
    rows = load_points(path)
    return rows[(rows.gpu == gpu) & rows.kernel.str.endswith(FITTED)]


def fit(gpu: str = "h100-sxm", path: Path = DATA, latency: bool = True) -> MoeFit:
    """Fit ``gpu``'s tuned-config rows (those above the HBM floor), all shapes at once,
    against its own profile; ``latency`` False: no fixed call time."""
    rows = fitted_rows(gpu, path)
    if rows.empty:
        raise ValueError(f"{path.name} has no tuned-config rows for {gpu}")
    pieces = parts(rows, gpu)
    t = _seconds(rows)
    keep = t > pieces.floor
    rows, t = rows[keep], t[keep]
    pieces = Parts(
        [g for g, k in zip(pieces.gemms, keep, strict=True) if k],
        pieces.blend,
        pieces.activation[keep],
        pieces.floor[keep],
    )
    e, em, lat = solve(pieces, t, latency)
    errors = (pieces.activation + pieces.dense(e, em) + lat) / t - 1.0
    bare = (pieces.activation + pieces.dense()) / t - 1.0
    return MoeFit(gpu, e, em, lat, shape_names(rows), rows.tokens.to_numpy(), errors, bare)


def checks(gpu: str, path: Path = DATA) -> pd.DataFrame:
    """``gpu``'s rows that are not fitted, against the profile's own ``moe_gemm``,
    ``moe_gemm_memory`` and ``moe_latency``: shape, tokens, measured and predicted
    microseconds, relative error, and whether the row lies below the HBM floor (L2-resident
    weights; its error is not a check of the model)."""
    rows = load_points(path)
    rows = rows[(rows.gpu == gpu) & ~rows.kernel.str.endswith(FITTED)]
    columns = ["shape", "tokens", "measured_us", "predicted_us", "error", "below_floor"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    eff = load_hardware(gpu).efficiency
    pieces = parts(rows, gpu)
    predicted = (
        pieces.dense(eff.moe_gemm, eff.moe_gemm_memory) + pieces.activation + eff.moe_latency
    )
    t = _seconds(rows)
    return pd.DataFrame(
        {
            "shape": shape_names(rows),
            "tokens": rows.tokens.to_numpy(),
            "measured_us": t * 1e6,
            "predicted_us": predicted * 1e6,
            "error": predicted / t - 1.0,
            "below_floor": t <= pieces.floor,
        }
    )


def below_floor(gpu: str, path: Path = DATA) -> pd.DataFrame:
    """``gpu``'s tuned rows left out of its fit: faster than the HBM floor."""
    rows = fitted_rows(gpu, path)
    if rows.empty:
        return rows
    return rows[_seconds(rows) <= parts(rows, gpu).floor]


def _summary(errors: np.ndarray) -> str:
    a = np.abs(errors)
    return f"max {a.max():.1%}, median {np.median(a):.1%}"


def main() -> None:
    """Print the fit of every GPU with tuned-config rows, its error table by table and point by
    point, then the other rows as checks against each profile's values."""
    points = load_points()
    for gpu in sorted(points[points.kernel.str.endswith(FITTED)].gpu.unique()):
        f = fit(gpu)
        eff = load_hardware(gpu).efficiency
        print(
            f"{gpu}: moe_gemm {f.efficiency:.4f}, moe_gemm_memory {f.memory:.4f}, "
            f"moe_latency {f.latency * 1e6:.2f} us ({_summary(f.errors)}; bare roofline: "
            f"{_summary(f.dense_errors)}); profile: {eff.moe_gemm}, {eff.moe_gemm_memory}, "
            f"{eff.moe_latency * 1e6:.2f} us"
        )
        for shape in dict.fromkeys(f.shapes):
            pick = f.shapes == shape
            print(f"  {shape}: {_summary(f.errors[pick])} over {pick.sum()} points")
            for n, e, d in zip(f.tokens[pick], f.errors[pick], f.dense_errors[pick], strict=True):
                print(f"    {n:>5} tokens: {e:+.1%} (bare {d:+.1%})")
        for r in below_floor(gpu).itertuples():
            # the replayed layer's weights sat in the L2 cache: not the HBM-bound call kvsim prices
            print(
                f"  left out, below the HBM floor (L2-resident): {r.tokens} tokens, {r.time_us} us"
            )
    for gpu in sorted(points.gpu.unique()):
        c = checks(gpu)
        if c.empty:
            continue
        eff = load_hardware(gpu).efficiency
        print(
            f"{gpu} checks (not fitted; profile moe_gemm {eff.moe_gemm}, moe_gemm_memory "
            f"{eff.moe_gemm_memory}, moe_latency {eff.moe_latency * 1e6:.2f} us):"
        )
        for shape in dict.fromkeys(c["shape"]):
            part = c[c["shape"] == shape]
            errors = part.error[~part.below_floor].to_numpy()
            print(f"  {shape}: {_summary(errors)} over {len(errors)} points")
            for r in part.itertuples():
                note = " (below the HBM floor: L2-resident, not a check)" if r.below_floor else ""
                print(
                    f"    {r.tokens:>5} tokens: {r.measured_us:8.2f} us measured, "
                    f"{r.predicted_us:8.2f} predicted ({r.error:+.1%}){note}"
                )


if __name__ == "__main__":
    main()
