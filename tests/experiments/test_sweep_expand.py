"""Sweep files: grid and zip expansion, stable ids, and every invalid point in one error."""

import os
import subprocess
import sys

import pytest

from experiments.sweep import expand, load_sweep, point_id
from sim.cli import main
from sim.config.loader import build_config
from sim.errors import ConfigError
from tests.conftest import REPO
from tests.experiments.sweep_helpers import FAST_BASE, small_sweep, write_sweep


def test_grid_is_the_cartesian_product_in_key_order_with_seeds_innermost(tmp_path):
    sweep = {
        "base": FAST_BASE,
        "grid": {"kv.mode": ["hbm", "dram_centric"], "hardware": ["h100-sxm", "h200-sxm", "gh200"]},
        "seeds": [0, 1],
    }
    points = load_sweep(write_sweep(tmp_path, sweep)).points
    assert len(points) == 2 * 3 * 2
    assert [(p.params["kv.mode"], p.params["hardware"], p.seed) for p in points[:4]] == [
        ("hbm", "h100-sxm", 0),
        ("hbm", "h100-sxm", 1),
        ("hbm", "h200-sxm", 0),
        ("hbm", "h200-sxm", 1),
    ]
    for p in points:
        assert p.config.kv.mode == p.params["kv.mode"]
        assert p.config.hardware.name == p.params["hardware"]
        assert p.config.seed == p.seed
    assert [p.index for p in points] == list(range(12))


def test_zip_varies_lists_together_and_crosses_the_grid(tmp_path):
    sweep = {
        "base": FAST_BASE,
        "grid": {"kv.mode": ["hbm", "offload"]},
        "zip": {"workload.num_requests": [1, 2, 4], "workload.prompt_tokens": [512, 1024, 2048]},
    }
    s = load_sweep(write_sweep(tmp_path, sweep))
    assert s.axes == ("kv.mode", "workload.num_requests", "workload.prompt_tokens")
    pairs = [
        (p.params["workload.num_requests"], p.params["workload.prompt_tokens"]) for p in s.points
    ]
    assert pairs == [(1, 512), (2, 1024), (4, 2048)] * 2
    for p in s.points:
        assert p.config.workload.num_requests == p.params["workload.num_requests"]
        assert p.config.workload.prompt_tokens.value == p.params["workload.prompt_tokens"]


def test_zip_groups_cross_each_other_and_set_exclude_apply(tmp_path):
    sweep = {
        "base": FAST_BASE,
        "set": {"engine.block_tokens": 32},
        "zip": [
            {"kv.mode": ["hbm", "dram_centric"], "kv.access": ["full", {"kind": "sparse"}]},
            {"workload.num_requests": [1, 2], "engine.max_num_seqs": [8, 16]},
        ],
        "exclude": [{"kv.mode": "hbm", "workload.num_requests": 2}],
    }
    points = load_sweep(write_sweep(tmp_path, sweep)).points
    combos = [(p.params["kv.mode"], p.params["workload.num_requests"]) for p in points]
    assert combos == [("hbm", 1), ("dram_centric", 1), ("dram_centric", 2)]
    assert all(p.config.engine.block_tokens == 32 for p in points)
    assert points[2].config.engine.max_num_seqs == 16
    assert points[1].config.kv.access.kind == "sparse"


def test_zip_lists_of_different_lengths_are_refused(tmp_path):
    sweep = {"base": FAST_BASE, "zip": {"kv.mode": ["hbm", "offload"], "seed_x": [1]}}
    with pytest.raises(ConfigError, match=r"key 'zip'.*one length.*kv.mode: 2, seed_x: 1"):
        load_sweep(write_sweep(tmp_path, sweep))


def test_base_path_is_relative_to_the_sweep_file(tmp_path):
    path = small_sweep(tmp_path / "study")
    points = load_sweep(path).points
    assert len(points) == 2 * 2 * 2
    assert points[0].base_dir == tmp_path / "study"


