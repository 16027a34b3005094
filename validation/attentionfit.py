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
peaks. A row measured on a card with no profile (``OTHER_CARDS``) joins the fit of the profile
of its die, against its own card's peak: the fit is a fraction of peak, which the profile
carries. ``python -m validation.attentionfit`` prints every profile's fit and its error on the
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
class OtherCard:
    """A card measured in the data that has no hardware profile: the profile whose fit its
    rows join (same die, same kernels) and its own dense BF16/FP16 tensor peak."""

    profile: str
    bf16_flops: float


# RTX A5000: GA102 with 8192 CUDA cores (64 SMs) and 27.77 TFLOPS FP32
# (huggingface.co/datasets/ohdoking/gpu_spec, data/nvidia_gpu.csv: "NVIDIA,NVIDIA RTX
# A5000,24,230,8192,27.77,Ampere"); (calc) a professional GA102's dense FP16/BF16 tensor rate
# with FP32 accumulate is 4x its FP32 rate (A40: 37.42 -> 149.67, hardware_profiles/a40.yaml
# [A2]), so 4 x 27.77 = 111.08 TFLOP/s.
OTHER_CARDS = {"rtx-a5000": OtherCard(profile="a40", bf16_flops=4 * 27.77e12)}


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


def fit_prefill(
    rows: pd.DataFrame, peak_flops: float | np.ndarray
) -> tuple[float, int, np.ndarray]:
    """(efficiency, extra keys, relative errors) of the prefill rows; ``peak_flops`` is the
    peak of the card each row ran on (one for all, or one per row)."""
    t = prefill_seconds(rows)
    per_pair = (4.0 * rows.heads * rows.head_dim).to_numpy(dtype=np.float64) / peak_flops
    queries = (rows.batch * rows.seqlen).to_numpy(dtype=np.float64)
    cached = rows.cached.to_numpy(dtype=np.float64) if "cached" in rows else 0.0
    pairs = queries * (cached + (rows.seqlen + 1.0).to_numpy() / 2.0)
    slope, extra_slope = _relative_lstsq([pairs * per_pair, queries * per_pair], t)
    efficiency = 1.0 / slope
    extra = round(float(extra_slope / slope))
    predicted = (pairs + queries * extra) * per_pair / efficiency
    return efficiency, extra, np.asarray(predicted / t - 1.0)


def fit_decode(
    rows: pd.DataFrame, bandwidth: float | np.ndarray
) -> tuple[float, float, np.ndarray]:
    """(efficiency, latency, relative errors) of the decode rows; ``bandwidth`` is the peak of
    the card each row ran on (one for all, or one per row)."""
    t = rows.time_us.to_numpy() * 1e-6
    kv = decode_bytes(rows) / bandwidth
    latency, slope = _relative_lstsq([np.ones_like(t), kv], t)
    predicted = latency + kv * slope
    return 1.0 / slope, float(latency), predicted / t - 1.0


def _profile_of(card: str) -> str:
    return OTHER_CARDS[card].profile if card in OTHER_CARDS else card


def _peaks(cards: pd.Series, profile: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row's card's BF16 peak and bandwidth (the profile's for its own rows); a card
    without a profile has no bandwidth here, so it may not give decode rows."""
    hw = load_hardware(profile)
    flops = np.array([
        OTHER_CARDS[c].bf16_flops if c in OTHER_CARDS else hw.compute.bf16_flops for c in cards
    ])  # fmt: skip
    bandwidth = np.array([np.nan if c in OTHER_CARDS else hw.hbm.bandwidth for c in cards])
    return flops, bandwidth


def fit(gpu: str = "h100-sxm", path: Path = DATA) -> AttentionFit:
    """Fit the rows of profile ``gpu`` (its own and those of ``OTHER_CARDS`` that join it),
    each against the peaks of the card it ran on."""
    points = load_points(path)
    rows = points[points.gpu.map(_profile_of) == gpu]
    for kind in ("prefill", "decode"):
        if not (rows.kind == kind).any():
            raise ValueError(f"{path.name} has no {kind} rows for {gpu}")
    prefill, decode = rows[rows.kind == "prefill"], rows[rows.kind == "decode"]
    flops, _ = _peaks(prefill.gpu, gpu)
    _, bandwidth = _peaks(decode.gpu, gpu)
    if np.isnan(bandwidth).any():
        raise ValueError(f"{path.name}: decode rows of a card without a profile for {gpu}")
    e_a, extra, prefill_errors = fit_prefill(prefill, flops)
    e_d, l_d, decode_errors = fit_decode(decode, bandwidth)
    return AttentionFit(gpu, e_a, extra, e_d, l_d, prefill_errors, decode_errors)


def main() -> None:
    """Print the fit of every profile in the data."""
    for gpu in sorted(load_points().gpu.map(_profile_of).unique()):
        f = fit(gpu)
        print(
            f"{gpu}: attention {f.prefill_efficiency:.4f}, attention_extra_keys {f.extra_keys}"
            f" (max error {np.abs(f.prefill_errors).max():.1%}); decode_attention "
            f"{f.decode_efficiency:.4f}, decode_attention_latency {f.decode_latency_s * 1e6:.2f}us"
            f" (max error {np.abs(f.decode_errors).max():.1%})"
        )


if __name__ == "__main__":
    main()
