"""Plots of cluster runs: ``load`` (each instance's queue and running requests) and
``hbm-pressure`` faceted per instance, from timelines with an ``instance`` column."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.plots import GIB, HBM_PARTS, draw_hbm_pressure, draw_load, load_data
from experiments.plots.style import plt
from sim.cli import main
from sim.errors import KvsimError
from sim.run import simulate
from sim.rundir import write_run
from tests.conftest import make_config

HBM_COLUMNS = [
    "run", "time_s", "weights_gib", "reserve_gib", "activation_gib", "kv_running_gib",
    "kv_cached_gib", "staging_gib", "capacity_gib", "kv_pool_gib", "kv_pool_limit_gib",
]  # fmt: skip


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory) -> Path:
    """A one-instance run (its timeline has no ``instance`` column)."""
    return write_run(simulate(make_config()), tmp_path_factory.mktemp("plain") / "run")


def with_timeline(plain: Path, folder: Path, timeline: pd.DataFrame) -> Path:
    """A copy of ``plain`` whose timeline is ``timeline``."""
    shutil.copytree(plain, folder)
    timeline.to_parquet(folder / "timeline.parquet")
    return folder


def two_instances(plain: Path) -> pd.DataFrame:
    """Instance 0 is the plain run's timeline; instance 1 steps half a step later with 3 more
    waiting, one fewer running and half the KV; rows interleaved in time order."""
    first = pd.read_parquet(plain / "timeline.parquet").assign(instance=0)
    second = first.assign(
        instance=1,
        time_s=first.time_s + first.step_s / 2,
        waiting=first.waiting + 3,
        running=(first.running - 1).clip(lower=0),
        hbm_kv_running_bytes=first.hbm_kv_running_bytes / 2,
    )
    both = pd.concat([first, second], ignore_index=True)
    return both.sort_values("time_s", kind="stable", ignore_index=True)


@pytest.fixture(scope="module")
def cluster_run(plain_run, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cluster") / "run"
    return with_timeline(plain_run, folder, two_instances(plain_run))


def lines_by_label(ax) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {line.get_label(): (line.get_xdata(), line.get_ydata()) for line in ax.get_lines()}


def test_load_draws_each_instances_queue_and_running(cluster_run) -> None:
    timeline = pd.read_parquet(cluster_run / "timeline.parquet")
    drawn = draw_load(cluster_run)
    assert [ax.get_title() for ax in drawn.axes] == ["queue (waiting)", "running"]
    for ax, column in zip(drawn.axes, ("waiting", "running"), strict=True):
        lines = lines_by_label(ax)
        assert sorted(lines) == ["instance 0", "instance 1"]
        for k in (0, 1):
            rows = timeline[timeline.instance == k]
            x, y = lines[f"instance {k}"]
            assert np.array_equal(x, rows.time_s) and np.array_equal(y, rows[column])
        assert lines["instance 0"][1].tolist() != lines["instance 1"][1].tolist()
    data = drawn.data
    assert list(data.columns) == ["run", "time_s", "instance", "waiting", "running"]
    second = data[data.instance == 1]
    assert np.array_equal(second.waiting, timeline[timeline.instance == 1].waiting)
    assert len(data) == len(timeline)
    plt.close(drawn.fig)


def test_load_of_a_one_instance_run_is_one_line_each(plain_run) -> None:
    timeline = pd.read_parquet(plain_run / "timeline.parquet")
    drawn = draw_load(plain_run)
    for ax, column in zip(drawn.axes, ("waiting", "running"), strict=True):
        (x, y), = lines_by_label(ax).values()  # fmt: skip
        assert np.array_equal(x, timeline.time_s) and np.array_equal(y, timeline[column])
    assert set(load_data(plain_run).instance) == {0}
    plt.close(drawn.fig)


def test_load_of_several_runs_is_a_row_each_and_refuses_too_many(plain_run, cluster_run):
    drawn = draw_load([plain_run, cluster_run])
    assert len(drawn.axes) == 4 and drawn.axes[2].get_title() == "run — queue (waiting)"
    assert len(drawn.axes[3].get_lines()) == 2
    plt.close(drawn.fig)
    with pytest.raises(KvsimError, match="5 runs is more than the 4 a load figure draws"):
        draw_load([plain_run] * 5)


def test_refuses_more_instances_than_lines_or_panels(plain_run, tmp_path) -> None:
    timeline = pd.read_parquet(plain_run / "timeline.parquet")
    many = pd.concat([timeline.assign(instance=i) for i in range(9)], ignore_index=True)
    run = with_timeline(plain_run, tmp_path / "nine", many)
    with pytest.raises(KvsimError, match="9 instances is more than the 8 lines"):
        draw_load(run)
    ten = pd.concat([timeline.assign(instance=i) for i in range(10)], ignore_index=True)
    run = with_timeline(plain_run, tmp_path / "ten", ten)
    with pytest.raises(KvsimError, match=r"10 panels \(one per instance of the cluster runs\) is"):
        draw_hbm_pressure(run)


def test_hbm_pressure_has_a_panel_per_instance(cluster_run) -> None:
    timeline = pd.read_parquet(cluster_run / "timeline.parquet")
    drawn = draw_hbm_pressure(cluster_run)
    assert [ax.get_title() for ax in drawn.axes] == ["instance 0", "instance 1"]
    for k, ax in enumerate(drawn.axes):
        rows = timeline[timeline.instance == k]
        x, y = lines_by_label(ax)["KV pool limit"]
        fixed = rows.hbm_weights_bytes + rows.hbm_reserve_bytes + rows.hbm_activation_bytes
        limit = (fixed + rows.hbm_kv_pool_bytes) / GIB
        assert np.array_equal(x, rows.time_s) and np.allclose(y, limit)
        table = drawn.data[drawn.data.instance == k]
        assert np.allclose(table.kv_running_gib, rows.hbm_kv_running_bytes / GIB)
        stacked = ax.collections[: len(HBM_PARTS)]  # one band per part, bottom to top
        top = stacked[-1].get_paths()[0].vertices[:, 1].max()
        parts = rows[[column for column, _, _ in HBM_PARTS]].sum(axis=1) / GIB
        assert top == pytest.approx(parts.max())
    assert list(drawn.data.columns) == [*HBM_COLUMNS[:1], "instance", *HBM_COLUMNS[1:]]
    plt.close(drawn.fig)


def test_hbm_pressure_of_one_instance_is_unchanged(plain_run, tmp_path) -> None:
    """No ``instance`` column, or a single value in it: one panel, the same numbers."""
    plain = draw_hbm_pressure(plain_run)
    timeline = pd.read_parquet(plain_run / "timeline.parquet").assign(instance=0)
    tagged = draw_hbm_pressure(with_timeline(plain_run, tmp_path / "run", timeline))
    for drawn in (plain, tagged):
        assert len(drawn.axes) == 1 and list(drawn.data.columns) == HBM_COLUMNS
        assert np.allclose(drawn.data.kv_running_gib, timeline.hbm_kv_running_bytes / GIB)
    pd.testing.assert_frame_equal(plain.data, tagged.data)
    assert plain.axes[0].get_title() == tagged.axes[0].get_title()  # both named 'run'
    plt.close(plain.fig)
    plt.close(tagged.fig)


def test_plot_command_draws_load(cluster_run, tmp_path, capsys) -> None:
    out, data = tmp_path / "load.png", tmp_path / "load.csv"
    args = ["plot", str(cluster_run), "--kind", "load", "--out", str(out), "--data-out", str(data)]
    assert main(args) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    timeline = pd.read_parquet(cluster_run / "timeline.parquet")
    written = pd.read_csv(data)
    assert written.instance.value_counts().to_dict() == timeline.instance.value_counts().to_dict()
    assert f"wrote {out}" in capsys.readouterr().out
