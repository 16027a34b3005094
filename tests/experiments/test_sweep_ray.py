"""The Ray backend on a local Ray instance gives the same results as the local backend."""

import pandas as pd
import pytest

from experiments import store
from experiments.runner import run_sweep
from experiments.sweep import load_sweep
from experiments.tasks import Limits
from tests.experiments.sweep_helpers import small_sweep

ray = pytest.importorskip("ray", reason="the Ray backend needs ray (pip install 'kvsim[ray]')")


@pytest.fixture
def local_ray():
    """A two-CPU local Ray instance for this test."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_backend_matches_the_local_backend(tmp_path, local_ray):
    sweep = load_sweep(small_sweep(tmp_path))
    local = run_sweep(sweep, tmp_path / "local", Limits(workers=2), progress=False)
    remote = run_sweep(sweep, tmp_path / "ray", Limits(workers=2), "ray", progress=False)
    assert ray.is_initialized()  # NOTE: an instance the caller started is left running
    same = [c for c in local.columns if c != "wall_time_s"]
    assert (remote.status == "done").all()
    pd.testing.assert_frame_equal(local[same], remote[same])
    for point in local.point_id:
        for name in ("requests.parquet", "timeline.parquet"):
            pd.testing.assert_frame_equal(
                pd.read_parquet(store.run_dir(tmp_path / "local", point) / name),
                pd.read_parquet(store.run_dir(tmp_path / "ray", point) / name),
            )
