"""The memory plan against vLLM's own logged memory profiles, weights by tensor class, fp8
priced as fp8, and the refusals vLLM makes at start-up (docs/cost-model.md, the memory plan).

The logs quoted below are vLLM's; each test names its source and the settings the log ran with.
"""

from __future__ import annotations

import pytest

from sim.config import build_config
from sim.cost import cost_model_for
from sim.cost.roofline import CostModel, CostParams, gemm_seconds
from sim.errors import ConfigError
from sim.memory.hbm_plan import plan_hbm

GiB = 2.0**30


def config(model: str, hardware: str, *overrides: str, **engine):
    data = {
        "model": model,
        "hardware": hardware,
        "workload": {"kind": "synthetic", "num_requests": 1, "arrival": {"kind": "all_at_once"},
                     "prompt_tokens": 16, "output_tokens": 2},
        "engine": engine,
    }  # fmt: skip
    return build_config(data, "<test>", overrides)


def plan(model: str, hardware: str, *overrides: str, **engine):
    c = config(model, hardware, *overrides, **engine)
    return plan_hbm(c, cost_model_for(c))


# --- vLLM's logged profiles --------------------------------------------------------------


# vllm-project/vllm PR #10511 (youkaichao, 2024-12-14), `vllm serve meta-llama/Meta-Llama-3-8B`
# on an H100 80GB; vLLM 0.6.5 defaults: max_num_batched_tokens = max_model_len 8192,
# max_num_seqs 256, block size 16:
#   total_gpu_memory     79.22GiB
#   gpu_memory_utilization       0.90
#   the current vLLM instance can use    71.29GiB
#   model weights take   14.96GiB
#   non_torch_memory     1.79GiB
#   PyTorch activation peak memory       1.26GiB
#   available_kv_cache_memory    53.29GiB
# and with -tp 2: model weights take 7.48GiB; non_torch_memory 3.58GiB; activation peak 1.26GiB.
LLAMA3_8B_H100 = dict(max_num_seqs=256, max_batched_tokens=8192, block_tokens=16)


def test_llama_3_8b_on_an_h100_carves_hbm_as_vllm_logs_it():
    p = plan("llama-3-8b", "h100-sxm", **LLAMA3_8B_H100)
    assert p.capacity / GiB == pytest.approx(79.22, abs=0.005)
    assert p.usable / GiB == pytest.approx(71.29, abs=0.01)
    assert p.weights / GiB == pytest.approx(14.96, abs=0.005)
    assert p.activation_peak / GiB == pytest.approx(1.26, abs=0.005)
    # its non-torch memory, 1.79 GiB, was counted from before the CUDA context (PR #12126
    # counts 0.16 GiB, the profile's figure): the pool is the logged one plus the difference
    assert p.kv_room / GiB == pytest.approx(53.29 + 1.79 - 0.16, abs=0.02)


