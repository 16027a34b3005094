"""``kvsim plot SWEEP --kind routing``: each router's TTFT (p50 bars, p99 whiskers) above its
prefix hit rate stacked by tier, from sweep directories written by hand (summaries of known
numbers), and one real cluster sweep end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer, ErrorbarContainer

from experiments import store
from experiments.plots import PlotOptions, draw_routing, routing_data
from experiments.plots.labels import MAX_LABEL, value_labels
from experiments.plots.layout import legend_entries
from experiments.plots.style import plt
from sim.cli import main
from sim.errors import KvsimError
from tests.experiments.sweep_helpers import FAST_BASE, write_sweep

ROUTER, POOL, WORKLOAD = "cluster.router.kind", "cluster.kv_pool", "workload"
ROUTERS = ["kv_aware", "round_robin", "prefix_aware"]  # not sorted: the sweep's order is kept
POOLS = [None, {"capacity": "1TiB", "bandwidth": "200GB/s"}]
SHARED = {"kind": "shared_context", "num_requests": 3000, "customers": 128}
TRACE = {
    "kind": "trace",
    "format": "mooncake",
    "path": "traces/mooncake_fast25_conversation_trace.jsonl",
}
WORKLOADS = [SHARED, TRACE]
TIERS = ("hbm", "dram", "ssd", "pool")
CSV_COLUMNS = [
    "panel", "series", "router", "ttft_p50_ms", "ttft_p99_ms", "hbm_hit_rate_pct",
    "dram_hit_rate_pct", "ssd_hit_rate_pct", "pool_hit_rate_pct", "n",
]  # fmt: skip


def summary(rng: np.random.Generator, pool: bool, reuse: bool = False) -> dict[str, Any]:
    """A point's summary of random figures; ``pool_hit_rate`` only with a pool, as a run has."""
    p50 = float(rng.uniform(0.01, 2.0))
    rates = rng.dirichlet(np.ones(5)) * rng.uniform(0.2, 0.95)  # tiers + a miss, under 1
    out: dict[str, Any] = {"ttft_p50_s": p50, "ttft_p99_s": p50 * float(rng.uniform(1.0, 5.0))}
    for form in ("{}_hit_rate", "{}_reuse_hit_rate") if reuse else ("{}_hit_rate",):
        for tier, rate in zip(TIERS, rates, strict=False):
            if tier != "pool" or pool:
                out[form.format(tier)] = float(rate) / (2 if "reuse" in form else 1)
    return out


def fake_sweep(folder: Path, axes: list[str], points: list[tuple[dict, int, dict]]) -> Path:
    """A sweep directory whose points (params, seed, summary) finished with these summaries."""
    rows = []
    for i, (params, seed, numbers) in enumerate(points):
        point = f"p{i:03d}"
        rows.append({"point_id": point, "params": params, "seed": seed})
        (store.run_dir(folder, point)).mkdir(parents=True)
        (store.run_dir(folder, point) / "summary.json").write_text(json.dumps(numbers))
    manifest = {"source": "test", "axes": axes, "points": rows}
    (folder / store.MANIFEST).write_text(json.dumps(manifest))
    store.write_results(folder)
    return folder


def routing_sweep(folder: Path, seeds: tuple[int, ...] = (0,), reuse: bool = False):
    """3 routers x 2 pools x 2 workloads (x seeds): the directory and each point's summary,
    keyed by (router, pool index, workload index, seed)."""
    rng = np.random.default_rng(27)
    known, points = {}, []
    for router in ROUTERS:
        for p, pool in enumerate(POOLS):
            for w, workload in enumerate(WORKLOADS):
                for seed in seeds:
                    numbers = summary(rng, pool is not None, reuse)
                    known[router, p, w, seed] = numbers
                    params = {ROUTER: router, POOL: pool, WORKLOAD: workload}
                    points.append((params, seed, numbers))
    return fake_sweep(folder, [ROUTER, POOL, WORKLOAD], points), known


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return routing_sweep(tmp_path_factory.mktemp("routing") / "sweep")


def bars(ax) -> list[BarContainer]:
    return [c for c in ax.containers if isinstance(c, BarContainer)]


def whiskers(ax) -> list[ErrorbarContainer]:
    return [c for c in ax.containers if isinstance(c, ErrorbarContainer)]


