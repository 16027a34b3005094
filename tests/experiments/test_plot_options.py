"""kvsim plot's options: the figure's data as CSV, titles, labels, limits, scales, legends,
unit-valued axes, the series limit, the KV detail strip and the heatmap's colourbars."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml
from matplotlib.colors import to_hex

from experiments import store
from experiments.plots import (
    GIB,
    MAX_LINES,
    PlotOptions,
    draw_hbm_pressure,
    draw_heatmap,
    draw_hit_rate,
    draw_latency_cdf,
    draw_link,
    draw_throughput,
    hit_rate_data,
    plot_hbm_pressure,
    plot_heatmap,
    plot_latency_cdf,
    plot_link,
    plot_throughput,
)
from experiments.plots.layout import parse_limits
from experiments.plots.quantities import as_numbers
from experiments.plots.sources import runs
from experiments.plots.style import plt
from experiments.plots.titles import describe
from experiments.runner import run_sweep
from experiments.sweep import load_sweep
from experiments.tasks import Limits
from sim.cli import main
from sim.errors import KvsimError
from sim.run import simulate
from sim.rundir import write_run
from tests.conftest import make_config
from tests.experiments.sweep_helpers import FAST_BASE, small_sweep, write_sweep

SEQS = list(range(1, 10))  # nine series: one more than a figure keeps apart


def _run_sweep(folder, sweep):
    run_sweep(load_sweep(write_sweep(folder, sweep)), folder / "out", Limits(workers=1),
              progress=False)  # fmt: skip
    return folder / "out"


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """hbm vs dram_centric (sparse) x batch 2, 4 x seeds 0, 1."""
    folder = tmp_path_factory.mktemp("options")
    run_sweep(load_sweep(small_sweep(folder)), folder / "out", Limits(workers=1), progress=False)
    return folder / "out"


@pytest.fixture(scope="module")
def nine_dir(tmp_path_factory):
    """engine.max_num_seqs 1..9 x batch 2, 4: nine series against the batch."""
    grid = {"engine.max_num_seqs": SEQS, "workload.num_requests": [2, 4]}
    return _run_sweep(tmp_path_factory.mktemp("nine"), {"base": FAST_BASE, "grid": grid})


@pytest.fixture(scope="module")
def link_dir(tmp_path_factory):
    """A sweep over the H2D bandwidth written with units (two in GB/s, one in TB/s)."""
    zipped = {"hardware.link.h2d": ["32GB/s", "64GB/s", "0.128TB/s"]}
    return _run_sweep(tmp_path_factory.mktemp("h2d"), {"base": FAST_BASE, "zip": zipped})


@pytest.fixture(scope="module")
def sliver_run(tmp_path_factory):
    """A run whose KV pool is 64 blocks (128 MiB of Llama-3-8B KV): a sliver of 80 GiB."""
    out = tmp_path_factory.mktemp("sliver") / "run"
    return write_run(simulate(make_config("engine.kv_pool_blocks=64")), out)


def _curves(ax):
    """(label, x, y, yerr) of each errorbar line of a panel."""
    found = []
    for container in ax.containers:
        line, _, (bars,) = container.lines[0], container.lines[1], container.lines[2]
        yerr = [abs(seg[1][1] - seg[0][1]) / 2 for seg in bars.get_segments()]
        found.append((container.get_label(), line.get_xdata(), line.get_ydata(), yerr))
    return found


def _bbox(artist, renderer):
    return artist.get_tightbbox(renderer)


def test_data_out_holds_exactly_the_plotted_points(sweep_dir, tmp_path):
    options = PlotOptions(metric="ttft_p50_s", data_out=tmp_path / "fig.csv")
    plot_throughput(sweep_dir, tmp_path / "fig.png", options)
    table = pd.read_csv(tmp_path / "fig.csv", keep_default_na=False)
    assert list(table.columns) == [
        "panel",
        "series",
        "workload.num_requests",
        "ttft_p50_ms",
        "ttft_p50_ms_std",
        "n",
    ]
    drawn = draw_throughput(sweep_dir, options)
    curves = _curves(drawn.axes[0])
    assert [c[0] for c in curves] == list(dict.fromkeys(table.series))
    for label, xs, ys, yerr in curves:
        rows = table[table.series == label]
        assert np.array_equal(xs, rows["workload.num_requests"])
        assert np.allclose(ys, rows.ttft_p50_ms, rtol=1e-12)
        assert np.allclose(yerr, rows.ttft_p50_ms_std, rtol=1e-9)
    plt.close(drawn.fig)
    results = store.load(sweep_dir)  # the CSV against the summaries, by hand
    hbm4 = results[(results["kv.mode"] == "hbm") & (results["workload.num_requests"] == 4)]
    row = table[table.series.str.contains("kv.mode=hbm") & (table["workload.num_requests"] == 4)]
    assert row.ttft_p50_ms.item() == pytest.approx(hbm4.ttft_p50_s.mean() * 1e3)
    assert row.ttft_p50_ms_std.item() == pytest.approx(hbm4.ttft_p50_s.std() * 1e3)


def test_data_out_of_the_timeline_and_latency_figures(sweep_dir, tmp_path):
    run = store.run_dir(sweep_dir, store.load(sweep_dir).point_id[3])
    timeline = pd.read_parquet(run / "timeline.parquet")
    plot_hbm_pressure(run, tmp_path / "h.png", PlotOptions(data_out=tmp_path / "h.csv"))
    hbm = pd.read_csv(tmp_path / "h.csv")
    assert np.array_equal(hbm.time_s, timeline.time_s)
    assert np.allclose(hbm.kv_running_gib * GIB, timeline.hbm_kv_running_bytes)
    fixed = timeline.hbm_weights_bytes + timeline.hbm_reserve_bytes + timeline.hbm_activation_bytes
    assert np.allclose(hbm.kv_pool_limit_gib * GIB, fixed + timeline.hbm_kv_pool_bytes)
    kv_top = fixed + timeline.hbm_kv_running_bytes + timeline.hbm_kv_cached_bytes
    assert (kv_top <= hbm.kv_pool_limit_gib * GIB * (1 + 1e-12)).all()  # the stack's KV stays under
    drawn = draw_hbm_pressure(run, PlotOptions(kv_detail=False))
    pool_line = next(ln for ln in drawn.axes[0].lines if ln.get_label() == "KV pool limit")
    assert np.allclose(pool_line.get_ydata(), hbm.kv_pool_limit_gib)
    plt.close(drawn.fig)
    plot_link(run, tmp_path / "l.png", PlotOptions(data_out=tmp_path / "l.csv"))
    link = pd.read_csv(tmp_path / "l.csv")
    assert np.allclose(link.h2d_util_pct, timeline.h2d_util * 100)
    plot_latency_cdf(run, tmp_path / "c.png", PlotOptions(data_out=tmp_path / "c.csv"))
    cdf = pd.read_csv(tmp_path / "c.csv")
    requests = pd.read_parquet(run / "requests.parquet")
    ttft = np.sort(requests[requests.status == "finished"].ttft_s) * 1e3
    assert np.allclose(cdf[cdf.metric == "ttft"].latency_ms, ttft)
    drawn = draw_latency_cdf(run)
    assert np.allclose(drawn.axes[0].lines[0].get_xdata(), ttft)
    plt.close(drawn.fig)
    with pytest.raises(KvsimError, match=r"--data-out .*x\.txt: expected a \.csv file"):
        plot_link(run, tmp_path / "l2.png", PlotOptions(data_out=tmp_path / "x.txt"))


def test_title_labels_limits_and_log_scale_are_the_readers(sweep_dir):
    options = PlotOptions(
        title="My title", xlabel="batch", ylabel="tokens/s", xlim=(1.0, 5.0), ylim=(10.0, None),
        logy=True, legend="upper left",
    )  # fmt: skip
    drawn = draw_throughput(sweep_dir, options)
    ax = drawn.axes[0]
    assert ax.get_title() == "My title"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("batch", "tokens/s")
    assert ax.get_xlim() == (1.0, 5.0) and ax.get_ylim()[0] == 10.0
    assert ax.get_yscale() == "log" and ax.get_xscale() == "linear"
    assert ax.get_legend() is not None and ax.get_legend()._loc == 2  # upper left
    plt.close(drawn.fig)
    drawn = draw_throughput(sweep_dir, PlotOptions(logx=True, legend="none", title=""))
    assert drawn.axes[0].get_xscale() == "log" and drawn.axes[0].get_title() == ""
    assert drawn.axes[0].get_legend() is None and not drawn.fig.legends
    plt.close(drawn.fig)
    with pytest.raises(KvsimError, match=r"--logx: the x axis \(kv\.mode\) holds categories"):
        draw_throughput(sweep_dir, PlotOptions(x="kv.mode", hue=(), logx=True,
                                               where=("workload.num_requests=4",)))  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0,100", (0.0, 100.0)), ("0,", (0.0, None)), (",1e3", (None, 1000.0)), ("-5,-1", (-5, -1))],
)
def test_limits_parse_low_high(text, expected):
    assert parse_limits(text) == expected


@pytest.mark.parametrize("text", ["5", "a,b", "1,2,3", "5,1", "nan,1", "1,inf"])
def test_limits_refuse_what_is_not_low_below_high(text):
    with pytest.raises(KvsimError, match=r"--ylim '.*': (expected LOW,HIGH|LOW must be below)"):
        parse_limits(text, "--ylim")


def test_default_titles_name_model_hardware_and_mode(sweep_dir, tmp_path):
    run = store.run_dir(sweep_dir, store.load(sweep_dir).point_id[0])
    config = yaml.safe_load((run / "config.resolved.yaml").read_text())
    expected = f"{config['model']['name']} · {config['hardware']['name']} · kv.mode=hbm"
    assert (config["model"]["name"], config["hardware"]["name"]) == ("llama-3-8b", "h100-sxm")
    drawn = draw_link(run)
    assert drawn.axes[0].get_title() == f"{run.name} — {expected}"
    plt.close(drawn.fig)
    drawn = draw_hbm_pressure(sweep_dir, PlotOptions(where=("seed=0",)))
    assert drawn.fig.get_suptitle() == "llama-3-8b · h100-sxm · kv.mode=hbm/dram_centric sparse"
    assert [ax.get_title() for ax in drawn.axes] == [
        r.label for r in runs(sweep_dir, PlotOptions(where=("seed=0",)))
    ]
    plt.close(drawn.fig)
    fp8 = write_run(simulate(make_config("model.dtype=fp8")), tmp_path / "fp8")
    drawn = draw_hbm_pressure(fp8)
    assert drawn.axes[0].get_title() == "fp8 — llama-3-8b fp8 · h100-sxm · kv.mode=hbm"
    plt.close(drawn.fig)


def test_nine_series_are_refused_and_eight_never_repeat_a_colour(nine_dir, tmp_path):
    assert MAX_LINES == 8
    with pytest.raises(KvsimError, match=r"9 lines is more than the 8 .* --where KEY=V1\|V2"):
        draw_throughput(nine_dir, PlotOptions(x="workload.num_requests"))
    keep = "engine.max_num_seqs=" + "|".join(map(str, SEQS[:8]))
    options = PlotOptions(x="workload.num_requests", where=(keep,))
    drawn = draw_throughput(nine_dir, options)
    ax = drawn.axes[0]
    styles = [(to_hex(c.lines[0].get_color()), c.lines[0].get_marker()) for c in ax.containers]
    assert len(styles) == 8 and len({colour for colour, _ in styles}) == 8
    drawn.fig.canvas.draw()
    renderer = drawn.fig.canvas.get_renderer()
    (legend,) = drawn.fig.legends  # NOTE: eight entries: outside the panel by default
    assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    assert len(legend.get_texts()) == 8
    plt.close(drawn.fig)


def test_where_keeps_any_of_several_values(sweep_dir):
    both = runs(sweep_dir, PlotOptions(where=("workload.num_requests=2|4", "seed=0")))
    assert len(both) == 4
    assert len(runs(sweep_dir, PlotOptions(where=("workload.num_requests=4|9",)))) == 4


def test_unit_valued_axis_plots_as_numbers_in_its_most_common_unit(link_dir, tmp_path):
    options = PlotOptions(data_out=tmp_path / "h2d.csv")
    drawn = draw_throughput(link_dir, options)
    ax = drawn.axes[0]
    ((_, xs, _, _),) = _curves(ax)
    assert list(xs) == pytest.approx([32.0, 64.0, 128.0], rel=1e-12)
    assert ax.get_xlabel() == "hardware.link.h2d (GB/s)" and ax.get_xscale() == "linear"
    plt.close(drawn.fig)
    plot_throughput(link_dir, tmp_path / "h2d.png", options)
    table = pd.read_csv(tmp_path / "h2d.csv")
    assert list(table["hardware.link.h2d (GB/s)"]) == pytest.approx([32.0, 64.0, 128.0])


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["32GB/s", "64GB/s", "0.5TB/s"], ([32.0, 64.0, 500.0], "GB/s")),
        (["1GiB", 2**31], ([1.0, 2.0], "GiB")),  # a bare number is SI (bytes)
        (["500us", "2ms", "1ms"], ([0.5, 2.0, 1.0], "ms")),  # a tie: the first unit seen
        (["hbm", "dram"], None),
        ([1, 2], None),  # plain numbers: already numeric
        (["32GB/s", "80GiB"], None),  # two dimensions
        ([True, "1GB"], None),
    ],
)
def test_as_numbers_reads_quantities_of_one_dimension(values, expected):
    got = as_numbers(values)
    if expected is None:
        assert got is None
    else:
        assert got[1] == expected[1] and got[0] == pytest.approx(expected[0], rel=1e-12)


def _with_reuse_keys(sweep_dir, folder):
    """A copy of the sweep whose summaries carry the cross-request keys (by hand)."""
    copy = shutil.copytree(sweep_dir, folder)
    reuse = {}
    for i, point in enumerate(store.load(copy).point_id):
        path = store.run_dir(copy, point) / "summary.json"
        summary = json.loads(path.read_text())
        tiers = enumerate(("hbm", "dram", "ssd"), 1)
        rates = {f"{tier}_reuse_hit_rate": (i + 1) * k / 100 for k, tier in tiers}
        path.write_text(json.dumps(summary | rates))
        reuse[point] = rates
    store.write_results(copy)
    return copy, reuse


def _without_reuse_keys(sweep_dir, folder):
    """A copy of the sweep as results written before the cross-request keys existed."""
    copy = shutil.copytree(sweep_dir, folder)
    for point in store.load(copy).point_id:
        path = store.run_dir(copy, point) / "summary.json"
        summary = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in summary.items() if "reuse" not in k}))
    store.write_results(copy)
    return copy


def test_hit_rate_draws_the_cross_request_rate_when_the_results_have_it(sweep_dir, tmp_path):
    older = _without_reuse_keys(sweep_dir, tmp_path / "older")
    old = hit_rate_data(older, PlotOptions(x="workload.num_requests"))
    assert old.attrs["metric"] == "hbm_hit_rate"  # results from before the key existed
    assert hit_rate_data(older, PlotOptions(x="workload.num_requests", metric="dram")).attrs[
        "metric"] == "dram_hit_rate"  # fmt: skip
    copy, reuse = _with_reuse_keys(sweep_dir, tmp_path / "reuse")
    results = store.load(copy)
    for tier in ("hbm", "dram"):
        options = PlotOptions(x="workload.num_requests", metric=None if tier == "hbm" else tier)
        data = hit_rate_data(copy, options)
        assert data.attrs["metric"] == f"{tier}_reuse_hit_rate"
        hbm2 = results[(results["kv.mode"] == "hbm") & (results["workload.num_requests"] == 2)]
        row = data[data.series.str.contains("kv.mode=hbm") & (data.x == 2)]
        expected = np.mean([reuse[p][f"{tier}_reuse_hit_rate"] for p in hbm2.point_id])
        assert row["mean"].item() == pytest.approx(expected)
    drawn = draw_hit_rate(copy, PlotOptions(x="workload.num_requests"))
    assert drawn.axes[0].get_ylabel() == "HBM cross-request hit rate (%)"
    assert "hbm_reuse_hit_rate_pct" in drawn.data.columns
    plt.close(drawn.fig)
    explicit = hit_rate_data(copy, PlotOptions(x="workload.num_requests", metric="hbm_hit_rate"))
    assert explicit.attrs["metric"] == "hbm_hit_rate"  # a full name is taken as it is


def test_kv_detail_strip_zooms_on_a_sliver_of_kv(sliver_run, sweep_dir, tmp_path):
    timeline = pd.read_parquet(sliver_run / "timeline.parquet")
    pool = timeline.hbm_kv_pool_bytes.max()
    assert pool == 64 * 16 * 131072  # 64 blocks x 16 tokens x 128 KiB of Llama-3-8B KV
    drawn = draw_hbm_pressure(sliver_run)
    assert len(drawn.fig.axes) == 2  # the panel and its strip
    strip = drawn.fig.axes[1]
    kv = (timeline.hbm_kv_running_bytes + timeline.hbm_kv_cached_bytes
          + timeline.hbm_staging_bytes).max()  # fmt: skip
    assert kv > pool / 2  # the pool is near: the strip shows it
    assert strip.get_ylim()[1] == pytest.approx(max(kv, pool) / GIB * 1.08)
    assert strip.get_xlabel() == "simulated time (s)" and drawn.axes[0].get_xlabel() == ""
    pool_line = next(ln for ln in strip.lines if ln.get_label() == "KV pool")
    assert np.allclose(pool_line.get_ydata(), timeline.hbm_kv_pool_bytes / GIB)
    plt.close(drawn.fig)
    drawn = draw_hbm_pressure(sliver_run, PlotOptions(kv_detail=False, ylim=(0.0, 20.0)))
    assert len(drawn.fig.axes) == 1 and drawn.axes[0].get_ylim() == (0.0, 20.0)
    plt.close(drawn.fig)
    light = store.run_dir(sweep_dir, store.load(sweep_dir).point_id[0])  # a 53 GiB pool, 4 requests
    timeline = pd.read_parquet(light / "timeline.parquet")
    kv = (timeline.hbm_kv_running_bytes + timeline.hbm_kv_cached_bytes).max()
    assert kv < timeline.hbm_kv_pool_bytes.max() / 2
    drawn = draw_hbm_pressure(light)
    assert drawn.fig.axes[1].get_ylim()[1] == pytest.approx(kv / GIB * 1.08)  # the KV held
    plt.close(drawn.fig)
    assert plot_hbm_pressure([sliver_run, light], tmp_path / "two.png").is_file()


def test_no_kv_strip_where_the_kv_fills_hbm(tmp_path):
    workload = {"kind": "synthetic", "num_requests": 32, "arrival": {"kind": "all_at_once"},
                "prompt_tokens": 4096, "output_tokens": 128}  # fmt: skip
    run = write_run(simulate(make_config(workload=workload)), tmp_path / "full")
    timeline = pd.read_parquet(run / "timeline.parquet")
    assert timeline.hbm_kv_bytes.max() > 0.15 * 81559 * 2**20  # 32 x 4096 tokens: 16 GiB
    drawn = draw_hbm_pressure(run)
    assert len(drawn.fig.axes) == 1
    plt.close(drawn.fig)


def _heat_run(sweep_dir, folder):
    """A run folder with a synthetic kv_heat.parquet in all three tiers."""
    folder.mkdir()
    source = store.run_dir(sweep_dir, store.load(sweep_dir).point_id[0])
    for name in ("timeline.parquet", "config.resolved.yaml"):
        shutil.copy(source / name, folder / name)
    rng = np.random.default_rng(1)
    heat = pd.DataFrame({
        "time_s": np.repeat(np.arange(400) * 0.01, 5), "block": rng.integers(0, 700, 2000),
        "accesses": rng.integers(1, 50, 2000), "tier": rng.choice(["hbm", "dram", "ssd"], 2000),
    })  # fmt: skip
    heat.to_parquet(folder / "kv_heat.parquet")
    return folder


def test_heatmap_colourbars_do_not_overlap(sweep_dir, tmp_path):
    run = _heat_run(sweep_dir, tmp_path / "heat")
    drawn = draw_heatmap(run)
    drawn.fig.canvas.draw()
    renderer = drawn.fig.canvas.get_renderer()
    (ax,) = drawn.axes
    bars = [a for a in drawn.fig.axes if a is not ax]
    assert [b.get_xlabel() for b in bars] == [f"accesses ({t})" for t in ("HBM", "DRAM", "SSD")]
    boxes = [_bbox(a, renderer) for a in [ax, *bars]]  # labels and tick labels included
    for i, one in enumerate(boxes):
        for other in boxes[i + 1 :]:
            assert not one.overlaps(other)
    plt.close(drawn.fig)
    plot_heatmap(run, tmp_path / "h.png", PlotOptions(data_out=tmp_path / "h.csv"))
    cells = pd.read_csv(tmp_path / "h.csv")
    assert not cells.duplicated(["time_s", "block"]).any()  # a cell drawn once, in one tier
    assert set(cells.tier) == {"hbm", "dram", "ssd"}


def test_plot_command_takes_the_look_options(sweep_dir, tmp_path, capsys):
    out, data = tmp_path / "t.png", tmp_path / "t.csv"
    args = ["plot", str(sweep_dir), "--kind", "throughput", "--title", "T", "--xlim", "1,5",
            "--ylim=1,", "--legend", "outside", "--logy", "--out", str(out),
            "--data-out", str(data)]  # fmt: skip
    assert main(args) == 0 and out.is_file() and data.is_file()
    assert f"wrote {out} and {data}" in capsys.readouterr().out
    assert main(["plot", str(sweep_dir), "--kind", "link", "--xlim", "5"]) == 2
    assert "--xlim '5': expected LOW,HIGH" in capsys.readouterr().err
    assert main(["plot", str(sweep_dir), "--kind", "throughput", "--logy", "--ylim=0,"]) == 2
    assert "--ylim 0,: the axis is logarithmic; expected limits above 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plot", str(sweep_dir), "--legend", "nowhere"])


def test_a_title_counts_a_facet_with_more_than_three_values(tmp_path):
    folders = []
    for i, (model, mode) in enumerate([("a", "hbm"), ("b", "hbm"), ("c", "offload"), ("d", "hbm")]):
        folder = tmp_path / str(i)
        folder.mkdir()
        config = {"model": {"name": model, "dtype": "bf16"}, "hardware": {"name": "gh200"},
                  "kv": {"mode": mode, "access": {"kind": "full"}}}  # fmt: skip
        (folder / "config.resolved.yaml").write_text(yaml.safe_dump(config))
        folders.append(folder)
    assert describe(folders) == "4 models · gh200 · kv.mode=hbm/offload"
    assert describe(folders[:3]) == "a/b/c · gh200 · kv.mode=hbm/offload"
    assert describe([tmp_path / "none"]) == ""  # a folder without its resolved config
