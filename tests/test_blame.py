"""Every message blames the key the user wrote: a run that can schedule no request names the
limit the shortest request hits (the DRAM capacity in dram_centric, the KV pool's key in
hbm/offload, engine.max_model_len, engine.max_batched_tokens without chunked prefill); a model
that does not fit names the key that leaves no room; section validators name their key.

Llama-3-8B (bf16) holds 128 KiB of KV per token, so a 16-token block is 2 MiB; a request of
2048 + 8 tokens needs ceil(2055 / 16) = 129 blocks (its last token needs no KV): 258 MiB.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from sim.cli import main
from sim.config import build_config
from sim.config.loader import set_by_run
from sim.errors import ConfigError
from tests.conftest import BASE, make_config


def run_error(tmp_path, capsys, *overrides: str, **sections) -> str:
    """Run BASE (4 requests of 2048 + 8 tokens, with ``sections`` replaced) through the CLI;
    the one error message it prints."""
    data = copy.deepcopy(BASE)
    data["workload"].update(num_requests=4, prompt_tokens=2048, output_tokens=8)
    for name, value in sections.items():
        data[name] = value
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    args = ["run", str(path), "--out", str(tmp_path / "out")]
    for override in overrides:
        args += ["--set", override]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("kvsim: error:") == 1 and str(path) in err, err
    assert not (tmp_path / "out").exists()
    return err


def test_dram_centric_blames_kv_dram_capacity(tmp_path, capsys):
    err = run_error(tmp_path, capsys, "kv.dram_capacity=64MiB", kv={"mode": "dram_centric"})
    assert "key 'kv.dram_capacity'" in err and "key 'engine'" not in err
    assert "the shortest needs 2056 tokens (129 blocks of 16)" in err
    assert "kv.dram_capacity 64.00 MiB holds 32 blocks" in err
    assert "expected kv.dram_capacity of at least 258.00 MiB" in err


def test_dram_centric_blames_the_hardware_dram_without_a_kv_budget(tmp_path, capsys):
    err = run_error(tmp_path, capsys, "hardware.dram.capacity=64MiB", kv={"mode": "dram_centric"})
    assert "key 'hardware.dram.capacity'" in err
    assert "hardware.dram.capacity 64.00 MiB holds 32 blocks" in err


def test_a_pool_set_in_blocks_blames_kv_pool_blocks(tmp_path, capsys):
    err = run_error(tmp_path, capsys, "engine.kv_pool_blocks=8")
    assert "key 'engine.kv_pool_blocks'" in err
    assert "the KV pool holds 8 blocks: engine.kv_pool_blocks" in err
    assert "expected a KV pool of at least 129 blocks" in err


def test_a_small_hbm_blames_hardware_hbm_capacity(tmp_path, capsys):
    # 0.9 x 19.2 GiB = 17.28 GiB less 14.96 GiB of weights and 2 GiB reserve: ~0.3 GiB
    # (well under 129 blocks) less activations (BASE: no driver reserve)
    err = run_error(tmp_path, capsys, "hardware.hbm.capacity=19.2GiB", kv={"mode": "offload"})
    assert "key 'hardware.hbm.capacity'" in err
    assert "engine.gpu_memory_utilization 0.9 x torch-visible HBM 19.20 GiB" in err
    assert "(hardware.hbm.capacity 19.20 GiB - hardware.hbm.driver_reserve 0" in err
    assert "model weights 14.96 GiB - hardware.hbm.runtime_reserve 2.00 GiB" in err


def test_a_low_memory_utilization_blames_gpu_memory_utilization(tmp_path, capsys):
    # 0.25 x 79.65 GiB = 19.9 GiB less 16.96 GiB: under 3 GiB, below the 4 GiB (2049
    # blocks) that 32768 + 8 tokens need
    data = copy.deepcopy(BASE["workload"])
    data.update(num_requests=2, prompt_tokens=32768, output_tokens=8)
    err = run_error(tmp_path, capsys, "engine.gpu_memory_utilization=0.25", workload=data)
    assert "key 'engine.gpu_memory_utilization'" in err
    assert "expected a KV pool of at least 2049 blocks" in err


def test_requests_too_long_for_the_model_on_this_gpu_blame_the_model(tmp_path, capsys):
    # nothing overridden: ~54 GiB of KV pool (~440k tokens) cannot hold 600k tokens
    data = copy.deepcopy(BASE["workload"])
    data.update(num_requests=2, prompt_tokens=600_000, output_tokens=8)
    err = run_error(tmp_path, capsys, workload=data)
    assert "key 'model'" in err and "the KV pool holds" in err


def test_max_model_len_is_blamed_first_and_the_pool_too(tmp_path, capsys):
    err = run_error(tmp_path, capsys, "engine.max_model_len=1024", "engine.kv_pool_blocks=8")
    assert "key 'engine.max_model_len'" in err
    assert "engine.max_model_len is 1024; and the KV pool holds 8 blocks" in err
    assert "expected engine.max_model_len of at least 2056 and a KV pool of at least 129" in err


def test_without_chunked_prefill_max_batched_tokens_is_blamed(tmp_path, capsys):
    err = run_error(
        tmp_path, capsys, "engine.chunked_prefill=false", "engine.max_batched_tokens=1024"
    )
    assert "key 'engine.max_batched_tokens'" in err
    assert "one step holds engine.max_batched_tokens 1024" in err
    assert "engine.max_batched_tokens of at least 2056 or engine.chunked_prefill true" in err


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["hardware.hbm.capacity=16GiB"], "hardware.hbm.capacity"),  # 14.4 GiB < 16.96 GiB
        (["engine.gpu_memory_utilization=0.2"], "engine.gpu_memory_utilization"),
        (["model=llama-3-70b"], "model"),  # 131 GiB of weights on an 80 GiB GPU
    ],
)
def test_a_model_that_does_not_fit_blames_the_key_that_leaves_no_room(
    tmp_path, capsys, overrides, key
):
    err = run_error(tmp_path, capsys, *overrides)
    assert f"key '{key}'" in err and "does not fit on 'h100-sxm'" in err


def test_set_by_run_tells_written_keys_from_profile_and_defaults():
    plain = make_config()
    assert not set_by_run(plain, "hardware.hbm.capacity")
    assert not set_by_run(plain, "engine.gpu_memory_utilization")  # a default
    assert set_by_run(plain, "engine.max_batched_tokens")  # BASE writes it
    assert set_by_run(make_config("hardware.hbm.capacity=40GiB"), "hardware.hbm.capacity")
    same = make_config("hardware.hbm.capacity=81559MiB")  # the profile's own value
    assert not set_by_run(same, "hardware.hbm.capacity")
    inline = plain.hardware.model_dump(mode="json") | {"name": "my-gpu"}
    assert set_by_run(build_config({**BASE, "hardware": inline}), "hardware.hbm.capacity")
    assert set_by_run(
        make_config("engine.gpu_memory_utilization=0.9"), "engine.gpu_memory_utilization"
    )


@pytest.mark.parametrize(
    ("overrides", "sections", "key"),
    [
        (["kv.direct_read=true"], {}, "kv.direct_read"),  # needs dram_centric
        (["kv.prefetch=heat"], {}, "kv.prefetch"),  # needs dram_centric
        (["kv.prefetch=queue_lookahead"], {}, "kv.prefetch"),  # needs a tier below HBM
        (["kv.direct_read=true"], {"kv": {"mode": "dram_centric"}}, "kv.direct_read"),  # PCIe
        (
            [],
            {"kv": {"access": {"kind": "sparse", "topk_blocks": 8, "topk_fraction": 0.1}}},
            "kv.access.topk_fraction",
        ),
    ],
)
def test_section_checks_name_the_key_inside_the_section(overrides, sections, key):
    with pytest.raises(ConfigError) as info:
        make_config(*overrides, **sections)
    assert str(info.value).startswith(f"<test>: key '{key}': "), str(info.value)
    assert str(info.value).count("key '") == 1
