"""Bundled profiles load, and derived sizes match hand-computed figures."""

import pytest

from sim.config.loader import load_hardware, load_model, profile_names
from sim.config.parallel import shard_model

HARDWARE = [
    "a100-80g-sxm",
    "h100-sxm",
    "h100-pcie",
    "h200-sxm",
    "gh200",
    "l40s",
    "rtx3090",
    "a40",
    "mi300x",
    "cpu-host",
]
MODELS = [
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3.1-8b",
    "llama-3-70b",
    "mistral-7b",
    "mistral-7b-v0.2",
    "qwen2.5-7b",
    "qwen2.5-72b",
    "qwen3-8b",
    "qwen3-14b",
    "qwen3-235b-a22b",
    "qwen3-30b-a3b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "dbrx",
    "devstral-2-123b",
    "deepseek-v3",
    "moonlight-16b-a3b",
]


def test_every_required_profile_is_bundled():
    assert set(HARDWARE) <= set(profile_names("hardware"))
    assert set(MODELS) <= set(profile_names("model"))


@pytest.mark.parametrize("name", HARDWARE)
def test_hardware_profiles_validate(name):
    hw = load_hardware(name)
    assert hw.name == name
    assert hw.hbm.capacity > hw.hbm.runtime_reserve > 0
    assert 0 < hw.efficiency.gemm <= 1


# KV bytes per token = 2 x layers x kv_heads x head_dim x 2 (bf16); MLA: layers x 576 x 2
@pytest.mark.parametrize(
    ("name", "kv_bytes"),
    [
        ("llama-3-8b", 2 * 32 * 8 * 128 * 2),  # 131,072
        ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2),
        ("mistral-7b-v0.2", 2 * 32 * 8 * 128 * 2),
        ("llama-2-7b", 2 * 32 * 32 * 128 * 2),  # 524,288
        ("llama-2-13b", 2 * 40 * 40 * 128 * 2),
        ("llama-2-70b", 2 * 80 * 8 * 128 * 2),
        ("qwen2.5-7b", 2 * 28 * 4 * 128 * 2),
        ("qwen3-8b", 2 * 36 * 8 * 128 * 2),  # 147,456 (QK-norm leaves KV alone)
        ("qwen3-14b", 2 * 40 * 8 * 128 * 2),  # 163,840
        ("qwen3-235b-a22b", 2 * 94 * 4 * 128 * 2),  # 192,512
        ("qwen3-30b-a3b", 2 * 48 * 4 * 128 * 2),  # 98,304
        ("devstral-2-123b", 2 * 88 * 8 * 128 * 2),  # 360,448: bf16 KV under fp8 weights
        ("mixtral-8x7b", 2 * 32 * 8 * 128 * 2),
        ("mixtral-8x22b", 2 * 56 * 8 * 128 * 2),  # 229,376
        ("dbrx", 2 * 40 * 8 * 128 * 2),  # 163,840
        ("deepseek-v3", 61 * (512 + 64) * 2),  # 70,272
        ("moonlight-16b-a3b", 27 * (512 + 64) * 2),  # 31,104
    ],
)
def test_kv_bytes_per_token(name, kv_bytes):
    assert load_model(name).kv_bytes_per_token() == kv_bytes


def test_llama3_8b_kv_per_token_is_128kib():
    assert load_model("llama-3-8b").kv_bytes_per_token() == 131_072
    assert load_model("llama-3-8b").kv_bytes_per_token(1.0) == 65_536  # fp8 KV


@pytest.mark.parametrize(
    ("name", "total", "active"),
    [  # model cards / hardware-figures.md section 4
        ("llama-2-7b", 6.74e9, 6.74e9),
        ("llama-3-8b", 8.03e9, 8.03e9),
        ("llama-3.1-8b", 8.03e9, 8.03e9),
        ("mistral-7b-v0.2", 7.24e9, 7.24e9),
        ("qwen3-8b", 8.2e9, 8.2e9),  # model card "Number of Parameters: 8.2B"
        ("llama-3-70b", 70.55e9, 70.55e9),
        ("mixtral-8x7b", 46.70e9, 12.88e9),
        ("qwen3-30b-a3b", 30.5e9, 3.35e9),  # card: 30.5B total, "3.3B" activated (shapes: 3.35B)
        ("deepseek-v3", 671.0e9, 37.6e9),
        ("mixtral-8x22b", 141e9, 39e9),  # 141B total, 39B active (shapes: 140.6B, 39.2B)
        ("dbrx", 132e9, 36.5e9),  # 132B total, "36B" live (shapes: 131.6B, 36.47B)
    ],
)
def test_parameter_counts(name, total, active):
    model = load_model(name)
    assert model.total_params == pytest.approx(total, rel=0.01)
    assert model.active_params == pytest.approx(active, rel=0.01)


