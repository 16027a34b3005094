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
peaks. A row measured on a card with no profile (``OTHER_CARDS``), or on a card whose rows
join another profile's fit (``POOLED``), joins the fit of the profile of its die, against its
own card's peaks: the fit is a fraction of peak, which the profile carries. Rows of role
``check`` are priced by the fit and reported, not fitted. ``python -m validation.attentionfit``
prints every profile's fit and its error on the points.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.config import load_hardware
from validation.fit import read_data

DATA = Path(__file__).parent / "data" / "attention_kernels.csv"
KV_BYTES = 2.0  # bf16 K and V
ROLES = ("fit", "check")  # fitted, or priced by the fit and reported


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

# Cards with a profile of their own whose rows join another profile's fit (same die and
# kernels), each priced at its own profile's peaks: the H100 PCIe's FlashAttention-3 decode
# rows are the Hopper decode fit that h100-sxm (and the Hopper profiles after it) carries.
POOLED = {"h100-pcie": "h100-sxm"}


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
    decode_checks: np.ndarray  # the check rows' errors under the fit
    prefill_checks: np.ndarray


def load_points(path: Path = DATA) -> pd.DataFrame:
    """The benchmark rows (comment lines skipped; a blank ``cached`` is no cache; ``role``
    is ``fit`` or ``check``)."""
    points = read_data(path)
    points["cached"] = points["cached"].fillna(0)
    bad = points[~points.role.isin(ROLES)]
    if len(bad):
        raise ValueError(
            f"{path.name}, data row {int(bad.index[0]) + 1}: role {bad.role.iloc[0]!r};"
            f" expected one of {', '.join(ROLES)}"
        )
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
    pairs, queries = _prefill_terms(rows, peak_flops)
    slope, extra_slope = _relative_lstsq([pairs, queries], prefill_seconds(rows))
    efficiency, extra = 1.0 / slope, round(float(extra_slope / slope))
    return efficiency, extra, prefill_errors_at(rows, peak_flops, efficiency, extra)


def _prefill_terms(
    rows: pd.DataFrame, peak_flops: float | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Seconds at full peak of each prefill row's attended (query, key) pairs and of one key
    per query token: the fit's two columns."""
    per_pair = (4.0 * rows.heads * rows.head_dim).to_numpy(dtype=np.float64) / peak_flops
    queries = (rows.batch * rows.seqlen).to_numpy(dtype=np.float64)
    cached = rows.cached.to_numpy(dtype=np.float64) if "cached" in rows else 0.0
    pairs = queries * (cached + (rows.seqlen + 1.0).to_numpy() / 2.0)
    return pairs * per_pair, queries * per_pair


def prefill_errors_at(
    rows: pd.DataFrame, peak_flops: float | np.ndarray, efficiency: float, extra: int
) -> np.ndarray:
    """Relative errors of prefill rows priced with the given efficiency and extra keys."""
    pairs, queries = _prefill_terms(rows, peak_flops)
    return np.asarray((pairs + queries * extra) / efficiency / prefill_seconds(rows) - 1.0)


def fit_decode(
    rows: pd.DataFrame, bandwidth: float | np.ndarray
) -> tuple[float, float, np.ndarray]:
    """(efficiency, latency, relative errors) of the decode rows; ``bandwidth`` is the peak of
    the card each row ran on (one for all, or one per row)."""
    t = rows.time_us.to_numpy() * 1e-6
    latency, slope = _relative_lstsq([np.ones_like(t), decode_bytes(rows) / bandwidth], t)
    efficiency, latency = 1.0 / slope, float(latency)
    return efficiency, latency, decode_errors_at(rows, bandwidth, efficiency, latency)


def _profile_of(card: str) -> str:
    if card in OTHER_CARDS:
        return OTHER_CARDS[card].profile
    return POOLED.get(card, card)


def _peaks(cards: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Each row's card's BF16 peak and bandwidth (its own profile's); a card without a
    profile has no bandwidth here, so it may not give decode rows."""
    flops, bandwidth = [], []
    for card in cards:
        if card in OTHER_CARDS:
            flops.append(OTHER_CARDS[card].bf16_flops)
            bandwidth.append(np.nan)
        else:
            hw = load_hardware(card)
            flops.append(hw.compute.bf16_flops)
            bandwidth.append(hw.hbm.bandwidth)
    return np.array(flops), np.array(bandwidth)


def fit(gpu: str = "h100-sxm", path: Path = DATA) -> AttentionFit:
    """Fit the rows of profile ``gpu`` (its own and those of ``OTHER_CARDS`` and ``POOLED``
    cards that join it), each against the peaks of the card it ran on."""
    points = load_points(path)
    rows = points[points.gpu.map(_profile_of) == gpu]
    fitted = rows[rows.role == "fit"]
    for kind in ("prefill", "decode"):
        if not (fitted.kind == kind).any():
            raise ValueError(f"{path.name} has no {kind} rows to fit for {gpu}")
    prefill, decode = fitted[fitted.kind == "prefill"], fitted[fitted.kind == "decode"]
    flops, _ = _peaks(prefill.gpu)
    _, bandwidth = _peaks(decode.gpu)
    if np.isnan(bandwidth).any():
        raise ValueError(f"{path.name}: decode rows of a card without a profile for {gpu}")
    e_a, extra, prefill_errors = fit_prefill(prefill, flops)
    e_d, l_d, decode_errors = fit_decode(decode, bandwidth)
    checks = rows[rows.role == "check"]
    prefill_checks, decode_checks = (
        checks[checks.kind == "prefill"],
        checks[checks.kind == "decode"],
    )
    return AttentionFit(
        gpu, e_a, extra, e_d, l_d, prefill_errors, decode_errors,
        decode_errors_at(decode_checks, _peaks(decode_checks.gpu)[1], e_d, l_d),
        prefill_errors_at(prefill_checks, _peaks(prefill_checks.gpu)[0], e_a, extra),
    )  # fmt: skip


def decode_errors_at(
    rows: pd.DataFrame, bandwidth: np.ndarray, efficiency: float, latency: float
) -> np.ndarray:
    """Relative errors of decode rows priced with the given efficiency and latency."""
    predicted = latency + decode_bytes(rows) / (bandwidth * efficiency)
    return predicted / (rows.time_us.to_numpy() * 1e-6) - 1.0


def main() -> None:
    """Print the fit of every profile in the data."""
    for gpu in sorted(load_points().gpu.map(_profile_of).unique()):
        f = fit(gpu)
        print(
            f"{gpu}: attention {f.prefill_efficiency:.4f}, attention_extra_keys {f.extra_keys}"
            f" (max error {np.abs(f.prefill_errors).max():.1%}); decode_attention "
            f"{f.decode_efficiency:.4f}, decode_attention_latency {f.decode_latency_s * 1e6:.2f}us"
            f" (max error {np.abs(f.decode_errors).max():.1%})"
            + "".join(
                f"; {kind} check rows {_span(errors)}"
                for kind, errors in (("prefill", f.prefill_checks), ("decode", f.decode_checks))
                if len(errors)
            )
        )


def _span(errors: np.ndarray) -> str:
    return f"{errors.min():+.1%} .. {errors.max():+.1%}"


if __name__ == "__main__":
    main()
