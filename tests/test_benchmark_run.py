"""The benchmark's table and instruction counts (benchmarks/run.py; its timings are not tested)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from benchmarks import run
from benchmarks.run import BY_KEY, _collected, capped, format_table

CALLGRIND_SUMMARY = """==12== Events    : Ir
==12== Collected : 2705157420
==12==
==12== I   refs:      2,705,157,420
"""


def test_the_instruction_count_is_callgrinds_collected_figure():
    assert _collected(CALLGRIND_SUMMARY) == 2_705_157_420


def test_no_count_in_valgrinds_output_is_an_error():
    with pytest.raises(RuntimeError, match="no instruction count"):
        _collected("valgrind: python: command not found\n")


def test_the_table_shows_instructions_only_when_counted():
    row = {
        "wall_s": 2.0,
        "cpu_s": 2.5,
        "peak_rss_bytes": 100 * 2**20,
        "sim_per_wall": 300.0,
        "steps_per_s": 20_000.0,
        "events_per_s": 1_500.0,
    }
    plain = format_table({"6": row}).splitlines()
    counted = format_table({"6": {**row, "instructions": 5_619_000_000}}).splitlines()
    assert "G instr" not in plain[0] and "G instr" in counted[0]
    assert counted[-1].split()[-4:] == ["5.619", "<=", "2.3", "s"] and "5.619" not in plain[-1]


def test_max_requests_cuts_every_engine_workload():
    assert capped(BY_KEY["1"].config, 500)["workload"]["max_requests"] == 500  # a trace
    assert capped(BY_KEY["6"].config, 2000)["workload"]["num_requests"] == 2000  # drawn
    assert capped(BY_KEY["3"].config, 2000)["workload"]["num_requests"] == 32  # already fewer
    assert capped(BY_KEY["6"].config, None)["workload"]["num_requests"] == 4000
    assert BY_KEY["6"].config["workload"]["num_requests"] == 4000  # a copy


def test_profile_writes_the_workloads_report(tmp_path):
    """``--profile``: the child runs the workload under pyinstrument and writes its report,
    which shows the simulation (the engine's run), beside the usual figures."""
    pytest.importorskip("pyinstrument")
    row = run.run_one("3", profile=tmp_path / "3.txt")
    assert row["steps"] > 0 and "error" not in row
    report = (tmp_path / "3.txt").read_text()
    assert "_run_engine" in report and "Cluster.run" in report


@pytest.mark.parametrize(
    ("argv", "missing", "message"),
    [
        (["--profile", "p", "--instructions"], None, "give one"),
        (["--profile", "p"], "pyinstrument", "pyinstrument is not installed"),
    ],
)
def test_profile_is_refused_with_one_message(monkeypatch, argv, missing, message):
    """``--profile`` with ``--instructions``, or without pyinstrument: one line, no run."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == missing else find_spec(name)
    )
    monkeypatch.setattr(sys, "argv", ["benchmarks.run", "--only", "3", *argv])
    with pytest.raises(SystemExit, match=message):
        run.main()


def test_the_cluster_workload_is_2b_at_eight_times_the_rate_on_eight_instances():
    one, eight = BY_KEY["2b"].config, BY_KEY["7"].config
    assert eight["cluster"] == {"instances": 8, "router": {"kind": "round_robin"}}
    assert eight["workload"] == {**one["workload"], "rate_scale": 8.0}
    assert {k: v for k, v in eight.items() if k not in ("cluster", "workload")} == {
        k: v for k, v in one.items() if k != "workload"
    }
    assert run.cluster_note({"2b": {"wall_s": 50.0}, "7": {"wall_s": 80.0}}).endswith("1.60x")
    assert run.cluster_note({"7": {"wall_s": 80.0}}) is None


def test_the_pair_table_gives_each_pairs_cpu_ratio():
    """3 CPU s here against 4 there: 0.750; instructions 2 G against 2.5 G: 0.800x; a pair
    with an error says so."""
    here = {"cpu_s": 3.0, "instructions": 2_000_000_000}
    there = {"cpu_s": 4.0, "instructions": 2_500_000_000}
    table = run.pair_table({"1": (here, there), "2a": ({"error": "boom"}, there)}, "../base")
    lines = table.splitlines()
    assert lines[1].split() == ["1", "3.00", "4.00", "0.750", "instructions", "0.800x"]
    assert lines[2].split() == ["2a", "error:", "boom"]


def test_a_pair_runs_in_both_trees(tmp_path):
    """``kvsim --help`` timed here and in a second checkout of this tree (a copy of what the
    child imports): both rows have their figures."""
    import shutil

    for name in ("sim", "policies", "benchmarks", "hardware_profiles", "model_profiles"):
        shutil.copytree(run.HERE / name, tmp_path / name)
    mine, theirs = run.run_pair("help", tmp_path)
    assert mine["cpu_s"] > 0 and theirs["cpu_s"] > 0 and "error" not in theirs


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--repeat", "2"], "without --profile or --repeat"), ([], "no benchmarks/run.py there")],
)
def test_against_is_refused_with_one_message(monkeypatch, tmp_path, argv, message):
    monkeypatch.setattr(
        sys, "argv", ["benchmarks.run", "--only", "help", "--against", str(tmp_path), *argv]
    )
    if argv:
        (tmp_path / "benchmarks").mkdir()
        (tmp_path / "benchmarks" / "run.py").write_text("")
    with pytest.raises(SystemExit, match=message):
        run.main()
