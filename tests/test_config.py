"""Config loading: profiles, overrides, defaults, and one clear message per mistake."""

import pytest
import yaml

from sim.config import build_config, dump_config, load_config, load_hardware
from sim.errors import ConfigError
from tests.conftest import BASE, make_config


def test_profile_names_resolve_and_defaults_fill_in():
    cfg = make_config()
    assert cfg.model.layers == 32
    assert cfg.hardware.hbm.bandwidth == 3.35e12
    assert cfg.engine.block_tokens == 16
    assert cfg.engine.chunked_prefill is True
    assert cfg.kv.mode == "hbm"


def test_profile_plus_overrides_merge():
    cfg = make_config(hardware={"profile": "h100-sxm", "hbm": {"capacity": "40GiB"}})
    assert cfg.hardware.hbm.capacity == 40 * 2**30
    assert cfg.hardware.hbm.bandwidth == 3.35e12  # untouched keys come from the profile


def test_set_overrides_reach_profile_keys():
    cfg = make_config(
        "engine.max_num_seqs=64", "hardware.hbm.capacity=40GiB", "hardware.link.h2d=25GB/s"
    )
    assert cfg.engine.max_num_seqs == 64
    assert cfg.hardware.hbm.capacity == 40 * 2**30
    assert cfg.hardware.link.h2d == 25e9


def test_inline_model_mapping():
    model = {
        "name": "tiny",
        "layers": 2,
        "hidden": 256,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 64,
        "intermediate": 512,
        "vocab": 1000,
    }
    cfg = make_config(model=model)
    assert cfg.model.kv_bytes_per_token() == 2 * 2 * 2 * 64 * 2


def test_resolved_config_round_trips():
    cfg = make_config("engine.max_num_seqs=7")
    again = build_config(yaml.safe_load(dump_config(cfg)), "<dump>")
    assert again == cfg


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["engine.max_num_seq=64"], ["key 'engine.max_num_seq'", "did you mean 'max_num_seqs'"]),
        (
            ["hardware.hbm.capacity=3TB/s"],
            ["hardware.hbm.capacity", "'TB/s' is a bandwidth", "3TB/s"],
        ),
        (["hardware.hbm.capacity=-80GiB"], ["hardware.hbm.capacity", "greater than 0"]),
        (
            ["hardware.link.latency=fast"],
            ["hardware.link.latency", "expected a duration", "'fast'"],
        ),
        (
            ["kv.mode=dram_centrik"],
            ["kv.mode", "the modes that exist: hbm, offload, dram_centric", "dram_centrik"],
        ),
        (["workload.arrival.kind=poison"], ["workload.arrival", "poison"]),
        (
            ["workload.prompt_tokens={kind: uniform, min: 5}"],
            ["workload.prompt_tokens.max", "missing"],
        ),
        (
            ["workload.prompt_tokens.kind=uniform"],
            ["workload.prompt_tokens", "cannot set a key inside 512"],
        ),
        (["engine.gpu_memory_utilization=1.5"], ["engine.gpu_memory_utilization", "1.5"]),
        (["model=llama-3-9b"], ["unknown model profile 'llama-3-9b'", "did you mean 'llama-3-8b'"]),
        (["workload.num_request=5"], ["workload.num_request", "did you mean 'num_requests'"]),
        (
            ["hardware.link.copy_layout=pages"],
            ["hardware.link.copy_layout", "'auto', 'block', 'layer' or 'layer_kv'", "pages"],
        ),
        (["hardware.link.chunk_blend=0.5"], ["hardware.link.chunk_blend", "0.5"]),
        (
            ["hardware.link.load_overhead=5s"],
            ["hardware.link.load_overhead", "load overhead", "5s"],
        ),
    ],
)
def test_bad_values_name_key_value_and_expectation(overrides, fragments):
    with pytest.raises(ConfigError) as info:
        make_config(*overrides)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("seed: 0\nmodel: llama-3-8b\nengine: {max_num_seqs: 4\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:\d+: invalid YAML"):
        load_config(path)


def test_errors_name_the_file(tmp_path):
    path = tmp_path / "typo.yaml"
    data = {**BASE, "engine": {"max_num_seqz": 4}}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"typo.yaml: key 'engine.max_num_seqz': unknown key"):
        load_config(path)


def test_declared_params_catch_a_wrong_shape():
    with pytest.raises(ConfigError, match=r"the shapes give .* but params says"):
        make_config(model={"profile": "llama-3-8b", "layers": 64})


def test_set_without_equals_is_refused():
    with pytest.raises(ConfigError, match="--set expects KEY=VALUE"):
        make_config("engine.max_num_seqs")


@pytest.mark.parametrize(
    ("model", "layout", "chunk"),
    [
        # Llama-3-8B: 16 tokens x 8 KV heads x 128 x 2 B = 32 KiB per layer and K|V
        ("llama-3-8b", "layer_kv", 32 * 1024),
        ("llama-3-8b", "layer", 64 * 1024),
        ("llama-3-8b", "block", 32 * 2 * 32 * 1024),  # 32 layers x K,V: 2 MiB
        # DeepSeek-V3 (MLA): one 576-element latent per token and layer, no K/V split
        ("deepseek-v3", "layer_kv", 16 * 576 * 2),
        ("deepseek-v3", "layer", 16 * 576 * 2),
    ],
)
def test_copy_chunks_follow_the_layout_and_the_kv_geometry(model, layout, chunk):
    config = make_config(f"model={model}", f"hardware.link.copy_layout={layout}")
    assert config.copy_chunk_bytes() == chunk


@pytest.mark.parametrize(
    ("mode", "layout", "chunk"),
    [
        ("offload", "block", 32 * 2 * 32 * 1024),  # vLLM's cross-layer blocks: 2 MiB
        ("hbm", "layer_kv", 32 * 1024),  # FlashAttention's paged layout: 32 KiB
        ("dram_centric", "layer_kv", 32 * 1024),
    ],
)
def test_the_auto_layout_is_vllms_for_the_kv_mode(mode, layout, chunk):
    """Llama-3-8B on the profiles' ``auto``: vLLM's offloading connector asks for cross-layer
    blocks (one chunk a block); without a connector each layer's K and V are tensors of
    their own."""
    config = make_config("hardware.link.copy_layout=auto", kv={"mode": mode})
    assert config.hardware.link.copy_layout == "auto"
    assert (config.copy_layout(), config.copy_chunk_bytes()) == (layout, chunk)
    assert load_hardware("h100-sxm").link.copy_layout == "auto"