def test_bars_are_the_summaries_numbers_and_stacks_sum_to_the_hit_rate(sweep):
    folder, known = sweep
    drawn = draw_routing(folder)
    top, bottom = drawn.axes[:2], drawn.axes[2:]
    assert len(drawn.axes) == 4  # two columns (workloads), two rows
    for w, (ax, low) in enumerate(zip(top, bottom, strict=True)):
        assert [c.get_label() for c in bars(ax)] == ["no pool", "pool 1 TiB"]
        for p, (bar, whisker) in enumerate(zip(bars(ax), whiskers(ax), strict=True)):
            p50 = [known[r, p, w, 0]["ttft_p50_s"] * 1e3 for r in ROUTERS]
            p99 = [known[r, p, w, 0]["ttft_p99_s"] * 1e3 for r in ROUTERS]
            assert [b.get_height() for b in bar] == pytest.approx(p50, rel=1e-12)
            segments = whisker.lines[2][0].get_segments()  # from the bar's top to the p99
            assert [s[0][1] for s in segments] == pytest.approx(p50, rel=1e-12)
            assert [s[1][1] for s in segments] == pytest.approx(p99, rel=1e-12)
            centres = [b.get_x() + b.get_width() / 2 for b in bar]
            assert centres == pytest.approx([j + (p - 0.5) * 0.4 for j in range(3)])
        stacks = bars(low)
        assert len(stacks) == 2 * 4  # a segment per tier, pool included (a point has one)
        for p in range(2):
            bottoms = np.zeros(3)
            for t, tier in enumerate(TIERS):
                segment = stacks[4 * p + t]
                rates = [known[r, p, w, 0].get(f"{tier}_hit_rate", 0.0) * 100 for r in ROUTERS]
                assert [b.get_height() for b in segment] == pytest.approx(rates, rel=1e-12)
                assert [b.get_y() for b in segment] == pytest.approx(bottoms, rel=1e-12)
                bottoms += rates
            total = [sum(known[r, p, w, 0].get(f"{t}_hit_rate", 0.0) for t in TIERS) * 100
                     for r in ROUTERS]  # fmt: skip
            tops = [b.get_y() + b.get_height() for b in stacks[4 * p + 3]]
            assert tops == pytest.approx(total, rel=1e-12)
    plt.close(drawn.fig)


def test_labels_name_routers_pools_workloads_and_tiers(sweep):
    folder, _ = sweep
    drawn = draw_routing(folder)
    top, bottom = drawn.axes[:2], drawn.axes[2:]
    assert [ax.get_title() for ax in top] == [
        "shared_context", "trace: mooncake_fast25_conversation_trace"]  # fmt: skip
    for low in bottom:
        assert [t.get_text() for t in low.get_xticklabels()] == ROUTERS
        assert low.get_xlabel() == "router" and low.get_ylabel() == "prefix hit rate (%)"
    assert top[0].get_ylabel() == "TTFT (ms): bar p50, whisker p99"
    _, labels = legend_entries(drawn.axes)
    assert labels == ["no pool", "pool 1 TiB", "TTFT p99 (whisker)", "HBM hit", "DRAM hit",
                      "SSD hit", "KV pool hit"]  # fmt: skip
    assert drawn.fig.legends  # eight entries over two columns: outside
    plt.close(drawn.fig)


def test_data_out_writes_the_drawn_numbers(sweep, tmp_path, capsys):
    folder, known = sweep
    out, data = tmp_path / "r.png", tmp_path / "r.csv"
    args = ["plot", str(folder), "--kind", "routing", "--out", str(out), "--data-out", str(data)]
    assert main(args) == 0 and out.is_file()
    assert f"wrote {out} and {data}" in capsys.readouterr().out
    table = pd.read_csv(data, keep_default_na=False)
    assert list(table.columns) == CSV_COLUMNS and len(table) == 12
    panels = ["shared_context", "trace: mooncake_fast25_conversation_trace"]
    order = [(w, p, r) for w in range(2) for p in range(2) for r in ROUTERS]  # panel, series, x
    for (w, p, r), (_, row) in zip(order, table.iterrows(), strict=True):
        numbers = known[r, p, w, 0]
        assert (row.panel, row.series, row.router) == (panels[w], ["no pool", "pool 1 TiB"][p], r)
        assert row.ttft_p50_ms == pytest.approx(numbers["ttft_p50_s"] * 1e3, rel=1e-12)
        assert row.ttft_p99_ms == pytest.approx(numbers["ttft_p99_s"] * 1e3, rel=1e-12)
        for tier in TIERS:
            expected = numbers.get(f"{tier}_hit_rate", 0.0) * 100  # no pool: 0, not empty
            assert row[f"{tier}_hit_rate_pct"] == pytest.approx(expected, rel=1e-12)
        assert row.n == 1