def test_qwen3_8b_and_devstral_2_parameters_by_hand():
    # config.json shapes: per layer QKV h x (q + 2 kv), O q x h, gate/up h x 2i, down i x h;
    # untied embedding and LM head v x h; RMSNorm 2 a layer + 1 (Qwen3's QK-norm not counted)
    def by_hand(layers, h, q, kv, i, v):
        per_layer = h * (q + 2 * kv) + q * h + h * 2 * i + i * h
        return layers * per_layer + 2 * v * h + (2 * layers + 1) * h

    qwen3 = by_hand(36, 4096, 32 * 128, 8 * 128, 12288, 151936)
    qwen3_14b = by_hand(40, 5120, 40 * 128, 8 * 128, 17408, 151936)
    devstral = by_hand(88, 12288, 96 * 128, 8 * 128, 28672, 131072)
    assert qwen3 == 8_190_726_144  # model card 8.2B; 6.95B without the 1.24B of embeddings
    assert devstral == 125_025_988_608  # the card's "123": Mistral Large 2's 32768-token vocab
    assert load_model("qwen3-8b").total_params == qwen3
    assert qwen3_14b == 14_768_296_960  # 13.21B without the 1.56B of untied embeddings
    assert load_model("qwen3-14b").total_params == qwen3_14b
    assert load_model("devstral-2-123b").total_params == devstral


def test_mixtral_8x22b_and_dbrx_parameters_by_hand():
    # config.json shapes: per layer QKV h x (q + 2 kv), O q x h, E experts of gate/up h x 2i and
    # down i x h, router h x E; untied embedding and LM head v x h; 2 norms a layer + 1
    def by_hand(layers, h, q, kv, i, experts, top_k, v):
        attention = h * (q + 2 * kv) + q * h
        expert = h * 2 * i + i * h
        shared = layers * (attention + h * experts + 2 * h) + 2 * v * h + h
        return shared + layers * experts * expert, shared + layers * top_k * expert

    mixtral = by_hand(56, 6144, 48 * 128, 8 * 128, 16384, 8, 2, 32000)
    dbrx = by_hand(40, 6144, 48 * 128, 8 * 128, 10752, 16, 4, 100352)
    assert mixtral == (140_620_634_112, 39_152_031_744)  # Mistral AI: 141B, 39B active
    assert dbrx == (131_596_523_520, 36_469_708_800)  # Databricks: 132B, 36B live
    for name, (total, active) in (("mixtral-8x22b", mixtral), ("dbrx", dbrx)):
        assert (load_model(name).total_params, load_model(name).active_params) == (total, active)


def test_devstral_2_kv_per_gpu_at_tp_8_is_the_logged_0_0967_gib():
    # LMCache recipe (8 x H200, TP 8): 0.0967 GiB of KV per GPU for 2,304 tokens; one of the
    # 8 KV heads per GPU: 88 layers x 2 x 1 x 128 x 2 B = 45,056 B a token
    m = load_model("devstral-2-123b")
    assert m.dtype == "fp8" and m.kv_bytes_per_token() == 8 * 45_056
    logged_gib = pytest.approx(0.0967, abs=5e-5)
    per_gpu = 2304 * 45_056
    assert per_gpu / 2**30 == logged_gib
    assert shard_model(m, 8).kv_bytes_per_token() * 2304 == per_gpu


def test_llama3_8b_flops_per_token_by_hand():
    # per layer: QKV 4096x6144 + O 4096x4096 + gate/up 4096x28672 + down 14336x4096; LM head
    m = load_model("llama-3-8b")
    per_layer = 4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096
    macs = 32 * per_layer + 4096 * 128256
    assert m.linear_flops_per_token == 2 * macs


def test_llama_3_1_and_mistral_v0_2_differ_from_their_predecessors_only_in_context():
    # config.json: Llama-3.1 max_position_embeddings 131072 (Llama-3 8192); Mistral v0.2
    # "sliding_window": null (v0.1 4096), 32768 positions
    for new, old in (("llama-3.1-8b", "llama-3-8b"), ("mistral-7b-v0.2", "mistral-7b")):
        a, b = load_model(new), load_model(old)
        assert a.linear_flops_per_token == b.linear_flops_per_token
    assert load_model("llama-3.1-8b").context_length == 131072
    v02 = load_model("mistral-7b-v0.2")
    assert v02.sliding_window is None and v02.context_length == 32768


def test_a40_torch_visible_total_is_the_oom_messages():
    # nvidia-smi 46068MiB less the driver's part: torch's "total capacity of 44.34 GiB"
    hw = load_hardware("a40")
    assert (hw.hbm.capacity - hw.hbm.driver_reserve) / 2**30 == pytest.approx(44.34, abs=0.005)


def test_mla_without_a_query_lora_projects_queries_straight():
    """Moonlight (q_lora_rank null): one hidden -> heads x (128 + 64) query GEMM, no LoRA pair."""
    gemms = load_model("moonlight-16b-a3b").attention_gemms
    assert gemms == ((2048, 16 * 192), (2048, 512 + 64), (512, 16 * 256), (16 * 128, 2048))
    assert len(load_model("deepseek-v3").attention_gemms) == 5