def test_with_the_logged_non_torch_memory_the_kv_pool_is_the_logged_one():
    p = plan("llama-3-8b", "h100-sxm", "hardware.hbm.runtime_reserve=1.79GiB", **LLAMA3_8B_H100)
    assert p.kv_room / GiB == pytest.approx(53.29, abs=0.02)
    assert p.pool_blocks == int(p.kv_room // (16 * 128 * 1024))  # 2 MiB blocks
    # -tp 2: half the weights, the same activation peak (the sampler's, over the whole vocab)
    two = plan("llama-3-8b", "h100-sxm", "hardware.hbm.runtime_reserve=3.58GiB",
               "hardware.hbm.runtime_reserve_tp=0", tensor_parallel_size=2,
               **LLAMA3_8B_H100)  # fmt: skip
    assert two.weights / GiB == pytest.approx(7.48, abs=0.005)
    assert two.activation_peak / GiB == pytest.approx(1.26, abs=0.005)
    assert two.kv_room / GiB == pytest.approx(71.29 - 7.48 - 3.58 - 1.26, abs=0.02)


# --- non-torch memory under tensor parallelism ---------------------------------------------
# vLLM V1 up to 0.10 takes its baseline snapshot before NCCL is set up, so the TP group's NCCL
# communicators and custom all-reduce buffers land in the profiled non-torch memory
# (hardware.hbm.runtime_reserve_tp, one step whatever the degree; docs/cost-model.md).
#
# vllm-project/vllm PR #21429 (yeqcharlotte, 2025-07-23), "Test Result", "Before":
# `vllm serve Qwen/Qwen3-235B-A22B-FP8 --tensor-parallel-size 4 --gpu-memory-utilization 0.5`,
# V1 (main of 2025-07-22), 4 GPUs of 139.72 GiB torch-visible (H200):
#   Initial free memory: 139.12 GiB, free memory: 81.52 GiB, requested GPU memory: 69.86 GiB
#   Total non KV cache memory: 62.79GiB; torch peak memory increase: 5.62GiB;
#   non-torch forward increase memory: 2.04GiB; weights memory: 55.13GiB.
#   Available KV cache memory: 7.07 GiB
# The 2.04 GiB is the fit (1.88 GiB = 2.04 - the 0.16 GiB TP 1 reserve, written in the h100-sxm
# and h200-sxm profiles' comments); the rest are checks. The profiles model vLLM >= 0.11, which
# sets NCCL up before its snapshot (vllm-project/vllm#25359): their runtime_reserve_tp is 0.
VLLM_0_10_TP = "hardware.hbm.runtime_reserve_tp=1.88GiB"  # vLLM <= 0.10's accounting
QWEN3_235B_H200 = dict(tensor_parallel_size=4, gpu_memory_utilization=0.5, max_num_seqs=1024,
                       max_batched_tokens=8192)  # fmt: skip


def test_qwen3_235b_fp8_on_4_h200_carves_hbm_as_vllm_logs_it():
    p = plan("qwen3-235b-a22b", "h200-sxm", "model.dtype=fp8", "engine.max_model_len=8192",
             VLLM_0_10_TP, **QWEN3_235B_H200)  # fmt: skip
    assert p.usable / GiB == pytest.approx(69.86, abs=0.05)
    assert p.weights / GiB == pytest.approx(55.13, abs=0.03)
    assert p.runtime_reserve / GiB == pytest.approx(2.04, abs=0.005)
    assert p.activation_peak / GiB == pytest.approx(5.62, abs=0.15)
    assert p.kv_room / GiB == pytest.approx(7.07, abs=0.1)


def test_the_tp_reserve_is_one_step_taken_only_above_one_gpu():
    args = ("qwen3-235b-a22b", "h100-sxm", "model.dtype=fp8", "engine.max_model_len=8192")
    engine = dict(max_num_seqs=1024, max_batched_tokens=8192)
    step = 1.88 * GiB
    for tp in (4, 8):
        with_tp = plan(*args, VLLM_0_10_TP, tensor_parallel_size=tp, **engine)
        without = plan(*args, tensor_parallel_size=tp, **engine)  # the profile's: vLLM >= 0.11
        # closed form: the same step at every degree (not per peer), in bytes and in blocks
        assert without.kv_room - with_tp.kv_room == pytest.approx(step, abs=1)
        assert with_tp.pool_blocks == int((without.kv_room - step) // without.block_bytes)
        assert without.runtime_reserve == 0.16 * GiB
    one = config("llama-3-8b", "h100-sxm", VLLM_0_10_TP, **LLAMA3_8B_H100)
    assert one.hardware.hbm.runtime_reserve_tp == step  # set, and left out at TP 1:
    assert plan("llama-3-8b", "h100-sxm", VLLM_0_10_TP, **LLAMA3_8B_H100).runtime_reserve == (
        0.16 * GiB
    )


def test_the_tp_step_matches_vllm_pr_10511s_rise_from_tp_1_to_tp_2():
    # PR #10511's H100 (above): non_torch_memory 1.79 GiB at TP 1 and 3.58 GiB at TP 2 (that
    # accounting counted from before the CUDA context): a 1.79 GiB step, 0.09 GiB under the fit
    two = plan("llama-3-8b", "h100-sxm", "hardware.hbm.runtime_reserve=1.79GiB", VLLM_0_10_TP,
               tensor_parallel_size=2, **LLAMA3_8B_H100)  # fmt: skip
    assert two.runtime_reserve / GiB == pytest.approx(3.58, abs=0.1)
    assert two.kv_room / GiB == pytest.approx(71.29 - 7.48 - 3.58 - 1.26, abs=0.1)


# vllm-project/vllm PR #2031 (WoosukKwon, 2023-12-12), Llama-2-7B, TP 1, one A100-80GB,
# benchmark_throughput.py with vLLM 0.2.5's defaults (max_num_batched_tokens = max_model_len
# 4096, max_num_seqs 256, block size 16, utilisation 0.9): "This PR: # GPU blocks: 7351"


def test_llama_2_7b_on_an_a100_holds_the_blocks_vllm_logs():
    p = plan("llama-2-7b", "a100-80g-sxm", max_num_seqs=256, max_batched_tokens=4096)
    assert p.block_bytes == 16 * 32 * 2 * 4096 * 2  # 8 MiB: 16 tokens x 32 layers x K,V x 4096
    # that profile counted the CUDA context (total - free), which vLLM V1 leaves out: 1.5% more
    assert p.pool_blocks == pytest.approx(7351, rel=0.02)


# vllm-project/vllm PR #17122 (Datta0, 2025-04-24), meta-llama/Llama-3.1-8B-Instruct on one
# L40S, vLLM V1: "Model loading took 14.9889 GiB" (the same shapes as Llama-3-8B)


def test_llama_3_1_8b_weights_are_what_vllm_loads():
    p = plan("llama-3-8b", "l40s", max_num_seqs=256, max_batched_tokens=2048)
    assert p.weights / GiB == pytest.approx(14.9889, rel=0.005)


# --- weights by tensor class --------------------------------------------------------------


def test_an_fp8_llama_3_70b_keeps_embedding_lm_head_and_norms_in_bf16():
    # by hand: 80 layers of (8192 x 10240 + 8192 x 8192) attention and 3 x 8192 x 28672 MLP
    # weights at 1 byte; 2 x 128256 x 8192 embedding and LM head, 161 x 8192 norms at 2 bytes
    linear = 80 * (8192 * 10240 + 8192 * 8192 + 3 * 8192 * 28672)
    wide = 2 * 128256 * 8192 + 161 * 8192
    model = config("llama-3-70b", "h200-sxm", "model.dtype=fp8").model
    assert model.weight_bytes == linear * 1 + wide * 2  # 67.67 GiB
    assert model.compute_dtype == "bf16" and model.act_bytes == 2
    assert config("llama-3-70b", "h200-sxm", "model.dtype=fp8").kv_dtype_bytes == 2
    every_byte = config("llama-3-70b", "h200-sxm", "model.dtype=fp8", "model.weights.lm_head=fp8",
                        "model.weights.embedding=fp8", "model.weights.norms=fp8").model  # fmt: skip
    assert every_byte.weight_bytes == linear + wide


def test_an_fp8_llama_3_70b_on_one_h100_is_refused_as_vllm_refuses_it():
    with pytest.raises(ConfigError) as info:
        plan("llama-3-70b", "h100-sxm", "model.dtype=fp8")
    text = str(info.value)
    # 0.9 x 79.22 GiB - 67.67 GiB - 0.16 GiB - 1.56 GiB leaves 1.90 GiB: 390 blocks of 6.25 MiB
    assert "a sequence of model.context_length 8192 tokens needs 512 KV blocks" in text
    assert "the KV pool holds 390 (6240 tokens" in text and "610.00 MiB missing" in text
    assert "expected engine.max_model_len at most 6240" in text
    # it runs on one H200 and on two H100s
    assert plan("llama-3-70b", "h200-sxm", "model.dtype=fp8").pool_blocks > 512
    two = plan("llama-3-70b", "h100-sxm", "model.dtype=fp8", tensor_parallel_size=2)
    assert two.pool_blocks > 512


def test_no_room_for_one_block_says_how_much_is_missing():
    with pytest.raises(ConfigError, match=r"has no room for one KV block of 2\.00 MiB: .* missing"):
        plan("llama-3-8b", "h100-sxm", "engine.gpu_memory_utilization=0.2")


def test_an_explicit_max_model_len_that_does_not_fit_is_blamed():
    with pytest.raises(ConfigError, match=r"key 'engine\.max_model_len'"):
        plan("llama-3-8b", "h100-sxm", "engine.gpu_memory_utilization=0.215",
             max_model_len=32768)  # fmt: skip


# --- fp8 priced as fp8 ----------------------------------------------------------------------


FP8 = CostParams(
    peak_flops=1000e12, hbm_bandwidth=2e12, gemm_efficiency=0.5, attention_efficiency=0.25,
    hbm_efficiency=0.5, step_overhead_s=0.0, layer_overhead_s=0.0, fp8_flops=2000e12,
)  # fmt: skip


def test_an_fp8_gemm_runs_at_the_fp8_rate_and_streams_one_byte_per_weight():
    big = gemm_seconds(FP8, 65536, 4096, 4096, 1.0, 2.0)
    assert big == pytest.approx(2 * 65536 * 4096 * 4096 / (2000e12 * 0.5))  # compute-bound
    one = gemm_seconds(FP8, 1, 4096, 4096, 1.0, 2.0)
    assert one == pytest.approx((4096 * 4096 + 2 * 4096 * 2) / (2e12 * 0.5))  # memory-bound
    no_fp8_cores = CostParams(**{**FP8.__dict__, "fp8_flops": None})
    assert gemm_seconds(no_fp8_cores, 65536, 4096, 4096, 1.0, 2.0) == pytest.approx(2 * big)


def test_an_fp8_model_streams_half_the_linear_weights_and_its_lm_head_in_bf16(tiny_model):
    fp8 = tiny_model.model_copy(update={"dtype": "fp8"})
    bf16_cost, fp8_cost = CostModel(tiny_model, FP8), CostModel(fp8, FP8)
    m = tiny_model
    head = (m.hidden * m.vocab + m.hidden + m.vocab) * 2 / 1e12  # bf16 either way
    layers = m.layers * (m.hidden * (m.q_dim + 2 * m.kv_dim) + m.q_dim * m.hidden
                         + 3 * m.hidden * m.intermediate)  # fmt: skip
    tokens_io = m.layers * 2 * (m.hidden + m.q_dim + 2 * m.kv_dim + m.q_dim + m.hidden
                                + m.hidden + 3 * m.intermediate + m.hidden)  # fmt: skip
    assert bf16_cost.linear_time(1, 1) == pytest.approx(head + (2 * layers + tokens_io) / 1e12)
    assert fp8_cost.linear_time(1, 1) == pytest.approx(head + (layers + tokens_io) / 1e12)


# --- dram_centric's HBM cache size ------------------------------------------------------------


def dram_centric(capacity, mode: str = "dram_centric"):
    """Llama-3-8B, one request of 64 + 8 tokens, 16-token blocks (2 MiB), no prefix caching."""
    data = {
        "model": "llama-3-8b",
        "hardware": "h100-sxm",
        "workload": {"kind": "synthetic", "num_requests": 1, "arrival": {"kind": "all_at_once"},
                     "prompt_tokens": 64, "output_tokens": 8},
        "engine": {"block_tokens": 16, "max_num_seqs": 8, "max_batched_tokens": 2048},
        "kv": {"mode": mode, "hbm": {"capacity": capacity}, "prefix_caching": False},
    }  # fmt: skip
    return build_config(data)


def test_an_hbm_cache_of_zero_streams_every_block_every_step():
    from sim.run import simulate

    s = simulate(dram_centric(0)).summary
    # the prefill reads no KV; decode step k = 1..7 reads the blocks of its 64 + k - 1 tokens
    # of context: ceil(64 / 16) = 4, then 5 six times: 34 blocks of 16 x 128 KiB
    blocks = sum(-(-(64 + k - 1) // 16) for k in range(1, 8))
    assert blocks == 34
    assert s["h2d_bytes"] == blocks * 16 * 128 * 1024
    assert s["hbm_access_hit_rate"] == 0.0


def test_a_larger_hbm_cache_gives_more_hbm_hits():
    from sim.run import simulate

    rates = [simulate(dram_centric(c)).summary["hbm_access_hit_rate"] for c in (0, "4MiB", "auto")]
    assert rates[0] < rates[1] < rates[2] == 1.0


def test_an_hbm_cache_size_is_refused_outside_dram_centric_and_above_the_room():
    with pytest.raises(ConfigError, match=r"key 'kv\.hbm\.capacity'.*in mode hbm HBM holds"):
        dram_centric("4MiB", mode="hbm")
    c = dram_centric("80GiB")
    with pytest.raises(ConfigError, match=r"key 'kv\.hbm\.capacity'.*expected at most"):
        plan_hbm(c, cost_model_for(c))


@pytest.mark.parametrize(
    ("value", "expected"),
    [("lots", "expected a size such as '16GiB'"), ("-1GiB", "a size of 0 or more"),
     ("80", "did you mean 80GiB")],
)  # fmt: skip
def test_a_bad_hbm_cache_size_is_one_error_naming_the_key(value, expected):
    with pytest.raises(ConfigError) as info:
        build_config(dram_centric(0).model_dump(mode="json"), "<t>", [f"kv.hbm.capacity={value}"])
    text = str(info.value)
    assert text.count("key '") == 1 and "key 'kv.hbm.capacity'" in text and expected in text


def test_the_samplers_bytes_per_logit_set_its_share_of_the_activation_peak():
    """Llama-3-8B on an H100, 256 sequences, 2048 batched tokens: the sampler sets the peak
    (the forward's is 2048 x 51200 x 2 B = 0.2 GB), 2048 x 4096 x 2 B of hidden states beside
    256 x 128256 logits at the key's bytes each; the pool gains what the sampler gives back."""
    engine = dict(max_num_seqs=256, max_batched_tokens=2048)
    sort = plan("llama-3-8b", "h100-sxm", **engine)
    flashinfer = plan("llama-3-8b", "h100-sxm", "engine.sampler_bytes_per_logit=14", **engine)
    for p, per_logit in ((sort, 39.2), (flashinfer, 14.0)):
        assert p.activation_peak == pytest.approx(2048 * 4096 * 2 + 256 * 128256 * per_logit)
    freed = 256 * 128256 * (39.2 - 14.0)
    assert flashinfer.kv_room - sort.kv_room == pytest.approx(freed)
    assert flashinfer.pool_blocks == int(flashinfer.kv_room // sort.block_bytes)
