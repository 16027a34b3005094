"""Every plot writes its file and draws exactly the data in the run files."""

import numpy as np
import pandas as pd
import pytest

import experiments
from experiments import store
from experiments.plots import (
    GIB,
    HBM_PARTS,
    PlotOptions,
    hbm_pressure_data,
    heatmap_data,
    hit_rate_data,
    latency_cdf_data,
    link_data,
    plot_hbm_pressure,
    plot_heatmap,
    plot_hit_rate,
    plot_latency_cdf,
    plot_link,
    plot_throughput,
    throughput_data,
)
from experiments.plots.sources import runs
from experiments.runner import run_sweep
from experiments.sweep import load_sweep
from experiments.tasks import Limits
from sim.cli import main
from sim.errors import KvsimError
from tests.experiments.sweep_helpers import small_sweep

PNG = b"\x89PNG"
PDF = b"%PDF"


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """hbm vs dram_centric (sparse) x batch 2, 4 x seeds 0, 1, run once for the module."""
    folder = tmp_path_factory.mktemp("plots")
    run_sweep(load_sweep(small_sweep(folder)), folder / "out", Limits(workers=1), progress=False)
    return folder / "out"


def _points(sweep_dir):
    return experiments.load(sweep_dir)


def test_hbm_pressure_stacks_each_part_of_the_timeline(sweep_dir, tmp_path):
    results = _points(sweep_dir)
    run = store.run_dir(sweep_dir, results.point_id[2])
    timeline = pd.read_parquet(run / "timeline.parquet")
    data = hbm_pressure_data(run)
    assert np.array_equal(data.time_s, timeline.time_s)
    for column, _, _ in HBM_PARTS:
        assert np.allclose(data[column] * GIB, timeline[column])
    capacity = timeline[[c for c, _, _ in HBM_PARTS]].sum(axis=1) + timeline.hbm_free_bytes
    assert np.allclose(data.capacity_gib * GIB, capacity)
    assert np.allclose(data.capacity_gib * GIB, 81559 * 2**20)  # h100-sxm
    assert np.allclose(data.kv_pool_gib * GIB, timeline.hbm_kv_pool_bytes)
    assert plot_hbm_pressure(run, tmp_path / "one.png").read_bytes()[:4] == PNG
    out = plot_hbm_pressure(sweep_dir, tmp_path / "all.pdf", PlotOptions(where=("seed=0",)))
    assert out.read_bytes()[:4] == PDF


def test_a_sweep_gives_one_panel_per_finished_point_matching_the_filters(sweep_dir):
    results = _points(sweep_dir)
    found = runs(sweep_dir, PlotOptions(where=("kv.mode=dram_centric", "seed=1")))
    picked = results[(results["kv.mode"] == "dram_centric") & (results.seed == 1)]
    assert [r.path.name for r in found] == list(picked.point_id)
    assert [r.label for r in found] == ["workload.num_requests=2", "workload.num_requests=4"]
    with pytest.raises(KvsimError, match=r"no column 'kv\.nope'"):
        runs(sweep_dir, PlotOptions(where=("kv.nope=1",)))
    with pytest.raises(KvsimError, match=r"no point of .* matches"):
        runs(sweep_dir, PlotOptions(where=("kv.mode=offload",)))


def test_latency_cdf_pools_the_seeds_of_each_configuration(sweep_dir, tmp_path):
    results = _points(sweep_dir)
    data = latency_cdf_data(sweep_dir)
    assert data.config.nunique() == 4
    config = "workload.num_requests=4, kv.mode=hbm, kv.access=full"
    rows = results[(results["workload.num_requests"] == 4) & (results["kv.mode"] == "hbm")]
    requests = pd.concat(
        pd.read_parquet(store.run_dir(sweep_dir, p) / "requests.parquet") for p in rows.point_id
    )
    done = requests[requests.status == "finished"]
    for metric in ("ttft", "tpot"):
        mine = data[(data.config == config) & (data.metric == metric)]
        assert np.array_equal(mine.value_s, np.sort(done[f"{metric}_s"].dropna()))
        assert mine.cdf.iloc[-1] == 1.0
    assert plot_latency_cdf(sweep_dir, tmp_path / "cdf.png").read_bytes()[:4] == PNG


def test_throughput_is_the_mean_over_seeds_with_std_error_bars(sweep_dir, tmp_path):
    results = _points(sweep_dir)
    data = throughput_data(sweep_dir)
    assert data.attrs["x"] == "workload.num_requests"
    assert (data.n == 2).all()
    for _, row in data.iterrows():
        mode = row.series.split("kv.mode=")[1].split(",")[0]
        picked = results[(results["kv.mode"] == mode) & (results["workload.num_requests"] == row.x)]
        assert row["mean"] == pytest.approx(picked.output_tokens_per_s.mean())
        assert row["std"] == pytest.approx(picked.output_tokens_per_s.std())
    assert (data.groupby("series").x.apply(list) == [[2, 4]] * 2).all()
    options = PlotOptions(
        metric="tpot_p50_s", x="kv.mode", hue=(), where=("workload.num_requests=4",)
    )
    tpot = throughput_data(sweep_dir, options)
    assert list(tpot.x) == ["hbm", "dram_centric"] and (tpot.series == "").all()
    assert plot_throughput(sweep_dir, tmp_path / "t.pdf", options).read_bytes()[:4] == PDF
    assert plot_throughput(sweep_dir, tmp_path / "t.png").read_bytes()[:4] == PNG


