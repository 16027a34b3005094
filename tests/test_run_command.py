"""``kvsim run``'s honesty: the progress bar (drawn on a terminal only, results unchanged,
redrawn a few times a second at most), the overload warning, the refusal of a non-empty
``--out`` without ``--force``, and the summary's HBM cache range in ``dram_centric``."""

from __future__ import annotations

import copy
import functools
import io
import json
import re
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from sim.cli import main
from sim.config import build_config
from sim.instance.scheduler import FINISHED, REJECTED, RUNNING, WAITING
from sim.observe.progress import RunProgress
from sim.run import simulate
from sim.rundir import RUN_FILES
from sim.units import format_bytes
from tests.conftest import BASE

EAGER = functools.partial(RunProgress, delay_s=0.0, redraw_s=0.0, every=1)  # every step


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal, and keeps what was drawn on it."""

    def isatty(self) -> bool:
        return True


def write_config(tmp_path, data=None, name="run.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data or BASE))
    return path


def no_run(*args, **kwargs):
    raise AssertionError("the run started before the output folder was checked")


# --- the progress bar ---------------------------------------------------------------------


def test_progress_bar_draws_requests_done_and_simulated_time_on_a_terminal(tmp_path, monkeypatch):
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr("sim.observe.progress.RunProgress", EAGER)
    out = tmp_path / "out"
    assert main(["run", str(write_config(tmp_path)), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    drawn = terminal.getvalue()
    done = [int(n) for n in re.findall(r"(\d+)/20 ", drawn)]
    assert done and done == sorted(done), drawn  # requests done never go back
    assert done[-1] == summary["requests_finished"] + summary["requests_rejected"] == 20
    times = [float(t.replace(",", "")) for t in re.findall(r"simulated ([\d,.]+) s", drawn)]
    assert times == sorted(times) and times[-1] > 0
    assert f"simulated {summary['sim_time_s']:,.1f} s" in drawn  # the last step ends the run


@pytest.mark.parametrize(("tty", "flags"), [(False, []), (True, ["--quiet"])])
def test_progress_bar_is_silent_off_a_terminal_and_with_quiet(tmp_path, monkeypatch, tty, flags):
    stream = FakeTerminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr("sim.observe.progress.RunProgress", EAGER)
    assert main(["run", str(write_config(tmp_path)), "--out", str(tmp_path / "o"), *flags]) == 0
    assert stream.getvalue() == ""


PREEMPTING = copy.deepcopy(BASE)  # two requests fit, not their whole outputs: preemptions
PREEMPTING["engine"] = {**BASE["engine"], "kv_pool_blocks": 66}
DRAM_CENTRIC = {**BASE, "kv": {"mode": "dram_centric"}}


@pytest.mark.parametrize("data", [BASE, PREEMPTING, DRAM_CENTRIC], ids=["hbm", "preempt", "dram"])
def test_progress_bar_changes_no_result(data):
    config = build_config(copy.deepcopy(data), "<test>")
    plain = simulate(config)
    with EAGER(FakeTerminal()) as progress:
        watched = simulate(config, observers=[progress.attach])
    assert progress.bar is not None  # it drew
    pd.testing.assert_frame_equal(watched.requests, plain.requests)
    pd.testing.assert_frame_equal(watched.timeline, plain.timeline)
    drop = ("wall_time_s",)
    assert {k: v for k, v in watched.summary.items() if k not in drop} == {
        k: v for k, v in plain.summary.items() if k not in drop
    }
    if data is PREEMPTING:
        assert plain.summary["preemptions"] > 0


def fake_instance(status: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        scheduler=SimpleNamespace(status=np.array(status, dtype=np.int8)),
        env=SimpleNamespace(now=12.5),
    )


def test_progress_looks_at_the_clock_every_n_steps_and_redraws_a_few_times_a_second():
    now = [0.0]
    looks = []

    def clock() -> float:
        looks.append(now[0])
        return now[0]

    terminal = FakeTerminal()
    status = [FINISHED, REJECTED, RUNNING, WAITING, FINISHED, 0]  # 0: not arrived yet
    progress = RunProgress(terminal, delay_s=3.0, redraw_s=0.25, every=64, clock=clock)
    drawn = []
    redraw = progress.redraw
    progress.redraw = lambda: (drawn.append(now[0]), redraw())
    with progress:
        progress.attach(fake_instance(status))
        for step in range(10_000):  # 1 ms of wall time per step: 10 s
            now[0] = (step + 1) * 1e-3
            if step % 10 == 0:
                progress.steps_ended({}, 3)  # a run of steps counts as its steps
            else:
                progress.step_ended({})
        assert progress.bar is not None and progress.bar.n == 3  # finished or rejected
    steps = 10_000 + 2 * 1_000
    assert len(looks) <= 2 + steps // 64  # the attach, the bar's start, one per 64 steps
    assert drawn and min(drawn) >= 3.0  # nothing before the delay
    assert np.diff(drawn).min() >= 0.25  # at most four a second
    assert 20 <= len(drawn) <= (10 - 3) / 0.25 + 1
    assert "3/6" in terminal.getvalue() and "simulated 12.5 s" in terminal.getvalue()


# --- the overload warning -----------------------------------------------------------------


def stub_summary(monkeypatch, **keys) -> None:
    """Runs as usual, with ``keys`` added to the summary (as the overload detector does)."""

    def stubbed(*args, **kwargs):
        result = simulate(*args, **kwargs)
        result.summary.update(keys)
        return result

    monkeypatch.setattr("sim.run.simulate", stubbed)


def test_overloaded_run_prints_one_warning_line_with_both_rates(tmp_path, capsys, monkeypatch):
    stub_summary(monkeypatch, overloaded=True, offered_rate_rps=12.5, served_rate_rps=4.25)
    out = tmp_path / "out"
    assert main(["run", str(write_config(tmp_path)), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    warning = lines[0]
    assert warning.startswith("kvsim: warning: overloaded: ")
    for fragment in ("12.5/s", "4.25/s", "lower the arrival rate", "add capacity"):
        assert fragment in warning, warning
    assert "requests finished" in captured.out  # the summary table is still printed
    assert json.loads((out / "summary.json").read_text())["overloaded"] is True


@pytest.mark.parametrize("keys", [{}, {"overloaded": False, "offered_rate_rps": 1.0}])
def test_a_run_that_keeps_up_prints_no_warning(tmp_path, capsys, monkeypatch, keys):
    stub_summary(monkeypatch, **keys)
    assert main(["run", str(write_config(tmp_path)), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == ""


# --- the output folder --------------------------------------------------------------------


def test_non_empty_out_is_refused_without_force_before_the_run(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    monkeypatch.setattr("sim.run.simulate", no_run)
    assert main(["run", str(write_config(tmp_path)), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsim: error: ") and err.count("\n") == 1, err
    assert f"{out}: the output folder is not empty (it holds notes.txt)" in err
    assert "--force" in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


def test_force_replaces_a_run_and_an_empty_folder_needs_no_force(tmp_path, capsys):
    config, out = str(write_config(tmp_path)), tmp_path / "out"
    out.mkdir()  # empty: accepted as is
    assert main(["run", config, "--out", str(out)]) == 0
    (out / "figure.png").write_bytes(b"old")
    assert main(["run", config, "--out", str(out), "--set", "seed=1"]) == 2
    assert main(["run", config, "--out", str(out), "--set", "seed=1", "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(RUN_FILES)
    assert yaml.safe_load((out / "config.resolved.yaml").read_text())["seed"] == 1


def test_force_does_not_replace_a_folder_of_folders(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sweep"
    (out / "points" / "abc").mkdir(parents=True)
    (out / "sweep.json").write_text("{}")
    monkeypatch.setattr("sim.run.simulate", no_run)
    assert main(["run", str(write_config(tmp_path)), "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert f"{out}: holds folders (points/)" in err and "choose another --out" in err
    assert (out / "points" / "abc").is_dir() and (out / "sweep.json").read_text() == "{}"


# --- the summary table --------------------------------------------------------------------


def summary_line(text: str, label: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(label))


def test_dram_centric_summary_shows_the_hbm_cache_range(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(write_config(tmp_path, DRAM_CENTRIC)), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    cache = pd.read_parquet(out / "timeline.parquet").hbm_kv_pool_bytes
    low, high = format_bytes(cache.min()), format_bytes(cache.max())
    assert low != high  # activations change the cache from step to step
    assert summary_line(printed, "HBM cache (dram_centric)").split()[-5:] == [
        *low.split(),
        "to",
        *high.split(),
    ]
    assert "KV pool" not in printed


def test_hbm_summary_shows_the_kv_pool(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(write_config(tmp_path)), "--out", str(out)]) == 0
    pool = json.loads((out / "summary.json").read_text())["kv_pool_bytes"]
    assert summary_line(capsys.readouterr().out, "KV pool").endswith(f"  {format_bytes(pool)}")