def test_seeds_are_averaged_and_counted(tmp_path):
    folder, known = routing_sweep(tmp_path / "s", seeds=(0, 1, 2))
    data = routing_data(folder, PlotOptions(where=(f"{WORKLOAD}={json.dumps(SHARED)}",)))
    assert data.n.tolist() == [3] * 6 and set(data.panel) == {""}  # one workload: no panels
    for _, row in data.iterrows():
        r, p = row.router, ["no pool", "pool 1 TiB"].index(row.series)
        for key in ("ttft_p50_s", "ttft_p99_s", "hbm_hit_rate", "pool_hit_rate"):
            mean = np.mean([known[r, p, 0, s].get(key, 0.0) for s in range(3)])
            assert row[key] == pytest.approx(mean, rel=1e-12)


def test_reuse_metric_draws_the_cross_request_rates(tmp_path):
    folder, known = routing_sweep(tmp_path / "s", reuse=True)
    drawn = draw_routing(folder, PlotOptions(metric="reuse", panel=""))
    assert drawn.axes[1].get_ylabel() == "cross-request hit rate (%)"
    reuse = [f"{t}_reuse_hit_rate_pct" for t in TIERS]
    assert list(drawn.data.columns) == [*CSV_COLUMNS[:5], *reuse, "n"]
    first = drawn.data.iloc[0]  # kv_aware, no pool, both workloads in one series each
    assert first.series == "no pool, shared_context" and first.router == "kv_aware"
    assert first.hbm_reuse_hit_rate_pct == pytest.approx(
        known["kv_aware", 0, 0, 0]["hbm_reuse_hit_rate"] * 100, rel=1e-12)  # fmt: skip
    plt.close(drawn.fig)


def test_without_a_pool_the_stacks_have_three_tiers(tmp_path):
    rng = np.random.default_rng(3)
    points = [({ROUTER: r}, 0, summary(rng, pool=False)) for r in ROUTERS]
    drawn = draw_routing(fake_sweep(tmp_path / "s", [ROUTER], points))
    top, low = drawn.axes
    assert len(bars(top)) == 1 and bars(top)[0].get_label() == "_nolegend_"  # one series
    assert len(bars(low)) == 3
    tops = [b.get_y() + b.get_height() for b in bars(low)[2]]
    total = [sum(n[f"{t}_hit_rate"] for t in TIERS[:3]) * 100 for _, _, n in points]
    assert tops == pytest.approx(total, rel=1e-12)
    assert legend_entries(drawn.axes)[1] == ["TTFT p99 (whisker)", "HBM hit", "DRAM hit", "SSD hit"]
    assert (drawn.data.pool_hit_rate_pct == 0).all()
    plt.close(drawn.fig)


def test_the_look_options_apply(sweep):
    folder, _ = sweep
    options = PlotOptions(where=(f"{ROUTER}=round_robin|kv_aware",), title="T", legend="none",
                          panel=POOL, logy=True, ylim=(1.0, None))  # fmt: skip
    drawn = draw_routing(folder, options)
    top, bottom = drawn.axes[:2], drawn.axes[2:]
    assert drawn.fig._suptitle.get_text() == "T" and not drawn.fig.legends
    assert [ax.get_title() for ax in top] == ["no pool", "pool 1 TiB"]
    assert [t.get_text() for t in bottom[0].get_xticklabels()] == ["kv_aware", "round_robin"]
    assert all(ax.get_yscale() == "log" and ax.get_ylim()[0] == 1.0 for ax in top)
    assert all(ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0 for ax in bottom)
    assert [c.get_label() for c in bars(top[0])] == [
        "shared_context", "trace: mooncake_fast25_conversation_trace"]  # fmt: skip
    plt.close(drawn.fig)


