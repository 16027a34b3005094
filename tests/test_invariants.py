"""Invariant checks (sim/observe/invariants.py): a deliberately corrupted state is caught,
clearly."""

from __future__ import annotations

import re

import pytest
import yaml

from experiments import store
from sim.cli import main
from sim.instance.scheduler import Scheduler
from sim.kv.manager import KvManager
from sim.memory.blocks import DRAM, HBM
from sim.observe.invariants import InvariantViolation
from sim.run import Simulation
from sim.workload import build_requests
from tests.conftest import BASE, make_config

STEP = re.compile(r"invariant violated after step \d+ \(t = \d+\.\d{6} s\): ")


def engine(*overrides: str) -> Simulation:
    config = make_config("engine.check=true", *overrides)
    return Simulation(config, build_requests(config.workload, config.seed))


def corrupt_after(eng: Simulation, steps: int, damage) -> None:
    """Apply ``damage(eng)`` once the ``steps``-th step completed (before its checks run)."""
    complete, calls = eng.scheduler.complete, [0]

    def corrupted(batch, now):
        done = complete(batch, now)
        calls[0] += 1
        if calls[0] == steps:
            damage(eng)
        return done

    eng.scheduler.complete = corrupted


def first_running_block(eng: Simulation) -> int:
    return next(blocks[0] for blocks in eng.kv.blocks if blocks)


def bump_ref(eng: Simulation) -> None:
    eng.kv.table.ref[first_running_block(eng)] += 1


def shrink_hbm(eng: Simulation) -> None:
    eng.kv.tiers[HBM].capacity = 0


def miscount_hbm(eng: Simulation) -> None:
    eng.kv.tiers[HBM].resident -= 1


def phantom_delivery(eng: Simulation) -> None:
    eng.links.h2d.bytes_delivered += 1e6


def inflate_hbm_kv(eng: Simulation) -> None:
    real = eng.kv.hbm_kv_bytes
    eng.kv.hbm_kv_bytes = lambda: (real()[0] + 4096.0, real()[1])  # one page too many


def phantom_index_entry(eng: Simulation) -> None:
    eng.kv.table.index[12345] = first_running_block(eng)  # a hash its block does not hold


def running_block_to_dram(eng: Simulation) -> None:
    """A running request's block moves from HBM to DRAM, each tier counting it right."""
    rid = eng.scheduler.running[0]
    b = eng.kv.blocks[rid][0]
    eng.kv.table.where[HBM, b], eng.kv.table.where[DRAM, b] = False, True
    eng.kv.tiers[HBM].resident -= 1
    eng.kv.tiers[DRAM].resident += 1


def dropped_block_in_dram(eng: Simulation) -> None:
    """A dropped block (its id free) still resident in DRAM, counted right (the cascade bug
    ``tests/test_write_through_bulk.py`` builds by hand, now fixed)."""
    t = eng.kv.table
    b = t.new(owner=0, position=0, heat=0.0)
    t.ref[b] = 0
    t.drop(b)
    t.where[DRAM, b] = True
    eng.kv.tiers[DRAM].resident += 1


def phantom_swap_hold(eng: Simulation) -> None:
    eng.kv.swap.holds[first_running_block(eng)] = 1  # no request is swapped out


@pytest.mark.parametrize(
    ("damage", "fragments"),
    [
        (running_block_to_dram, ["a running request's block is not in hbm", "request #"]),
        (phantom_swap_hold, ["swapped-out holders miscounted", "on one side only"]),
        (dropped_block_in_dram, ["a dropped block (its id free) is still in a tier", "block "]),
        (bump_ref, ["block reference counts do not match their owners", "ref 2, held by 1"]),
        (shrink_hbm, ["tier hbm above capacity", "capacity 0"]),
        (miscount_hbm, ["tier hbm miscounts its blocks", "block table"]),
        (phantom_delivery, ["link h2d does not conserve bytes", "delivered 1000000"]),
        (inflate_hbm_kv, ["HBM KV bytes differ from its resident blocks", "running"]),
        (phantom_index_entry, ["the prefix index and the blocks' hashes disagree", "hash 12345"]),
    ],
)
def test_corrupted_state_stops_the_run_at_that_step(damage, fragments):
    eng = engine("engine.decode_runs=false")  # every step on its own (runs: below)
    corrupt_after(eng, 3, damage)
    with pytest.raises(InvariantViolation) as info:
        eng.run()
    message = str(info.value)
    assert STEP.match(message) and message.startswith("invariant violated after step 3 "), message
    for fragment in fragments:
        assert fragment in message, message


