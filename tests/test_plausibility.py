"""Plausible ranges of physical values: a number without its unit (or with the wrong prefix)
is one error naming the key, the value as read and the likely intended unit; everything
bundled still loads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.sweep import load_sweep
from sim.cli import main
from sim.config import build_config, load_config, load_hardware
from sim.config.base import PLAUSIBLE
from sim.config.loader import profile_names
from sim.errors import ConfigError
from tests.conftest import BASE, REPO, make_config

QUICKSTART = REPO / "experiments" / "configs" / "quickstart.yaml"
EXPERIMENTS = sorted((REPO / "experiments" / "configs").glob("*.yaml"))

# (override, fragments of the one message): the key, the value as read in its unit, and the
# unit a person meant (worked out by hand from the hardware-figures reference)
IMPLAUSIBLE = [
    ("hardware.link.h2d=64", ["key 'hardware.link.h2d'", "read as 64 B/s", "64GB/s"]),
    ("hardware.link.d2h=25000", ["key 'hardware.link.d2h'", "25 kB/s", "25000MB/s"]),
    ("hardware.link.h2d=1PB/s", ["'1PB/s'", "1 PB/s", "host link bandwidth", "10 TB/s"]),
    ("kv.dram_capacity=512", ["key 'kv.dram_capacity'", "read as 512 B", "512GiB"]),
    ("kv.ssd_capacity=2", ["key 'kv.ssd_capacity'", "read as 2 B", "2TiB"]),
    ("hardware.hbm.capacity=80", ["key 'hardware.hbm.capacity'", "read as 80 B", "80GiB"]),
    ("hardware.hbm.capacity=80TiB", ["'80TiB'", "device memory capacity", "80GiB"]),
    ("hardware.hbm.bandwidth=3.35", ["key 'hardware.hbm.bandwidth'", "3.35 B/s", "3.35TB/s"]),
    ("hardware.hbm.runtime_reserve=2", ["key 'hardware.hbm.runtime_reserve'", "2GiB"]),
    ("hardware.dram.capacity=256", ["key 'hardware.dram.capacity'", "256 B", "256GiB"]),
    ("hardware.dram.bandwidth=307", ["key 'hardware.dram.bandwidth'", "307GB/s"]),
    ("hardware.ssd.capacity=4", ["key 'hardware.ssd.capacity'", "4TiB"]),
    ("hardware.ssd.read=7", ["key 'hardware.ssd.read'", "7 B/s", "7GB/s"]),
    ("hardware.link.latency=5", ["key 'hardware.link.latency'", "read as 5 s", "5us"]),
    ("hardware.ssd.latency=80", ["key 'hardware.ssd.latency'", "80 s", "80us"]),
    ("hardware.efficiency.step_overhead=3", ["step_overhead'", "3 s", "3ms"]),
    ("hardware.efficiency.layer_overhead=20", ["layer_overhead'", "20 s", "20us"]),
    ("hardware.efficiency.kernels.norm.latency=4", ["kernels.norm.latency'", "4us"]),
    ("hardware.compute.bf16_flops=989", ["key 'hardware.compute.bf16_flops'", "989TFLOP/s"]),
]


@pytest.mark.parametrize(("override", "fragments"), IMPLAUSIBLE)
def test_an_implausible_value_names_key_value_and_intended_unit(override, fragments):
    with pytest.raises(ConfigError) as info:
        make_config(override)
    message = str(info.value)
    assert message.count("key '") == 1, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message}"


def test_bare_link_bandwidth_on_the_quickstart_exits_2_naming_the_key(tmp_path, capsys):
    out = tmp_path / "run"
    status = main(["run", str(QUICKSTART), "--set", "hardware.link.h2d=64", "--out", str(out)])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("kvsim: error:") == 1 and err.count("\n") == 1, err
    assert "key 'hardware.link.h2d'" in err and "64 B/s" in err and "64GB/s" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "override",
    [
        "kv.ssd_capacity=0",  # no SSD tier
        "kv.dram_capacity=0",
        "hardware.ssd.capacity=0B",
        "hardware.dram.capacity=0",
        "hardware.hbm.runtime_reserve=0",
        "hardware.link.latency=0",
        "hardware.link.half_efficiency_bytes=0",
        "hardware.efficiency.step_overhead=0us",
    ],
)
def test_zero_where_a_key_means_none_stays_allowed(override):
    key, _ = override.split("=")
    section, *path = key.split(".")
    node = getattr(make_config(override), section)
    for name in path:
        node = getattr(node, name)
    assert node == 0


@pytest.mark.parametrize(
    ("override", "value"),
    [
        ("hardware.link.h2d=55e9", 55e9),  # a bare number in range is SI, as before
        ("hardware.link.h2d=1.8GB/s", 1.8e9),  # a software path far below the link
        ("hardware.link.h2d=900GB/s", 900e9),  # NVLink 5, one direction
        ("hardware.hbm.capacity=1TB", 1e12),  # HBM4-era packages
        ("hardware.hbm.bandwidth=20TB/s", 20e12),
        ("kv.dram_capacity=256KiB", 256 * 2**10),  # a DRAM tier of a few tiny blocks (tests)
        ("hardware.hbm.capacity=24MiB", 24 * 2**20),  # a tiny model's scaled-down HBM (fuzz)
        ("hardware.ssd.latency=10ms", 10e-3),  # a disk
        ("hardware.compute.bf16_flops=98GFLOP/s", 98e9),  # one CPU thread
    ],
)
def test_foreseeable_hardware_loads(override, value):
    key, _ = override.split("=")
    section, *path = key.split(".")
    node = getattr(make_config(override), section)
    for name in path:
        node = getattr(node, name)
    assert node == pytest.approx(value)


@pytest.mark.parametrize("name", profile_names("hardware"))
def test_every_bundled_hardware_profile_loads(name):
    assert load_hardware(name).name == name.rsplit("/", 1)[-1]


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_every_bundled_experiment_config_loads(path):
    raw = yaml.safe_load(path.read_text())
    if "base" in raw:
        assert load_sweep(path).points  # every point validated (load_sweep raises otherwise)
    else:
        assert load_config(path).hardware.hbm.capacity > 0


def _run_configs() -> list[tuple[str, dict]]:
    """Every bundled experiment as a raw run config (a sweep's base)."""
    found = []
    for path in EXPERIMENTS:
        raw = yaml.safe_load(path.read_text())
        base = raw.get("base", raw)
        if isinstance(base, str):  # a sweep over a run config beside it
            base = yaml.safe_load((path.parent / base).read_text())
        found.append((path.name, base))
    return found


@settings(max_examples=40, deadline=None)
@given(
    experiment=st.sampled_from(_run_configs()),
    profile=st.sampled_from(profile_names("hardware")),
)
def test_every_experiment_loads_on_every_bundled_profile(experiment, profile):
    name, raw = experiment
    tp = raw.get("engine", {}).get("tensor_parallel_size", 1)
    hw = load_hardware(profile)
    if tp > 1 and (hw.interconnect is None or hw.gpus_per_node < tp):
        # a tensor-parallel study needs a profile with an interconnect: refused, clearly
        with pytest.raises(ConfigError, match=f"tensor_parallel_size {tp}"):
            build_config({**raw, "hardware": profile}, name)
        return
    config = build_config({**raw, "hardware": profile}, name)
    assert config.hardware.name == profile.rsplit("/", 1)[-1]


# key -> kind, as docs/config.md's table of plausible ranges lists them
KEYS = {
    "hardware.hbm.capacity": "device memory capacity",
    "hardware.hbm.bandwidth": "device memory bandwidth",
    "hardware.dram.bandwidth": "host memory bandwidth",
    "hardware.link.h2d": "host link bandwidth",
    "hardware.ssd.write": "storage bandwidth",
    "hardware.link.latency": "transfer latency",
    "hardware.efficiency.gemm_latency": "kernel latency",
    "hardware.compute.fp8_flops": "compute rate",
    "kv.dram_capacity": "DRAM budget for KV",
}


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(KEYS)), fraction=st.floats(0.0, 1.0))
def test_a_value_inside_its_kinds_range_loads_unchanged(key, fraction):
    spec = PLAUSIBLE[KEYS[key]]
    low = max(spec.low, spec.high * 1e-12)  # log-uniform over the range (0 has no log)
    value = low * (spec.high / low) ** fraction
    value = min(max(value, low), spec.high)
    config = make_config(f"{key}={value!r}")
    node = config
    for name in key.split("."):
        node = getattr(node, name)
    assert node == value