def test_throughput_refuses_an_axis_that_varies_unplotted(sweep_dir):
    with pytest.raises(KvsimError, match=r"axis 'kv.mode' varies .* --where kv.mode=hbm"):
        throughput_data(sweep_dir, PlotOptions(hue=()))
    with pytest.raises(KvsimError, match=r"--x engine\.block_tokens: not an axis"):
        throughput_data(sweep_dir, PlotOptions(x="engine.block_tokens"))
    with pytest.raises(KvsimError, match="give one directory written by 'kvsim sweep'"):
        throughput_data(store.run_dir(sweep_dir, _points(sweep_dir).point_id[0]))


def test_hit_rate_reads_a_replay_csv(tmp_path):
    table = pd.DataFrame({
        "policy": ["lru", "lru", "arc", "arc"], "capacity_blocks": [100, 1000, 100, 1000],
        "accesses": [50] * 4, "hits": [5, 20, 6, 25], "hit_rate": [0.1, 0.4, 0.12, 0.5],
    })  # fmt: skip
    table.to_csv(tmp_path / "hits.csv", index=False)
    data = hit_rate_data(tmp_path / "hits.csv")
    for _, row in table.iterrows():
        mine = data[(data.series == row.policy) & (data.x == row.capacity_blocks)]
        assert mine["mean"].item() == row.hit_rate
    assert plot_hit_rate(tmp_path / "hits.csv", tmp_path / "hits.png").read_bytes()[:4] == PNG
    table.drop(columns="hit_rate").to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(KvsimError, match="missing column"):
        hit_rate_data(tmp_path / "bad.csv")


def test_hit_rate_of_a_sweep_defaults_to_the_cross_request_hbm_hit_rate(sweep_dir):
    results = _points(sweep_dir)
    data = hit_rate_data(sweep_dir, PlotOptions(x="workload.num_requests"))
    assert data.attrs["metric"] == "hbm_reuse_hit_rate"
    hbm = results[(results["kv.mode"] == "hbm") & (results["workload.num_requests"] == 2)]
    row = data[data.series.str.contains("kv.mode=hbm") & (data.x == 2)]
    assert row["mean"].item() == pytest.approx(hbm.hbm_reuse_hit_rate.mean())


def test_link_draws_the_timeline_utilisation(sweep_dir, tmp_path):
    results = _points(sweep_dir)
    run = store.run_dir(sweep_dir, results[results["kv.mode"] == "dram_centric"].point_id.iloc[-1])
    timeline = pd.read_parquet(run / "timeline.parquet")
    data = link_data(run)
    assert np.array_equal(data.time_s, timeline.time_s)
    assert np.array_equal(data.h2d_util, timeline.h2d_util)
    assert np.array_equal(data.d2h_util, timeline.d2h_util)
    assert plot_link([run, run.parent / results.point_id[0]], tmp_path / "l.png").is_file()


def test_heatmap_refuses_runs_without_per_block_access_data(sweep_dir, tmp_path):
    run = store.run_dir(sweep_dir, _points(sweep_dir).point_id[0])
    with pytest.raises(KvsimError, match=r"no kv_heat\.parquet.*engine\.kv_heat: true") as error:
        plot_heatmap(run, tmp_path / "h.png")
    assert "does not record" not in str(error.value)
    assert not (tmp_path / "h.png").exists()


def test_heatmap_bins_a_per_block_access_file_without_losing_accesses(sweep_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "timeline.parquet").write_bytes(
        (store.run_dir(sweep_dir, _points(sweep_dir).point_id[0]) / "timeline.parquet").read_bytes()
    )
    rng = np.random.default_rng(0)
    heat = pd.DataFrame({
        "time_s": np.repeat(np.arange(500) * 0.01, 4), "block": rng.integers(0, 900, 2000),
        "accesses": rng.integers(1, 5, 2000), "tier": rng.choice(["hbm", "dram"], 2000),
    })  # fmt: skip
    heat.to_parquet(run / "kv_heat.parquet")
    data = heatmap_data(run)
    assert data.accesses.sum() == heat.accesses.sum()
    for tier in ("hbm", "dram"):
        assert data[data.tier == tier].accesses.sum() == heat[heat.tier == tier].accesses.sum()
    assert data.time_bin.nunique() <= 300 and data.block_bin.nunique() <= 300
    assert plot_heatmap(run, tmp_path / "h.png").read_bytes()[:4] == PNG


def test_plot_command_takes_a_sweep_and_filters(sweep_dir, tmp_path, capsys):
    out = tmp_path / "fig.pdf"
    args = ["plot", str(sweep_dir), "--kind", "throughput", "--metric", "ttft_p50_s",
            "--panel", "kv.mode", "--out", str(out)]  # fmt: skip
    assert main(args) == 0 and out.read_bytes()[:4] == PDF
    assert main(["plot", str(sweep_dir), "--kind", "link", "--where", "seed=0",
                 "--where", "workload.num_requests=2"]) == 0  # fmt: skip
    assert (sweep_dir / "link.png").is_file()
    assert main(["plot", str(sweep_dir), "--kind", "link", "--out", str(tmp_path / "x.jpg")]) == 2
    assert "unknown figure format" in capsys.readouterr().err
    assert main(["plot", str(tmp_path), "--kind", "hbm-pressure"]) == 2
    assert "not a run directory" in capsys.readouterr().err