def _many(folder: Path, axis: str, values: list[Any]) -> Path:
    rng = np.random.default_rng(5)
    points = [({ROUTER: "round_robin", axis: v}, 0, summary(rng, False)) for v in values]
    return fake_sweep(folder, [ROUTER, axis], points)


@pytest.mark.parametrize(
    ("make", "options", "message"),
    [
        (lambda f: fake_sweep(f, ["kv.mode"], [({"kv.mode": "hbm"}, 0, {})]), PlotOptions(),
         r"it draws a sweep over cluster\.router\.kind .*axes are kv\.mode; name another axis "
         r"for the categories with --x AXIS"),
        (lambda f: _many(f, WORKLOAD, [{"kind": "synthetic", "num_requests": n}
                                       for n in range(5)]), PlotOptions(),
         r"5 panels \(columns\) is more than the 4 a routing figure draws .*--where"),
        (lambda f: _many(f, "engine.max_num_seqs", list(range(9))), PlotOptions(),
         r"9 series is more than the 8 .* --where KEY=V1\|V2"),
        (lambda f: _many(f, "engine.max_num_seqs", [1, 2]), PlotOptions(hue=()),
         r"axis 'engine\.max_num_seqs' varies \(1, 2\) but is not --x, --hue nor --panel; fix "
         r"it with --where engine\.max_num_seqs=1 or add it to --hue"),
        (lambda f: _many(f, "engine.max_num_seqs", [1, 2]), PlotOptions(metric="ttft"),
         r"--metric ttft: routing draws the prefix hit rate; expected one of: hit, reuse"),
        (lambda f: _many(f, "engine.max_num_seqs", [1, 2]), PlotOptions(x="kv.mode"),
         r"--x kv\.mode: not an axis of this sweep; axes: cluster\.router\.kind, engine"),
        (lambda f: _many(f, "engine.max_num_seqs", [1, 2]), PlotOptions(panel=ROUTER),
         r"--panel cluster\.router\.kind: that axis is on x already"),
        (lambda f: _many(f, "engine.max_num_seqs", [1, 2]), PlotOptions(hue=("nope",)),
         r"--hue nope: not an axis of this sweep"),
        (lambda f: _many(f, "engine.max_num_seqs", [1, 2]), PlotOptions(logx=True),
         r"--logx: the routing figure's x axis holds routers \(categories\)"),
        (lambda f: _many(f, "engine.max_num_seqs", [1, 2]), PlotOptions(metric="reuse"),
         r"no hbm_reuse_hit_rate, .* rerun the sweep, or draw --metric hit"),
    ],
)  # fmt: skip
def test_bad_requests_are_one_clear_error(tmp_path, make, options, message):
    with pytest.raises(KvsimError, match=message):
        draw_routing(make(tmp_path / "s"), options)


def test_too_many_routers_are_refused(tmp_path):
    rng = np.random.default_rng(1)
    points = [({ROUTER: f"r{i}"}, 0, summary(rng, False)) for i in range(13)]
    with pytest.raises(KvsimError, match=r"13 routers is more than the 12 .*--where cluster"):
        draw_routing(fake_sweep(tmp_path / "s", [ROUTER], points))


def test_the_command_says_what_is_missing(tmp_path, capsys):
    folder = fake_sweep(tmp_path / "s", ["kv.mode"], [({"kv.mode": "hbm"}, 0, {})])
    assert main(["plot", str(folder), "--kind", "routing"]) == 2
    err = capsys.readouterr().err
    assert "routing compares routers" in err and err.count("\n") == 1
    assert main(["plot", str(tmp_path), "--kind", "routing"]) == 2
    assert "routing plots a sweep: give one directory written by 'kvsim sweep'" in (
        capsys.readouterr().err)  # fmt: skip