@pytest.mark.parametrize(
    "sweep, match",
    [
        ({"grid": {"kv.mode": ["hbm"]}}, "missing 'base'"),
        ({"base": {}, "grids": {}}, "unknown key 'grids'"),
        ({"base": {}, "grid": {"seed": [0, 1]}}, "seeds:"),
        ({"base": {}, "grid": {"kv.mode": "hbm"}}, "key 'grid.kv.mode': expected a non-empty list"),
        ({"base": {}, "seeds": [0, 0]}, "key 'seeds'"),
        ({"base": {}, "grid": {"kv.mode": ["hbm"]}, "zip": {"kv.mode": ["hbm"]}}, "twice"),
        ({"base": {}, "grid": {"kv.mode": ["hbm"]}, "exclude": [{"hardware": "x"}]}, "not an axis"),
        ({"base": "missing.yaml"}, "cannot read file"),
    ],
)
def test_malformed_sweep_files_name_the_key(tmp_path, sweep, match):
    with pytest.raises(ConfigError, match=match):
        load_sweep(write_sweep(tmp_path, sweep))


def test_ids_are_hashes_of_the_resolved_config(tmp_path):
    named = {**FAST_BASE, "hardware": "h100-sxm"}  # a profile's name, no overrides beside it
    a = load_sweep(write_sweep(tmp_path, {"base": named, "grid": {"hardware": ["h200-sxm"]}}))
    b = load_sweep(
        write_sweep(tmp_path, {"base": named, "grid": {"hardware.profile": ["h200-sxm"]}}, "b.yaml")
    )
    plain = build_config({**FAST_BASE, "hardware": "h200-sxm"})
    assert a.points[0].point_id == b.points[0].point_id == point_id(plain)
    assert len(a.points[0].point_id) == 12
    seeds = load_sweep(write_sweep(tmp_path, {"base": FAST_BASE, "seeds": [0, 1]}, "s.yaml"))
    assert len({p.point_id for p in seeds.points}) == 2


def test_ids_are_the_same_in_another_process(tmp_path):
    path = small_sweep(tmp_path)
    here = [p.point_id for p in load_sweep(path).points]
    code = "import sys; from experiments.sweep import load_sweep; "
    code += "print(' '.join(p.point_id for p in load_sweep(sys.argv[1]).points))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    there = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
        cwd=REPO, check=True,
    ).stdout.split()  # fmt: skip
    assert there == here


def test_every_invalid_point_is_reported_in_one_error_before_anything_runs(tmp_path, capsys):
    sweep = {
        "base": FAST_BASE,
        "grid": {
            "kv.mode": ["hbm", "tiered", "dram_centric"],
            "engine.max_num_seqs": [8, 0],
            "model": ["llama-3-8b", "llama-3-70b"],
        },
    }
    path = write_sweep(tmp_path, sweep)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvsim: error: {path}: 10 of 12 points are invalid; nothing was run")
    assert "unknown KV mode 'tiered'" in err and "(4 points)" in err
    assert "key 'engine.max_num_seqs'" in err
    assert "model 'llama-3-70b' does not fit" in err
    assert "#2 kv.mode=hbm, engine.max_num_seqs=0, model=llama-3-8b, seed=0" in err
    assert not out.exists()


def test_points_that_resolve_to_one_config_are_reported(tmp_path):
    sweep = {"base": FAST_BASE, "grid": {"hardware": ["h100-sxm", {"profile": "h100-sxm"}]}}
    with pytest.raises(ConfigError, match=r"resolves to the same config as #0"):
        load_sweep(write_sweep(tmp_path, sweep))


def test_expand_takes_a_parsed_mapping(tmp_path):
    sweep = expand(
        {"base": FAST_BASE, "grid": {"kv.mode": ["hbm", "offload"]}}, tmp_path / "x.yaml"
    )
    assert [p.params for p in sweep.points] == [{"kv.mode": "hbm"}, {"kv.mode": "offload"}]
    assert sweep.points[0].label == "kv.mode=hbm, seed=0"