def test_a_request_that_never_ends_is_caught_at_the_end(monkeypatch):
    add = Scheduler.add

    def lose_request_zero(self, rid):
        if rid == 0:
            self.status[rid] = 1  # waiting, but never queued
            return True
        return add(self, rid)

    monkeypatch.setattr(Scheduler, "add", lose_request_zero)
    with pytest.raises(InvariantViolation, match=r"neither finished nor was rejected.*first #0"):
        engine().run()


def test_a_rejection_without_reason_is_caught(monkeypatch):
    monkeypatch.setattr(Scheduler, "_reason", lambda self, length: "")
    with pytest.raises(InvariantViolation, match="rejected without a reason"):
        engine("engine.max_model_len=100").run()


def test_clean_runs_pass_in_every_mode():
    for mode in ("hbm", "offload", "dram_centric"):
        result = engine(f"kv.mode={mode}", "workload.shared_prefix_tokens=256").run()
        assert result.summary["requests_finished"] == 20


def test_checks_are_off_unless_asked():
    config = make_config()
    assert config.engine.check is False
    eng = Simulation(config, build_requests(config.workload, config.seed))
    assert "run" not in vars(eng) and "record" not in vars(eng.timeline)


def test_cli_check_flag_reports_a_violation_with_exit_3(tmp_path, capsys, monkeypatch):
    release = KvManager.release

    def leaky_release(self, rid):
        if self.blocks[rid]:
            self.table.ref[self.blocks[rid][0]] += 1  # one reference never given back
        release(self, rid)

    monkeypatch.setattr(KvManager, "release", leaky_release)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(BASE))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 0  # unchecked: nobody notices
    one_by_one = ["--set", "engine.decode_runs=false"]  # the leak is seen at its very step
    assert main(["run", str(path), "--out", str(out), "--force", "--check", *one_by_one]) == 3
    err = capsys.readouterr().err
    assert err.startswith("kvsim: internal error (please report it): invariant violated after")
    assert "block reference counts do not match their owners" in err


def test_a_corruption_inside_a_run_of_steps_is_caught_where_the_run_ends(monkeypatch):
    """With runs (steps taken ahead of the clock, written at once), the checks see the state
    each run leaves: a leaked reference is caught at the end of the run it happened in."""
    release = KvManager.release
    leaks: list[int] = []

    def leaky_release(self, rid):
        if self.blocks[rid] and not leaks and self.clock.planned_s is not None:  # in a run
            leaks.append(rid)
            self.table.ref[self.blocks[rid][0]] += 1  # one reference never given back
        release(self, rid)

    monkeypatch.setattr(KvManager, "release", leaky_release)
    eng = engine()
    with pytest.raises(InvariantViolation) as info:
        eng.run()
    assert leaks and eng.decode_runs.steps > 0
    assert STEP.match(str(info.value))


def test_sweep_check_fails_the_broken_points_and_keeps_their_ids(tmp_path, capsys, monkeypatch):
    release = KvManager.release

    def leaky_release(self, rid):
        if self.blocks[rid]:
            self.table.ref[self.blocks[rid][0]] += 1
        release(self, rid)

    monkeypatch.setattr(KvManager, "release", leaky_release)
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": "base.yaml", "grid": {"kv.mode": ["hbm", "offload"]}}))
    args = ["sweep", str(sweep), "--workers", "1", "--quiet", "--out"]
    assert main([*args, str(tmp_path / "plain")]) == 0
    assert main([*args, str(tmp_path / "checked"), "--check"]) == 1
    plain, checked = store.load(tmp_path / "plain"), store.load(tmp_path / "checked")
    assert plain.point_id.tolist() == checked.point_id.tolist()
    assert (checked.status == "failed").all()
    assert checked.error.str.contains("invariant violated after step").all()
