"""The hit-rate overlay: engine sweep lines and replay lines of the same requests, drawn
from exactly the numbers of the tables and files it is given."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import yaml

import experiments
from experiments.plots import PlotOptions
from experiments.plots.overlay import (
    draw_overlay,
    overlay_data,
    overlay_figure,
    plot_hit_rate_overlay,
)
from experiments.runner import run_sweep
from experiments.sweep import load_sweep
from experiments.tasks import Limits
from sim.errors import KvsimError
from sim.replay import read_replay_trace, replay_table, write_csv

PNG = b"\x89PNG"


def lines(fig) -> dict[str, tuple[list[float], list[float]]]:
    """Every line with a gid: (x data, y data)."""
    (ax,) = fig.axes
    return {
        line.get_gid(): (list(map(float, line.get_xdata())), list(map(float, line.get_ydata())))
        for line in ax.lines
        if line.get_gid()
    }


SWEEP = pd.DataFrame(
    {
        "kv.eviction": ["lru"] * 4 + ["fifo"] * 4 + ["arc"] * 2,
        "engine.kv_pool_blocks": [256, 64, 256, 64, 64, 64, 256, 256, 64, 256],
        "seed": [0, 0, 1, 1, 0, 1, 0, 1, 0, 0],
        "hbm_reuse_hit_rate": [0.30, 0.10, 0.34, 0.12, 0.05, 0.07, 0.20, 0.20, 0.5, 0.5],
    }
)
REPLAY = pd.DataFrame(
    {
        "policy": ["lru", "lru", "fifo", "fifo", "opt", "opt"],
        "capacity_blocks": [64, 256, 64, 256, 64, 256],
        "hit_rate": [0.15, 0.35, 0.08, 0.25, 0.30, 0.40],
    }
)


def test_lines_are_the_means_over_seeds_and_the_replay_rates():
    data = overlay_data(SWEEP, REPLAY)
    fig = draw_overlay(data)
    drawn = lines(fig)
    plt.close(fig)
    # by hand: lru at 64 (0.10, 0.12), at 256 (0.30, 0.34); fifo (0.05, 0.07), (0.20, 0.20)
    assert drawn["engine:lru"][0] == [64, 256]
    assert drawn["engine:lru"][1] == pytest.approx([11.0, 32.0])
    assert drawn["engine:fifo"][1] == pytest.approx([6.0, 20.0])
    assert drawn["replay:lru"] == ([64, 256], pytest.approx([15.0, 35.0]))
    assert drawn["replay:fifo"] == ([64, 256], pytest.approx([8.0, 25.0]))
    assert drawn["replay:opt"] == ([64, 256], pytest.approx([30.0, 40.0]))
    assert "engine:arc" not in drawn  # the replay's policies choose the lines
    engine = data[data.source == "engine"]
    assert engine.n.tolist() == [2, 2, 2, 2]
    # sample standard deviations: |a - b| / sqrt(2) for two seeds
    assert engine["std"].tolist() == pytest.approx([0.014142, 0.028284, 0.014142, 0.0], abs=1e-6)


def test_more_policies_than_colours_is_refused():
    many = pd.DataFrame(
        {"policy": [f"p{i}" for i in range(8)], "capacity_blocks": 64, "hit_rate": 0.1}
    )
    sweep = SWEEP.assign(**{"kv.eviction": "p0"})
    with pytest.raises(KvsimError, match="8 policies is more than 7 distinguishable lines"):
        draw_overlay(overlay_data(sweep, many))
    with pytest.raises(KvsimError, match=r"none of the sweep's policies \(lru, fifo, arc\)"):
        overlay_data(SWEEP, many)


# A trace of three conversations, each turn's prompt extending the last: 24 requests, 1 s
# apart, replayed by an engine sweep (LRU and FIFO, three pool sizes) and by kvsim replay.
def conversation_rows() -> list[dict]:
    rows = []
    for turn in range(8):
        for c in range(3):
            ids = [1000 * c + k for k in range(turn % 3 + 1)]
            rows.append({"timestamp": 1000 * len(rows), "input_length": 512 * len(ids) - 40 * c,
                         "output_length": 8, "hash_ids": ids})  # fmt: skip
    return rows


POOLS = [100, 200, 800]


@pytest.fixture(scope="module")
def overlay_files(tmp_path_factory) -> tuple[Path, Path, Path]:
    folder = tmp_path_factory.mktemp("overlay")
    trace = folder / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in conversation_rows()))
    base = {
        "seed": 0, "model": "llama-3-8b", "hardware": "h100-sxm",
        "workload": {"kind": "trace", "format": "mooncake", "path": "t.jsonl", "max_requests": 20},
        "engine": {"max_num_seqs": 4, "max_batched_tokens": 2048, "block_tokens": 16},
        "kv": {"mode": "hbm"},
    }  # fmt: skip
    (folder / "base.yaml").write_text(yaml.safe_dump(base))
    sweep = {"base": "base.yaml",
             "grid": {"kv.eviction": ["lru", "fifo"], "engine.kv_pool_blocks": POOLS}}  # fmt: skip
    (folder / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    out = folder / "out"
    run_sweep(load_sweep(folder / "sweep.yaml"), out, Limits(workers=1), progress=False)
    replayed = read_replay_trace(trace, block_tokens=16, max_requests=20)
    policies = {"lru": "lru", "fifo": "fifo", "opt": "opt"}
    csv = folder / "hits.csv"
    write_csv(replay_table(replayed, policies, POOLS, progress=False), csv)
    return out, csv, trace


def test_the_figure_draws_the_sweep_results_and_the_replay_csv(overlay_files, tmp_path):
    out, csv, _ = overlay_files
    results = experiments.load(out)
    table = pd.read_csv(csv)
    fig, _ = overlay_figure([out, csv])
    drawn = lines(fig)
    title = fig.axes[0].get_title()
    plt.close(fig)
    for policy in ("lru", "fifo"):
        rows = results[results["kv.eviction"] == policy].sort_values("engine.kv_pool_blocks")
        expected = (rows.hbm_reuse_hit_rate * 100).tolist()
        assert drawn[f"engine:{policy}"] == (POOLS, pytest.approx(expected))
    for policy in ("lru", "fifo", "opt"):
        rows = table[table.policy == policy]
        assert drawn[f"replay:{policy}"] == (POOLS, pytest.approx((rows.hit_rate * 100).tolist()))
    assert title == ("llama-3-8b on h100-sxm, kv.mode=hbm: first 20 requests, 16-token blocks")
    written = plot_hit_rate_overlay([csv, out], tmp_path / "overlay.png", PlotOptions())
    assert written.read_bytes()[:4] == PNG
    # --data-out writes the table the lines draw (rates as fractions, one row a point)
    data_out = tmp_path / "overlay.csv"
    plot_hit_rate_overlay([out, csv], tmp_path / "o2.png", PlotOptions(data_out=data_out))
    written_data = pd.read_csv(data_out)
    engine_lru = written_data[(written_data.source == "engine") & (written_data.series == "lru")]
    assert (engine_lru["mean"] * 100).tolist() == pytest.approx(drawn["engine:lru"][1])


def test_the_replay_must_count_the_sweeps_requests_in_its_blocks(overlay_files, tmp_path):
    out, _, trace = overlay_files
    cases = [
        ({"block_tokens": None, "max_requests": 20}, "block_tokens = trace blocks, but the "
         "sweep's engine.block_tokens is 16; rerun 'kvsim replay ... --block-tokens 16'"),
        ({"block_tokens": 32, "max_requests": 20}, "block_tokens = [32], but"),
        ({"block_tokens": 16, "max_requests": 12}, "requests = [12], but each sweep point "
         "ran 20; rerun 'kvsim replay ... --max-requests 20'"),
    ]  # fmt: skip
    for i, (units, message) in enumerate(cases):
        csv = tmp_path / f"hits{i}.csv"
        replayed = read_replay_trace(trace, **units)
        write_csv(replay_table(replayed, {"lru": "lru"}, [40], progress=False), csv)
        with pytest.raises(KvsimError, match=re.escape(message)):
            overlay_figure([out, csv])


def test_other_axes_and_sources_are_checked(overlay_files, tmp_path):
    out, csv, _ = overlay_files
    with pytest.raises(KvsimError, match="hit-rate-overlay draws a sweep directory"):
        overlay_figure([out])
    with pytest.raises(KvsimError, match=r"axis 'engine.kv_pool_blocks' varies"):
        overlay_figure([out, csv], PlotOptions(x="kv.eviction"))
    old = tmp_path / "old.csv"
    pd.read_csv(csv).drop(columns=["block_tokens", "requests"]).to_csv(old, index=False)
    with pytest.raises(KvsimError, match="missing column"):
        overlay_figure([out, old])