@pytest.mark.parametrize(
    ("axis", "values", "expected"),
    [
        (POOL, [None, {"capacity": "1TiB", "bandwidth": "200GB/s"}], ["no pool", "pool 1 TiB"]),
        (POOL, [{"capacity": 2.0**39, "bandwidth": 1e11}], ["pool 512 GiB"]),
        (POOL, [{"capacity": "1TiB", "bandwidth": "200GB/s"}, {"capacity": "1TiB", "bandwidth":
                "100GB/s"}], ["pool 1 TiB (bandwidth=200GB/s)", "pool 1 TiB (bandwidth=100GB/s)"]),
        (WORKLOAD, [SHARED, TRACE, "short-chat", {"preset": "bursty", "num_requests": 9}],
         ["shared_context", "trace: mooncake_fast25_conversation_trace", "short-chat", "bursty"]),
        (WORKLOAD, [{"kind": "fitted", "from": {"format": "azure", "path": "a/conv.csv"}}],
         ["fitted: conv"]),
        (WORKLOAD, [{"kind": "synthetic", "num_requests": 4}, {"kind": "synthetic",
                                                               "num_requests": 8}],
         ["synthetic (num_requests=4)", "synthetic (num_requests=8)"]),
        ("engine.max_num_seqs", [64, 128], ["engine.max_num_seqs=64", "engine.max_num_seqs=128"]),
        ("kv.access", ["full", {"kind": "sparse", "topk_blocks": 8}],
         ["kv.access=full", "kv.access=sparse"]),
    ],
)  # fmt: skip
def test_value_labels_are_short_and_tell_values_apart(axis, values, expected):
    assert list(value_labels(axis, values).values()) == expected


def test_long_labels_are_cut_and_still_distinct():
    values = [{"kind": "x", "note": "a" * 80 + str(i)} for i in range(2)]
    labels = list(value_labels("some.axis", values).values())
    assert all(len(label) <= MAX_LABEL + 3 for label in labels)
    assert labels[0].startswith("some.axis=x (note=aaa") and "…" in labels[0]
    assert labels == [f"{labels[0][:-3]} #1", f"{labels[0][:-3]} #2"]
    assert value_labels(ROUTER, ["kv_aware"], named=False) == {"kv_aware": "kv_aware"}


def test_a_summary_key_named_like_an_axis_leaves_the_axis_its_column(tmp_path):
    report = {"path": "conv.jsonl", "requests": 200}  # a trace run's summary 'workload'
    points = [({WORKLOAD: w, ROUTER: "round_robin"}, 0, {"workload": report, "ttft_p50_s": 1.0})
              for w in WORKLOADS]  # fmt: skip
    frame = store.load(fake_sweep(tmp_path / "s", [WORKLOAD, ROUTER], points))
    assert [json.loads(v) for v in frame[WORKLOAD]] == WORKLOADS
    assert frame.ttft_p50_s.tolist() == [1.0, 1.0]


def test_a_real_cluster_sweep_draws_its_results(tmp_path):
    base = {**FAST_BASE, "workload": {**FAST_BASE["workload"], "num_requests": 12},
            "cluster": {"instances": 2}}  # fmt: skip
    sweep = {
        "base": base,
        "grid": {ROUTER: ["round_robin", "prefix_aware"],
                 POOL: [None, {"capacity": "64GiB", "bandwidth": "100GB/s"}]},
    }  # fmt: skip
    out = tmp_path / "out"
    assert main(["sweep", str(write_sweep(tmp_path, sweep)), "--out", str(out), "--workers", "1",
                 "--quiet"]) == 0  # fmt: skip
    data = tmp_path / "r.csv"
    assert main(["plot", str(out), "--kind", "routing", "--data-out", str(data)]) == 0
    table, results = pd.read_csv(data, keep_default_na=False), store.load(out)
    assert table.series.tolist() == ["no pool"] * 2 + ["pool 64 GiB"] * 2
    assert table.router.tolist() == ["round_robin", "prefix_aware"] * 2
    by_point = results.set_index([ROUTER, results[POOL].astype(str)])
    for _, row in table.iterrows():
        pool = "None" if row.series == "no pool" else '{"bandwidth":"100GB/s","capacity":"64GiB"}'
        point = by_point.loc[(row.router, pool)]
        assert row.ttft_p50_ms == pytest.approx(point.ttft_p50_s * 1e3, rel=1e-12)
        for tier in TIERS:
            rate = point[f"{tier}_hit_rate"]
            assert row[f"{tier}_hit_rate_pct"] == pytest.approx(
                0.0 if pd.isna(rate) else rate * 100, rel=1e-12)  # fmt: skip
    assert (out / "routing.png").is_file()