@settings(max_examples=60, deadline=None)
@given(
    key=st.sampled_from(sorted(KEYS)),
    above=st.booleans(),
    factor=st.floats(1.001, 1e6),
)
def test_a_value_outside_its_kinds_range_is_refused_with_a_suggestion_in_range(key, above, factor):
    spec = PLAUSIBLE[KEYS[key]]
    if not above and spec.low == 0:
        above = True  # every small value of this kind is plausible
    value = spec.high * factor if above else spec.low / factor
    with pytest.raises(ConfigError) as info:
        make_config(f"{key}={value!r}")
    message = str(info.value)
    assert f"key '{key}'" in message and spec.kind in message
    if "did you mean " in message:  # the guess keeps the number (as shown) and lands in range
        guess = message.split("did you mean ")[1].rstrip("?")
        number, unit = spec.dimension.written(guess)
        assert math.isclose(number, float(f"{value:g}"), rel_tol=1e-9)
        assert unit and spec.low * (1 - 1e-5) <= spec.dimension.parse(guess) <= spec.high * (
            1 + 1e-5
        )


def test_every_key_of_a_kind_is_listed_in_the_docs():
    text = (REPO / "docs" / "config.md").read_text()
    table = text.split('<a id="plausible-ranges"></a>')[1]
    for key, kind in KEYS.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| {kind} |"))
        assert f"`{key}`" in row, (key, row)


def test_a_config_file_value_is_checked_as_a_set_one_is(tmp_path):
    data = {**BASE, "hardware": {"profile": "h100-sxm", "link": {"h2d": 64, "d2h": "55GB/s"}}}
    path = Path(tmp_path / "bare.yaml")
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: key 'hardware.link.h2d': got 64, read as 64 B/s")
