"""The fused-MoE kernel's compute and weight-streaming speeds relative to the dense GEMM model
(``efficiency.moe_gemm``, ``efficiency.moe_gemm_memory``), its time per routed row
(``efficiency.moe_row_time``) and its fixed time per call (``efficiency.moe_latency``), fitted
from published kernel benchmarks.

``validation/data/moe_kernels.csv`` holds the points (each row with its source and quote):
the time of one ``fused_moe`` call by number of tokens, as vLLM's
``benchmarks/kernels/benchmark_moe.py`` prints it. One call is what the cost model prices as
one layer's routed experts (``CostModel.routed_experts_time``: each expert GEMM one roofline
over the touched experts, its FLOPs on the rows padded to the tile height, no per-GEMM
latency), the SiLU-and-mul over the routed rows (the calibrated activation kernel) and the
call's fixed time ``l_x`` (routing top-k, token sort, the top-k sum), so

    ``t = Σ_gemm blend(compute / e_x + rows · r_x, memory / e_xm) + activation + l_x``

with ``compute``, ``memory`` (``CostModel.routed_experts_parts``), ``rows`` (the padded rows,
``CostModel.routed_rows``) and ``activation`` from the GPU's own profile, each row's experts at
its ``dtype``. ``(e_x, e_xm, r_x, l_x)`` minimise the squared relative error over all of a
GPU's fitted rows (every shape at once; ``l_x`` is most of a one-token call, ``e_xm`` the
memory-bound decode sizes, ``e_x`` and ``r_x`` the compute-bound prefill sizes, which only
tables of different expert sizes tell apart: ``r_x`` costs a small expert's row as much as a
large one's); ``latency=False`` fixes ``l_x = 0``, ``row_time=False`` ``r_x = 0``. The tuned
rows of a GPU in :data:`POOLED` join another's fit (the same die and clocks; each row priced
on its own GPU's profile). Rows run with a tuned kernel config (``kernel`` ending ``-tuned``,
what vLLM serves when a config file exists) are fitted; the others (a default config, another
kernel) are printed as checks against the profile's own values. Two kinds of row are neither
fitted nor checked, only listed: a row faster than its touched experts' weights take at the
peak HBM bandwidth read them from the L2 cache (the benchmark replays one layer; serving
cycles through all of them), and a table's smallest calls that all take its one-token time
(within :data:`LAUNCH_SPREAD`) wait on the harness's kernel launches, not on the GPU.
``python -m validation.moefit`` prints each GPU's fit and its errors, table by table.
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
from validation.fit import read_data

DATA = Path(__file__).parent / "data" / "moe_kernels.csv"
FITTED = "-tuned"  # kernel suffix of the rows fitted
POOLED = {"h200-sxm": "h100-sxm"}  # H200: the H100's die and clocks, its own HBM
LAUNCH_SPREAD = 1.15  # a table's calls within 15% of its one-token time wait on launches


@dataclass(frozen=True)
class MoeFit:
    """``efficiency.moe_gemm``, ``moe_gemm_memory``, ``moe_row_time`` and ``moe_latency`` of one
    GPU and the errors on the points fitted."""

    gpu: str
    efficiency: float  # e_x, compute
    memory: float  # e_xm, weight streaming
    row_time: float  # r_x, seconds per padded routed row and expert GEMM
    latency: float  # seconds per fused-MoE call (one layer)
    shapes: np.ndarray  # "model tpN N=... dtype kernel" of each point
    tokens: np.ndarray
    errors: np.ndarray  # relative, predicted / measured - 1
    dense_errors: np.ndarray  # the same at e_x = e_xm = 1, l_x = 0 (the bare roofline)


@dataclass(frozen=True)
class Parts:
    """What the cost model prices for each benchmark row, before the four parameters."""

    gemms: list[list[tuple[float, float]]]  # per row: (compute, memory) seconds per GEMM
    blend: np.ndarray  # per row: its profile's gemm_blend p (inf: the hard max)
    activation: np.ndarray  # seconds
    floor: np.ndarray  # the touched experts' weights at the peak HBM bandwidth, seconds
    rows: np.ndarray  # the routed rows padded to the tile height

    def dense(self, efficiency: float = 1.0, memory: float = 1.0, row: float = 0.0) -> np.ndarray:
        """The routed GEMMs' seconds of each row at ``e_x``, ``e_xm``, ``r_x``."""
        return np.asarray(
            [
                sum(blend(c / efficiency + n * row, m / memory, p) for c, m in gemms)
                for gemms, n, p in zip(self.gemms, self.rows, self.blend, strict=True)
            ]
        )

    def pick(self, keep: np.ndarray) -> Parts:
        """The rows where ``keep`` is true."""
        gemms = [g for g, k in zip(self.gemms, keep, strict=True) if k]
        return Parts(
            gemms, self.blend[keep], self.activation[keep], self.floor[keep], self.rows[keep]
        )


