"""Vidur's wide tables become long rows with shapes computed by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from sim.cost.optables import read_tables, vidur_to_long
from sim.errors import KvsimError

OPS = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)


def vidur_row(tokens: int, tp: int = 1, gated: bool = True, ms: float = 0.5) -> dict:
    """One wide row: Llama-2-70B shapes (64 heads, 8 KV heads, 8192 hidden, 28672 FFN)."""
    row = {f"time_stats.{op}.{s}": ms for op in OPS for s in ("min", "max", "mean", "median")}
    row |= {f"time_stats.{op}.std": 0.01 for op in OPS}
    return row | {
        "n_head": 64,
        "n_kv_head": 8,
        "n_embd": 8192,
        "n_expanded_embd": 28672,
        "vocab_size": 32000,
        "use_gated_mlp": gated,
        "num_tokens": tokens,
        "num_tensor_parallel_workers": tp,
    }


def test_gemm_shapes_and_row_bytes_by_hand():
    long = vidur_to_long(pd.DataFrame([vidur_row(16)]), "llama", "<t>").set_index("op")
    # QKV: 8192 -> 64*128 + 2*8*128 = 10240; up+gate: 2 x 28672
    assert tuple(long.loc["attn_pre_proj", ["fan_in", "fan_out"]]) == (8192, 10240)
    assert tuple(long.loc["attn_post_proj", ["fan_in", "fan_out"]]) == (8192, 8192)
    assert tuple(long.loc["mlp_up_proj", ["fan_in", "fan_out"]]) == (8192, 57344)
    assert tuple(long.loc["mlp_down_proj", ["fan_in", "fan_out"]]) == (28672, 8192)
    # bytes per token row at 2 B: norm 2x8192x2, rope 2x(64+8)x128x2, act 3x28672x2, add 3x8192x2
    assert long.loc["input_layernorm", "row_bytes"] == 32768
    assert long.loc["attn_rope", "row_bytes"] == 36864
    assert long.loc["mlp_act", "row_bytes"] == 172032
    assert long.loc["add", "row_bytes"] == 49152
    assert long.loc["mlp_up_proj", "time_s"] == pytest.approx(0.5e-3)  # ms -> s
    assert not long.loc["emb", "per_layer"] and long.loc["add", "per_layer"]


def test_tensor_parallel_shards_and_ungated_mlp():
    long = vidur_to_long(pd.DataFrame([vidur_row(16, tp=4, gated=False)]), "m", "<t>")
    long = long.set_index("op")
    assert tuple(long.loc["attn_pre_proj", ["fan_in", "fan_out"]]) == (8192, 2560)
    assert tuple(long.loc["mlp_up_proj", ["fan_in", "fan_out"]]) == (8192, 7168)
    assert long.loc["mlp_act", "row_bytes"] == 2 * 7168 * 2


def test_missing_op_is_skipped_and_bad_time_refused(tmp_path):
    table = pd.DataFrame([vidur_row(1)])
    table = table.drop(columns=[c for c in table.columns if "post_attention" in c])
    assert "post_attention_layernorm" not in set(vidur_to_long(table, "phi", "<t>").op)
    bad = pd.DataFrame([vidur_row(8, ms=0.0)])
    with pytest.raises(KvsimError, match="at 8 tokens has median time 0 ms"):
        vidur_to_long(bad, "m", "bad.csv")
    with pytest.raises(KvsimError, match="missing columns"):
        vidur_to_long(pd.DataFrame({"x": [1]}), "m", "x.csv")
    with pytest.raises(KvsimError, match="no measured tables for gpu 'h100'"):
        read_tables(tmp_path, "h100")


def test_directory_mixes_vidur_and_long_tables(tmp_path):
    (tmp_path / "h100").mkdir()
    pd.DataFrame([vidur_row(1), vidur_row(2)]).to_csv(tmp_path / "h100" / "m.csv", index=False)
    long = vidur_to_long(pd.DataFrame([vidur_row(4)]), "other", "<t>")
    long.to_csv(tmp_path / "h100" / "other.long.csv", index=False)
    table = read_tables(tmp_path, "h100")
    assert sorted(table.model.unique()) == ["m", "other"]
    assert len(table) == 3 * len(OPS)
