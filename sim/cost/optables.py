"""Measured operator times as one long table: one row per (op, shape, token count).

Two sources share the format: Vidur's published ``mlp.csv`` profiling tables (one wide row
per token count, milliseconds per layer; ``../shared/calibration/README.md``) and the raw
measurements ``validation.microbench`` writes (which add attention, copy and LM-head rows).
The fit (``validation.opsfit``) and the table cost model (``sim.cost.tables``) read only the
long format.

Long-format columns: ``model`` (the shape's name), ``kind`` (``gemm``, or a kernel of
:data:`KERNEL_KINDS`), ``op`` (the source's operator name), ``tokens`` (rows of the
operator), ``fan_in``/``fan_out`` (GEMMs), ``row_bytes`` (kernels: bytes one token row
reads and writes), ``tp``, ``time_s`` (median), ``time_std_s``, ``per_layer`` (the op is
part of a layer's time, not once per step), ``source``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import KvsimError

KERNEL_KINDS = ("norm", "rope", "activation", "residual_add", "embedding")
LONG_COLUMNS = (
    "model",
    "kind",
    "op",
    "tokens",
    "fan_in",
    "fan_out",
    "row_bytes",
    "tp",
    "time_s",
    "time_std_s",
    "per_layer",
    "source",
)
VIDUR_SHAPE = (
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
)
VIDUR_DTYPE_BYTES = 2.0  # fp16/bf16 (README of the tables)
GPU_FOLDERS = ("h100", "a100")


def _vidur_ops(d: pd.DataFrame) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    """Vidur column stem -> (kind, shape columns) for one table (arrays over its rows)."""
    tp = d.num_tensor_parallel_workers.to_numpy()
    hidden = d.n_embd.to_numpy()
    head_dim = hidden // d.n_head.to_numpy()
    q = d.n_head.to_numpy() * head_dim // tp
    kv = d.n_kv_head.to_numpy() * head_dim // tp
    ffn = d.n_expanded_embd.to_numpy() // tp
    gated = d.use_gated_mlp.astype(bool).to_numpy()
    b = VIDUR_DTYPE_BYTES
    return {
        "attn_pre_proj": ("gemm", {"fan_in": hidden, "fan_out": q + 2 * kv}),
        "attn_post_proj": ("gemm", {"fan_in": q, "fan_out": hidden}),
        "mlp_up_proj": ("gemm", {"fan_in": hidden, "fan_out": np.where(gated, 2, 1) * ffn}),
        "mlp_down_proj": ("gemm", {"fan_in": ffn, "fan_out": hidden}),
        "input_layernorm": ("norm", {"row_bytes": 2 * hidden * b}),
        "post_attention_layernorm": ("norm", {"row_bytes": 2 * hidden * b}),
        "attn_rope": ("rope", {"row_bytes": 2 * (q + kv) * b}),
        "mlp_act": ("activation", {"row_bytes": np.where(gated, 3, 2) * ffn * b}),
        "add": ("residual_add", {"row_bytes": 3 * hidden * b}),
        "emb": ("embedding", {"row_bytes": 2 * hidden * b}),
    }


def vidur_to_long(table: pd.DataFrame, model: str, source: str) -> pd.DataFrame:
    """One Vidur ``mlp.csv`` table (wide, ms per layer) as long-format rows (seconds)."""
    missing = [c for c in VIDUR_SHAPE if c not in table.columns]
    if missing:
        raise KvsimError(f"{source}: not a Vidur mlp.csv table: missing columns {missing}")
    parts = []
    for op, (kind, shape) in _vidur_ops(table).items():
        column = f"time_stats.{op}.median"
        if column not in table.columns:  # phi-2 (parallel block) has no post-attention norm
            continue
        part = pd.DataFrame(
            {
                "model": model,
                "kind": kind,
                "op": op,
                "tokens": table.num_tokens.to_numpy(),
                "fan_in": shape.get("fan_in", 0),
                "fan_out": shape.get("fan_out", 0),
                "row_bytes": shape.get("row_bytes", 0.0),
                "tp": table.num_tensor_parallel_workers.to_numpy(),
                "time_s": table[column].to_numpy() * 1e-3,
                "time_std_s": table[f"time_stats.{op}.std"].to_numpy() * 1e-3,
                "per_layer": kind != "embedding",
                "source": source,
            }
        )
        parts.append(part)
    long = pd.concat(parts, ignore_index=True)
    bad = ~(np.isfinite(long.time_s) & (long.time_s > 0))
    if bad.any():
        row = long[bad].iloc[0]
        raise KvsimError(
            f"{source}: op {row.op} at {row.tokens} tokens has median time "
            f"{float(row.time_s) * 1e3:g} ms; expected a positive number of milliseconds"
        )
    return long


def read_long(path: str | Path) -> pd.DataFrame:
    """A long-format measurement table (CSV or parquet) as written by the microbenchmarks."""
    path = Path(path)
    try:
        table = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise KvsimError(f"{path}: cannot read measurements: {exc}") from None
    missing = [c for c in LONG_COLUMNS if c not in table.columns]
    if missing:
        raise KvsimError(f"{path}: not a long-format measurement table: missing {missing}")
    return table


def read_tables(root: str | Path, gpu: str) -> pd.DataFrame:
    """Every table in ``ROOT/GPU/`` (or ROOT itself): Vidur ``mlp.csv`` files and long ones.

    A CSV with the long-format columns is read as is; any other must be a Vidur table.
    """
    root = Path(root)
    folder = root / gpu if (root / gpu).is_dir() else root
    files = sorted(folder.glob("*.csv")) + sorted(folder.glob("*.parquet"))
    if not files:
        raise KvsimError(
            f"{root}: no measured tables for gpu {gpu!r}; expected {folder}/MODEL.csv "
            "(Vidur mlp.csv format, ../shared/calibration/README.md) or long-format tables"
        )
    parts = []
    for path in files:
        if path.suffix == ".parquet":
            parts.append(read_long(path))
            continue
        try:
            table = pd.read_csv(path)
        except (OSError, ValueError) as exc:
            raise KvsimError(f"{path}: cannot read as CSV: {exc}") from None
        if set(LONG_COLUMNS) <= set(table.columns):
            parts.append(table)
        else:
            parts.append(vidur_to_long(table, path.stem, str(path)))
    return pd.concat(parts, ignore_index=True)


def read_measurements(path: str | Path) -> pd.DataFrame:
    """One table file (long format, or a Vidur ``mlp.csv``) or a folder of them, as long rows."""
    path = Path(path)
    if path.is_dir():
        if not any(path.glob("*.csv")) and not any(path.glob("*.parquet")):
            raise KvsimError(f"{path}: no measurement tables (*.csv, *.parquet) in this folder")
        return read_tables(path, "")
    if path.suffix == ".parquet":
        return read_long(path)
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise KvsimError(f"{path}: cannot read as CSV: {exc}") from None
    if set(LONG_COLUMNS) <= set(table.columns):
        return table
    return vidur_to_long(table, path.stem, str(path))
