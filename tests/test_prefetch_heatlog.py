"""The opt-in KV heat log (engine.kv_heat): kv_heat.parquet and the heatmap drawn from it."""

import numpy as np
import pandas as pd
import pytest

from experiments.plots import heatmap_data, plot_heatmap
from sim.config.kv import SparseAccess
from sim.kv.access import AccessModel
from sim.run import simulate
from sim.rundir import write_run
from tests.conftest import make_config

WORKLOAD = {
    "kind": "synthetic", "num_requests": 3, "arrival": {"kind": "all_at_once"},
    "prompt_tokens": 64, "output_tokens": 3,
}  # fmt: skip


def test_kv_heat_is_off_by_default_and_writes_no_file(tmp_path):
    result = simulate(make_config(workload=WORKLOAD))
    assert result.kv_heat is None
    assert not (write_run(result, tmp_path / "run") / "kv_heat.parquet").exists()


def test_kv_heat_rows_are_the_blocks_each_step_reads():
    # 3 sequences of 64 prompt tokens (4 blocks of 16), 3 output tokens each, one step for
    # the prefill (reads no KV yet), then decodes at context 64 and 65: 4 then 5 blocks each
    result = simulate(make_config("engine.kv_heat=true", workload=WORKLOAD))
    heat = result.kv_heat
    assert list(heat.columns) == ["time_s", "block", "accesses", "tier"]
    steps = result.timeline.time_s.tolist()
    assert sorted(heat.time_s.unique()) == steps[1:]
    for t, blocks in zip(steps[1:], (4, 5), strict=True):
        rows = heat[heat.time_s == t]
        assert len(rows) == 3 * blocks and (rows.accesses == 1).all()
        assert (rows.tier == "hbm").all()
    assert result.summary == simulate(make_config(workload=WORKLOAD)).summary | {
        "wall_time_s": result.summary["wall_time_s"]
    }


def test_kv_heat_interval_thins_the_recorded_steps():
    every = simulate(make_config("engine.kv_heat=true", workload=WORKLOAD)).kv_heat
    thin = simulate(
        make_config("engine.kv_heat=true", "engine.kv_heat_interval_s=1000", workload=WORKLOAD)
    ).kv_heat
    first = every.time_s.min()
    assert thin.equals(every[every.time_s == first].reset_index(drop=True))


def test_kv_heat_marks_dram_reads_in_dram_centric():
    access = {"kind": "sparse", "window_blocks": 2, "topk_blocks": 2}
    config = make_config(
        "engine.kv_heat=true", "hardware.hbm.capacity=20GiB",
        workload={**WORKLOAD, "num_requests": 8, "prompt_tokens": 8192, "output_tokens": 4},
        kv={"mode": "dram_centric", "access": access},
    )  # fmt: skip
    heat = simulate(config).kv_heat
    assert set(heat.tier) == {"hbm", "dram"}


def test_heatmap_plots_the_data_of_the_run_file(tmp_path):
    result = simulate(make_config("engine.kv_heat=true", workload=WORKLOAD))
    run = write_run(result, tmp_path / "run")
    stored = pd.read_parquet(run / "kv_heat.parquet")
    pd.testing.assert_frame_equal(stored, result.kv_heat)
    data = heatmap_data(run)
    assert data.accesses.sum() == stored.accesses.sum()
    expected = stored.groupby(["time_s", "block", "tier"], as_index=False)["accesses"].sum()
    got = data.rename(columns={"time_bin": "time_s", "block_bin": "block"})
    pd.testing.assert_frame_equal(
        got[["time_s", "block", "tier", "accesses"]].reset_index(drop=True), expected,
        check_dtype=False,
    )  # fmt: skip
    out = plot_heatmap(run, tmp_path / "heat.png")
    assert out.is_file() and out.stat().st_size > 0


def test_walk_drift_moves_every_middle_score_by_a_seeded_gaussian_step():
    spec = SparseAccess(kind="sparse", sink_blocks=1, window_blocks=1, topk_blocks=2,
                        drift=0.1, drift_kind="walk")  # fmt: skip
    model = AccessModel(spec, np.random.default_rng(7))
    heat = np.array([0.0, 0.5, 0.4, 0.3, 0.2, 0.0])
    blocks = np.arange(6)
    read = model.decode_blocks(blocks, heat)
    step = 0.1 * np.random.default_rng(7).standard_normal(4)
    expected = np.array([0.0, 0.5, 0.4, 0.3, 0.2, 0.0])
    expected[1:5] += step
    assert heat == pytest.approx(expected)
    top = 1 + np.sort(np.argsort(-expected[1:5])[:2])
    assert read.tolist() == [0, *top.tolist(), 5]
