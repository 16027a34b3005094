"""Fit the tensor-parallel collective model to measured NCCL all-reduce times.

The tables (``shared/calibration/measured-comm/<gpu>/all_reduce.csv``, Vidur's) hold one
row per (message size, GPUs, placement) with the median time of one call. Rows within one
node (``devices_per_node == num_workers``: NVLink/NVSwitch) are fitted, in log space so that
every size weighs alike, over messages of at least :data:`FIT_MIN_BYTES`, to
:meth:`sim.cost.collectives.CollectiveParams.all_reduce_s` with the profile's interconnect
bandwidth held fixed. Below that size the tables time eager NCCL calls through
torch.distributed (launch and synchronisation, ~20-60 us); the fitted latency is that
regime's, which CUDA-graph decode with custom all-reduce kernels beats (docs/cost-model.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from sim.cost.collectives import CollectiveParams
from sim.errors import KvsimError
from validation.fit import read_data

FIT_MIN_BYTES = 2.0**20  # 1 MiB: a 64-token step of an 8192-wide model in bf16
COLUMNS = ("size", "num_workers", "devices_per_node", "time_stats.all_reduce.median")


@dataclass(frozen=True)
class CommFit:
    """The fitted all-reduce model and its error on the table."""

    params: CollectiveParams
    errors: pd.DataFrame  # workers, points, median_ape, p90_ape (messages >= FIT_MIN_BYTES)
    source: Path


def read_all_reduce(comm_dir: str | Path, gpu: str) -> tuple[pd.DataFrame, Path]:
    """Single-node all-reduce rows of one GPU's table: ``bytes``, ``workers``, ``time_s``."""
    path = Path(comm_dir) / gpu / "all_reduce.csv"
    if not path.is_file():
        raise KvsimError(f"{path}: no measured all-reduce table (expected Vidur's all_reduce.csv)")
    table = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise KvsimError(f"{path}: not a Vidur all_reduce.csv table: missing columns {missing}")
    node = table[table.num_workers == table.devices_per_node]
    frame = pd.DataFrame(
        {
            "bytes": node["size"].to_numpy(dtype=float),
            "workers": node.num_workers.to_numpy(dtype=int),
            "time_s": node["time_stats.all_reduce.median"].to_numpy(dtype=float) * 1e-3,
        }
    )
    return frame[frame.time_s > 0].reset_index(drop=True), path


def predict(params: CollectiveParams, rows: pd.DataFrame) -> np.ndarray:
    """The model's time for each row."""
    return np.array(
        [params.nccl_s(b, int(n)) for b, n in zip(rows.bytes, rows.workers, strict=True)]
    )


def _params(x: np.ndarray, bandwidth: float) -> CollectiveParams:
    latency_us, efficiency, half_mib, exponent = x
    return CollectiveParams(
        bandwidth=bandwidth,
        latency_s=latency_us * 1e-6,
        efficiency=efficiency,
        half_efficiency_bytes=half_mib * 2.0**20,
        workers_exponent=exponent,
    )


def errors_by_workers(params: CollectiveParams, rows: pd.DataFrame) -> pd.DataFrame:
    """Median and p90 absolute percentage error per GPU count, messages >= 1 MiB."""
    big = rows[rows.bytes >= FIT_MIN_BYTES]
    ape = np.abs(predict(params, big) / big.time_s.to_numpy() - 1.0)
    out = []
    for n in sorted(big.workers.unique()):
        part = ape[big.workers.to_numpy() == n]
        out.append(
            {
                "workers": int(n),
                "points": len(part),
                "median_ape": float(np.median(part)),
                "p90_ape": float(np.percentile(part, 90)),
            }
        )
    return pd.DataFrame(out)


def fit_comm(comm_dir: str | Path, gpu: str, bandwidth: float) -> CommFit:
    """Fit latency, efficiency, half-efficiency size and workers exponent for one GPU."""
    rows, path = read_all_reduce(comm_dir, gpu)
    big = rows[rows.bytes >= FIT_MIN_BYTES]
    if big.workers.nunique() < 2:
        raise KvsimError(f"{path}: expected single-node rows for at least two GPU counts")
    measured = np.log(big.time_s.to_numpy())

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(predict(_params(x, bandwidth), big)) - measured

    fit = least_squares(
        residual, x0=[20.0, 0.7, 1.0, 1.0], bounds=([0.0, 0.01, 0.0, 0.0], [1000.0, 1.0, 64.0, 2.0])
    )
    params = _params(fit.x, bandwidth)
    return CommFit(params=params, errors=errors_by_workers(params, rows), source=path)


# --- vLLM's custom all-reduce ---------------------------------------------------------------

CUSTOM_DATA = Path(__file__).parent / "data" / "custom_allreduce.csv"
CUSTOM_FACTOR = {  # bytes each GPU moves per byte of message, by kernel
    "one_stage": lambda n: n - 1.0,  # it reads every peer's buffer
    "two_stage": lambda n: 2.0 * (n - 1.0) / n,  # reduce-scatter, then all-gather
}


@dataclass(frozen=True)
class KernelFit:
    """One custom all-reduce kernel's fitted fixed time and rate, and its relative errors."""

    kernel: str
    latency_s: float
    bandwidth: float
    errors: np.ndarray


def fit_custom(gpu: str, path: Path = CUSTOM_DATA) -> dict[str, KernelFit]:
    """Each kernel's ``latency + factor(N)·M / bandwidth`` fitted to ``gpu``'s rows of
    ``custom_allreduce.csv``, least squares in relative error."""
    rows = read_data(path)
    rows = rows[rows.gpu == gpu]
    return {kernel: _fit_kernel(rows[rows.kernel == kernel], kernel) for kernel in CUSTOM_FACTOR}


def _fit_kernel(rows: pd.DataFrame, kernel: str) -> KernelFit:
    """One kernel's (latency, bandwidth) over its rows."""
    moved = CUSTOM_FACTOR[kernel](rows.workers.to_numpy(float)) * rows.bytes.to_numpy(float)
    t = rows.time_us.to_numpy(float) * 1e-6

    def residual(x: np.ndarray) -> np.ndarray:  # x: latency in us, bandwidth in GB/s
        return (x[0] * 1e-6 + moved / (x[1] * 1e9)) / t - 1.0

    x = least_squares(residual, x0=[5.0, 300.0], bounds=([0.0, 1.0], [100.0, 1e4])).x
    return KernelFit(kernel, x[0] * 1e-6, x[1] * 1e9, residual(x))
