"""The hardware profiles' attention parameters, refitted from published kernel benchmarks.

``validation/data/attention_kernels.csv`` holds the data points (each row with its source):
prefill (flash) attention's TFLOP/s by sequence length, decode (paged) attention's time by
KV length. The fits use the cost model's own equations (``docs/cost-model.md``):

- prefill, one call over sequences of ``s`` new tokens after ``c`` cached ones:
  ``t = Σ s·(c + (s + 1)/2 + x) · 4·H·d / (F·e_a)``, so ``e_a`` and the extra keys ``x``
  each query token costs (``efficiency.attention``, ``efficiency.attention_extra_keys``);
- decode, one call reading ``K`` bytes of KV: ``t = l_d + K / (B·e_d)``
  (``efficiency.decode_attention_latency``, ``efficiency.decode_attention``).

Both are linear least squares in relative error, each GPU's rows against its own profile's
peaks. ``python -m validation.attentionfit`` prints every GPU's fit and its error on the
points.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.config import load_hardware

DATA = Path(__file__).parent / "data" / "attention_kernels.csv"
KV_BYTES = 2.0  # bf16 K and V


@dataclass(frozen=True)
class AttentionFit:
    """Fitted attention parameters of one GPU and their error on the points fitted."""

    gpu: str
    prefill_efficiency: float
    extra_keys: int
    decode_efficiency: float
    decode_latency_s: float
    prefill_errors: np.ndarray  # relative, predicted / measured - 1
    decode_errors: np.ndarray


def load_points(path: Path = DATA) -> pd.DataFrame:
    """The benchmark rows (comment lines skipped; a blank ``cached`` is no cache)."""
    points = pd.read_csv(path, comment="#")
    points["cached"] = points["cached"].fillna(0)
    return points


def prefill_seconds(rows: pd.DataFrame) -> np.ndarray:
    """Measured time of each prefill row: its ``time_us`` where given, else its FLOPs (the
    FlashAttention papers' count, ``4·b·H·s²·d / 2`` causal, no cache) over its TFLOP/s."""
    flops = 4.0 * rows.batch * rows.heads * rows.seqlen**2 * rows.head_dim / 2.0
    from_rate = flops / (rows.tflops * 1e12)
    if "time_us" not in rows:
        return from_rate.to_numpy(dtype=np.float64)
    return (rows.time_us * 1e-6).fillna(from_rate).to_numpy(dtype=np.float64)


def decode_bytes(rows: pd.DataFrame) -> np.ndarray:
    """KV bytes one decode call reads, as the cost model counts them (K and V of every
    attended token, every KV head)."""
    per_token = 2.0 * rows.kv_heads * rows.head_dim * KV_BYTES
    return (rows.batch * rows.seqlen * per_token).to_numpy(dtype=np.float64)


def _relative_lstsq(columns: list[np.ndarray], measured: np.ndarray) -> np.ndarray:
    """Coefficients of ``measured ≈ Σ c_i · column_i`` minimising relative error."""
    a = np.column_stack(columns) / measured[:, None]
    coef, *_ = np.linalg.lstsq(a, np.ones_like(measured), rcond=None)
    return coef


def fit_prefill(rows: pd.DataFrame, peak_flops: float) -> tuple[float, int, np.ndarray]:
    """(efficiency, extra keys, relative errors) of the prefill rows."""
    t = prefill_seconds(rows)
    per_pair = 4.0 * rows.heads * rows.head_dim
    queries = (rows.batch * rows.seqlen).to_numpy(dtype=np.float64)
    cached = rows.cached.to_numpy(dtype=np.float64) if "cached" in rows else 0.0
    pairs = queries * (cached + (rows.seqlen + 1.0).to_numpy() / 2.0)
    slope, extra_slope = _relative_lstsq([pairs * per_pair, queries * per_pair], t)
    efficiency = 1.0 / (slope * peak_flops)
    extra = round(float(extra_slope / slope))
    predicted = (pairs + queries * extra) * per_pair / (peak_flops * efficiency)
    return efficiency, extra, np.asarray(predicted / t - 1.0)


def fit_decode(rows: pd.DataFrame, bandwidth: float) -> tuple[float, float, np.ndarray]:
    """(efficiency, latency, relative errors) of the decode rows."""
    t = rows.time_us.to_numpy() * 1e-6
    kv = decode_bytes(rows)
    latency, slope = _relative_lstsq([np.ones_like(t), kv], t)
    predicted = latency + kv * slope
    return 1.0 / (slope * bandwidth), float(latency), predicted / t - 1.0


def fit(gpu: str = "h100-sxm", path: Path = DATA) -> AttentionFit:
    """Fit ``gpu``'s rows against the peaks of its hardware profile."""
    points = load_points(path)
    rows = points[points.gpu == gpu]
    for kind in ("prefill", "decode"):
        if not (rows.kind == kind).any():
            raise ValueError(f"{path.name} has no {kind} rows for {gpu}")
    hw = load_hardware(gpu)
    e_a, extra, prefill_errors = fit_prefill(rows[rows.kind == "prefill"], hw.compute.bf16_flops)
    e_d, l_d, decode_errors = fit_decode(rows[rows.kind == "decode"], hw.hbm.bandwidth)
    return AttentionFit(gpu, e_a, extra, e_d, l_d, prefill_errors, decode_errors)


def main() -> None:
    """Print the fit of every GPU in the data."""
    for gpu in sorted(load_points().gpu.unique()):
        f = fit(gpu)
        print(
            f"{gpu}: attention {f.prefill_efficiency:.4f}, attention_extra_keys {f.extra_keys}"
            f" (max error {np.abs(f.prefill_errors).max():.1%}); decode_attention "
            f"{f.decode_efficiency:.4f}, decode_attention_latency {f.decode_latency_s * 1e6:.2f}us"
            f" (max error {np.abs(f.decode_errors).max():.1%})"
        )


if __name__ == "__main__":
    main()