def load_points(path: Path = DATA) -> pd.DataFrame:
    """The benchmark rows (comment lines skipped)."""
    return read_data(path)


def _cost_model(gpu: str, model: str, tp: int, dtype: str) -> CostModel:
    """The profile's cost model of one GPU's shard, the experts' weights at ``dtype``, before
    the fused-MoE parameters (``moe_gemm``, ``moe_gemm_memory`` 1, no row or call time)."""
    params = CostParams.from_hardware(load_hardware(gpu))
    spec = load_model(model)
    if spec.dtype != dtype:
        spec = spec.model_copy(update={"dtype": dtype})
    dense = dataclasses.replace(
        params,
        moe_gemm_efficiency=1.0,
        moe_memory_efficiency=1.0,
        moe_latency_s=0.0,
        moe_row_s=0.0,
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


def parts(rows: pd.DataFrame) -> Parts:
    """The cost model's pieces of each row, on the row's own GPU (:class:`Parts`)."""
    gemms, activation, floor, padded, p_blend = [], [], [], [], []
    for _, row in rows.iterrows():
        cm = _cost_model(row.gpu, row.model, int(row.tp), str(row["dtype"]))  # not row.dtype
        _check_shape(cm, row)
        m, moe = cm.model, cm.model.moe
        assert moe is not None
        tokens = int(row.tokens)
        width = (3.0 if m.gated_mlp else 2.0) * moe.expert_intermediate * m.act_bytes
        kernels = cm.params.kernels
        act = None if kernels is None else kernels.activation
        gemms.append(cm.routed_experts_parts(tokens))
        activation.append(cm.kernel_time(act, tokens * moe.top_k, width) if act else 0.0)
        touched, _, rows_padded = cm.routed_rows(tokens)
        weights = sum(i * o for i, o in m.mlp_gemms(moe.expert_intermediate)) * m.dtype_bytes
        floor.append(touched * weights / cm.params.hbm_bandwidth)
        padded.append(rows_padded)
        p_blend.append(cm.params.gemm_blend)
    return Parts(
        gemms, np.asarray(p_blend), np.asarray(activation), np.asarray(floor), np.asarray(padded)
    )


def _seconds(rows: pd.DataFrame) -> np.ndarray:
    return rows.time_us.to_numpy(dtype=np.float64) * 1e-6


def _latency(dense: np.ndarray, activation: np.ndarray, t: np.ndarray) -> float:
    """The l ≥ 0 minimising Σ ((activation + dense + l) / t - 1)² (closed form)."""
    x = 1.0 / t
    y = 1.0 - (activation + dense) / t
    return max(0.0, float(np.dot(x, y) / np.dot(x, x)))


def solve(
    pieces: Parts,
    t: np.ndarray,
    latency: bool = True,
    row_time: bool = True,
    memory_max: float = 10.0,
) -> tuple[float, float, float, float]:
    """(e_x, e_xm, r_x, l_x) minimising Σ ((activation + Σ blend(c/e_x + n·r_x, m/e_xm) + l) /
    t - 1)², r_x, l ≥ 0, e_xm ≤ ``memory_max`` (``latency`` False: l = 0; ``row_time`` False:
    r_x = 0). The efficiencies are searched in log space and r_x in nanoseconds from the eight
    best points of a coarse grid, the lowest minimum kept; l is the closed-form optimum at
    each."""

    def lat(e: float, em: float, r: float) -> float:
        if not latency:
            return 0.0
        return _latency(pieces.dense(e, em, r), pieces.activation, t)

    def unpack(x: np.ndarray) -> tuple[float, float, float]:
        return math.exp(x[0]), math.exp(x[1]), (x[2] * 1e-9 if row_time else 0.0)

    def residuals(x: np.ndarray) -> np.ndarray:
        e, em, r = unpack(x)
        return (pieces.activation + pieces.dense(e, em, r) + lat(e, em, r)) / t - 1.0

    grid = np.log([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0])
    rows = [(0.0,), (2.0,), (5.0,), (10.0,), (20.0,)] if row_time else [()]
    starts = sorted(
        ((a, b, *n) for a in grid for b in grid for n in rows),
        key=lambda x: float(np.sum(residuals(np.asarray(x)) ** 2)),
    )
    low = [np.log(0.05)] * 2 + [0.0] * row_time
    high = [np.log(10.0), np.log(memory_max)] + [1000.0] * row_time
    runs = (
        least_squares(residuals, np.minimum(x, np.asarray(high) - 1e-9), bounds=(low, high))
        for x in starts[:8]
    )
    best = min(runs, key=lambda run: run.cost)  # the landscape has local minima
    e, em, r = unpack(best.x)
    return e, em, r, lat(e, em, r)


def fitted_rows(gpu: str, path: Path = DATA) -> pd.DataFrame:
    """``gpu``'s tuned-config rows and those of the GPUs pooled into its fit (:data:`POOLED`)."""
    rows = load_points(path)
    gpus = {gpu} | {other for other, into in POOLED.items() if into == gpu}
    return rows[rows.gpu.isin(gpus) & rows.kernel.str.endswith(FITTED)]


def launch_bound(rows: pd.DataFrame) -> np.ndarray:
    """Which rows wait on the harness's kernel launches: in a table (GPU, shape, kernel) whose
    two-token call takes its one-token time (within :data:`LAUNCH_SPREAD`), the calls that
    take it too."""
    key = ["gpu", "model", "tp", "dtype", "kernel"]
    bound = np.zeros(len(rows), dtype=bool)
    for _, table in rows.groupby(key, sort=False):
        times = dict(zip(table.tokens, table.time_us, strict=True))
        if 1 in times and 2 in times and times[2] <= LAUNCH_SPREAD * times[1]:
            slow = table.time_us <= LAUNCH_SPREAD * times[1]
            bound[rows.index.get_indexer(table.index[slow.to_numpy()])] = True
    return bound


def _left_out(rows: pd.DataFrame, pieces: Parts) -> np.ndarray:
    """Rows neither fitted nor checked: below the HBM floor, or launch-bound."""
    return (_seconds(rows) <= pieces.floor) | launch_bound(rows)


def memory_max(rows: pd.DataFrame) -> float:
    """The largest e_xm no row's card streams faster than its peak HBM bandwidth at: its
    ``hbm.bandwidth`` over its dense GEMM's weight-streaming bandwidth, the least over the
    cards of ``rows``."""
    ratios = []
    for gpu in set(rows.gpu):
        hardware = load_hardware(gpu)
        ratios.append(hardware.hbm.bandwidth / CostParams.from_hardware(hardware).gemm_bandwidth)
    return min(ratios)


def fit(
    gpu: str = "h100-sxm", path: Path = DATA, latency: bool = True, row_time: bool = True
) -> MoeFit:
    """Fit ``gpu``'s tuned-config rows (:func:`fitted_rows`; those left out by
    :func:`_left_out` aside), all shapes at once, each row on its own GPU's profile;
    ``latency`` False: no fixed call time; ``row_time`` False: no time per row."""
    rows = fitted_rows(gpu, path)
    if rows.empty:
        raise ValueError(f"{path.name} has no tuned-config rows for {gpu}")
    pieces = parts(rows)
    keep = ~_left_out(rows, pieces)
    rows, pieces = rows[keep], pieces.pick(keep)
    t = _seconds(rows)
    e, em, r, lat = solve(pieces, t, latency, row_time, memory_max(rows))
    errors = (pieces.activation + pieces.dense(e, em, r) + lat) / t - 1.0
    bare = (pieces.activation + pieces.dense()) / t - 1.0
    return MoeFit(gpu, e, em, r, lat, shape_names(rows), rows.tokens.to_numpy(), errors, bare)


def checks(gpu: str, path: Path = DATA) -> pd.DataFrame:
    """``gpu``'s rows that are not fitted, against the profile's own ``moe_gemm``,
    ``moe_gemm_memory``, ``moe_row_time`` and ``moe_latency``: shape, tokens, measured and
    predicted microseconds, relative error, and whether the row is left out (below the HBM
    floor, L2-resident weights, or launch-bound; its error is not a check of the model)."""
    rows = load_points(path)
    rows = rows[(rows.gpu == gpu) & ~rows.kernel.str.endswith(FITTED)]
    columns = ["shape", "tokens", "measured_us", "predicted_us", "error", "left_out"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    eff = load_hardware(gpu).efficiency
    pieces = parts(rows)
    predicted = (
        pieces.dense(eff.moe_gemm, eff.moe_gemm_memory, eff.moe_row_time)
        + pieces.activation
        + eff.moe_latency
    )
    t = _seconds(rows)
    return pd.DataFrame(
        {
            "shape": shape_names(rows),
            "tokens": rows.tokens.to_numpy(),
            "measured_us": t * 1e6,
            "predicted_us": predicted * 1e6,
            "error": predicted / t - 1.0,
            "left_out": _left_out(rows, pieces),
        }
    )


def left_out(gpu: str, path: Path = DATA) -> pd.DataFrame:
    """``gpu``'s tuned rows left out of its fit: below the HBM floor or launch-bound."""
    rows = fitted_rows(gpu, path)
    if rows.empty:
        return rows
    return rows[_left_out(rows, parts(rows))]


def _summary(errors: np.ndarray) -> str:
    a = np.abs(errors)
    return f"max {a.max():.1%}, median {np.median(a):.1%}"


def main() -> None:
    """Print the fit of every GPU with tuned-config rows, its error table by table and point by
    point, then the other rows as checks against each profile's values."""
    points = load_points()
    tuned = points[points.kernel.str.endswith(FITTED)]
    for gpu in sorted(set(tuned.gpu) - set(POOLED)):
        f = fit(gpu)
        eff = load_hardware(gpu).efficiency
        pooled = sorted(g for g, into in POOLED.items() if into == gpu and g in set(tuned.gpu))
        joined = f" (with the {', '.join(pooled)} rows)" if pooled else ""
        print(
            f"{gpu}{joined}: moe_gemm {f.efficiency:.4f}, moe_gemm_memory {f.memory:.4f}, "
            f"moe_row_time {f.row_time * 1e9:.3f} ns, moe_latency {f.latency * 1e6:.2f} us "
            f"({_summary(f.errors)}; bare roofline: {_summary(f.dense_errors)}); profile: "
            f"{eff.moe_gemm}, {eff.moe_gemm_memory}, {eff.moe_row_time * 1e9:.3f} ns, "
            f"{eff.moe_latency * 1e6:.2f} us"
        )
        for shape in dict.fromkeys(f.shapes):
            pick = f.shapes == shape
            print(f"  {shape}: {_summary(f.errors[pick])} over {pick.sum()} points")
            for n, e, d in zip(f.tokens[pick], f.errors[pick], f.dense_errors[pick], strict=True):
                print(f"    {n:>5} tokens: {e:+.1%} (bare {d:+.1%})")
        for r in left_out(gpu).itertuples():
            # L2-resident weights or the harness's launches: not the call kvsim prices
            print(f"  left out ({r.gpu}, below the HBM floor or launch-bound): {r.tokens} "
                  f"tokens, {r.time_us} us")  # fmt: skip
    for gpu in sorted(points.gpu.unique()):
        c = checks(gpu)
        if c.empty:
            continue
        eff = load_hardware(gpu).efficiency
        print(
            f"{gpu} checks (not fitted; profile moe_gemm {eff.moe_gemm}, moe_gemm_memory "
            f"{eff.moe_gemm_memory}, moe_row_time {eff.moe_row_time * 1e9:.3f} ns, moe_latency "
            f"{eff.moe_latency * 1e6:.2f} us):"
        )
        for shape in dict.fromkeys(c["shape"]):
            part = c[c["shape"] == shape]
            errors = part.error[~part.left_out].to_numpy()
            print(f"  {shape}: {_summary(errors)} over {len(errors)} points")
            for r in part.itertuples():
                note = " (below the HBM floor or launch-bound: not a check)" if r.left_out else ""
                print(
                    f"    {r.tokens:>5} tokens: {r.measured_us:8.2f} us measured, "
                    f"{r.predicted_us:8.2f} predicted ({r.error:+.1%}){note}"
                )


if __name__ == "__main__":
    main()
