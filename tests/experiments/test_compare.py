"""kvsim compare: summaries side by side, differences against the first run, on real runs.

The command is tested through its registration function (``add_compare_command`` on a
fresh parser): ``sim.cli`` finds commands through the installed entry points, which are
those of the editable install, not of this tree's pyproject.toml.
"""

import argparse
import json
import math
import re

import pytest

from experiments import store
from experiments.commands import add_compare_command
from experiments.compare import HEADLINE, compare, format_table, run_names, show, show_delta
from experiments.runner import run_sweep
from experiments.sweep import load_sweep
from experiments.tasks import Limits
from sim.errors import KvsimError
from sim.run import simulate
from sim.rundir import write_run
from tests.conftest import make_config
from tests.experiments.sweep_helpers import FAST_BASE, write_sweep


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The same workload with 2 and with 64 sequences at most: different latencies."""
    folder = tmp_path_factory.mktemp("compare")
    small = write_run(simulate(make_config("engine.max_num_seqs=2")), folder / "seqs2")
    large = write_run(simulate(make_config()), folder / "seqs64")
    return small, large


def _summary(run):
    return json.loads((run / "summary.json").read_text())


def _cli(argv):
    parser = argparse.ArgumentParser(prog="kvsim")
    add_compare_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_compare_sets_the_summaries_side_by_side_with_differences(two_runs):
    small, large = two_runs
    a, b = _summary(small), _summary(large)
    table = compare([small, large])
    assert table.attrs["runs"] == ["seqs2", "seqs64"]
    assert list(dict.fromkeys(table.key)) == [k for k in HEADLINE if k in a]
    for key in ("ttft_p50_s", "output_tokens_per_s", "preemptions", "hbm_peak_bytes"):
        rows = table[table.key == key].set_index("run")
        assert rows.value["seqs2"] == a[key] and rows.value["seqs64"] == b[key]
        assert rows.delta["seqs2"] == 0
        assert rows.delta["seqs64"] == pytest.approx(b[key] - a[key])
        if a[key]:
            assert rows.percent["seqs64"] == pytest.approx((b[key] - a[key]) / abs(a[key]) * 100)
    assert a["ttft_p50_s"] != b["ttft_p50_s"]  # the two runs do differ


def test_keys_pick_the_rows_and_unknown_keys_are_refused(two_runs):
    small, large = two_runs
    table = compare([small, large], ["steps", "rejected_reasons", "wall_time_s"])
    assert list(table.key) == ["steps", "steps", "rejected_reasons", "rejected_reasons",
                               "wall_time_s", "wall_time_s"]  # fmt: skip
    reasons = table[table.key == "rejected_reasons"]
    assert reasons.value.tolist() == [{}, {}] and reasons.delta.isna().all()
    assert isinstance(table.value[0], int)  # counts stay integers
    with pytest.raises(KvsimError, match=r"--keys nope: in no run's summary\.json; keys: "):
        compare([small], ["steps", "nope"])


def test_a_folder_without_summary_is_refused_by_name(two_runs, tmp_path):
    with pytest.raises(KvsimError, match=rf"{re.escape(str(tmp_path))}: no summary\.json; exp"):
        compare([two_runs[0], tmp_path])
    (tmp_path / "sweep.json").write_text("{}")
    with pytest.raises(KvsimError, match=r"a sweep directory: compare its points"):
        compare([tmp_path])
    (tmp_path / "summary.json").write_text("{not json")
    with pytest.raises(KvsimError, match=r"summary\.json: not valid JSON"):
        compare([tmp_path])


def test_compare_reads_sweep_point_folders(tmp_path):
    grid = {"engine.max_num_seqs": [1, 4]}
    out = tmp_path / "out"
    sweep = load_sweep(write_sweep(tmp_path, {"base": FAST_BASE, "grid": grid}))
    run_sweep(sweep, out, Limits(workers=1), progress=False)
    points = [store.run_dir(out, p) for p in store.load(out).point_id]
    table = compare(points, ["requests_finished", "sim_time_s"])
    assert table.attrs["runs"] == [p.name for p in points]
    sim = table[table.key == "sim_time_s"].value.tolist()
    assert sim == [_summary(p)["sim_time_s"] for p in points]
    with pytest.raises(KvsimError, match="a sweep directory"):
        compare([out])


def test_folders_of_one_name_are_told_apart_by_their_parents(tmp_path):
    names = run_names([tmp_path / "a" / "run", tmp_path / "b" / "run", tmp_path / "c"])
    assert names == ["a/run", "b/run", "c"]
    assert run_names([tmp_path / "x", tmp_path / "x"])[1].endswith("x#2")


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("ttft_p50_s", 0.0521, "52.1 ms"),
        ("sim_time_s", 48.587, "48.59 s"),
        ("sim_time_s", 9363.2, "9,363 s"),
        ("hbm_hit_rate", 0.2341, "23.4%"),
        ("output_tokens_per_s", 2465.04, "2,465.0/s"),
        ("kv_pool_bytes", 1.5 * 2**30, "1.50 GiB"),
        ("preemptions", 1234, "1,234"),
        ("mean_batch_size", 93.532, "93.53"),
        ("overloaded", True, "true"),
        ("rejected_reasons", {"exceeds_kv_pool": 2}, '{"exceeds_kv_pool":2}'),
        ("ttft_p99_s", None, "-"),
    ],
)
def test_values_are_shown_in_readable_units(key, value, text):
    assert show(key, value) == text


@pytest.mark.parametrize(
    ("key", "delta", "percent", "text"),
    [
        ("ttft_p50_s", -0.0032, -5.8, "(-3.2 ms, -5.8%)"),
        ("hbm_hit_rate", 0.05, 25.0, "(+5.0 pp, +25.0%)"),
        ("output_tokens_per_s", 120.0, 4.9, "(+120.0/s, +4.9%)"),
        ("hbm_peak_bytes", 2.0**30, 1.3, "(+1.00 GiB, +1.3%)"),
        ("preemptions", 3.0, math.nan, "(+3)"),  # from 0: no percent
        ("steps", 0.0, 0.0, "(=)"),
        ("rejected_reasons", math.nan, math.nan, ""),
    ],
)
def test_differences_are_shown_absolute_and_in_percent(key, delta, percent, text):
    assert show_delta(key, delta, percent) == text


def test_the_command_prints_one_column_per_run(two_runs, capsys):
    small, large = two_runs
    assert _cli(["compare", str(small), str(large), "--keys", "ttft_p50_s,preemptions"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["key", "seqs2", "seqs64"]
    a, b = _summary(small), _summary(large)
    delta = b["ttft_p50_s"] - a["ttft_p50_s"]
    percent = delta / a["ttft_p50_s"] * 100
    sign = "+" if delta > 0 else "-"
    assert lines[1].split("  ")[0] == "ttft_p50_s"
    assert f"{_time(a['ttft_p50_s'])}" in lines[1] and f"{_time(b['ttft_p50_s'])}" in lines[1]
    assert f"({sign}{_time(abs(delta))}, {percent:+.1f}%)" in lines[1]
    assert lines[2].split()[:3] == ["preemptions", f"{a['preemptions']:,d}",
                                    f"{b['preemptions']:,d}"]  # fmt: skip
    assert lines[-1] == "differences against seqs2"
    alone = format_table(compare([small])).splitlines()
    assert alone[1].startswith("requests_finished") and "differences" not in alone[-1]


def _time(seconds):
    """Seconds as the table shows them: ms under a second, else s."""
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"
