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
