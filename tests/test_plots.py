"""Plots draw exactly the data in the run files."""

import numpy as np
import pandas as pd

from experiments.plots import GIB, hbm_pressure_data, plot_hbm_pressure
from sim.run import simulate
from sim.rundir import write_run
from tests.conftest import make_config


def test_hbm_pressure_plot_uses_the_timeline(tmp_path):
    run = write_run(simulate(make_config()), tmp_path / "run")
    timeline = pd.read_parquet(run / "timeline.parquet")
    data = hbm_pressure_data(run)
    assert np.array_equal(data.time_s, timeline.time_s)
    assert np.allclose(data.hbm_kv_bytes * GIB, timeline.hbm_kv_bytes)
    assert np.allclose(data.capacity_gib * GIB, make_config().hardware.hbm.capacity)
    out = plot_hbm_pressure(run, tmp_path / "hbm.pdf")
    assert out.read_bytes()[:4] == b"%PDF"


def test_hbm_pressure_says_per_gpu_and_draws_one_gpus_share(tmp_path):
    from experiments.plots import draw_hbm_pressure

    config = make_config("engine.tensor_parallel_size=2")
    run = write_run(simulate(config), tmp_path / "tp2")
    timeline = pd.read_parquet(run / "timeline.parquet")
    drawn = draw_hbm_pressure(run)
    assert all("per GPU" in ax.get_ylabel() for ax in drawn.axes if ax.get_ylabel())
    # one GPU's weights: half of the model's, plus the norms every GPU holds
    m = config.model
    norms = (2 * m.layers + 1) * m.hidden * m.dtype_bytes
    assert timeline.hbm_weights_bytes.iloc[0] == (m.weight_bytes - norms) / 2 + norms
    assert np.allclose(hbm_pressure_data(run).hbm_kv_bytes * GIB, timeline.hbm_kv_bytes)
