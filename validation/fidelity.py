"""The fidelity page: public serving measurements against kvsim's predictions.

``python -m validation.fidelity [--out docs/fidelity.md] [--only CATEGORY]`` reads
``validation/data/fidelity_measurements.csv`` (columns: ``validation/data/README.md``), builds
for every simulable row the kvsim run that reproduces the measurement (``row_config``: N
identical requests arriving at once with ``max_num_seqs`` = the batch, as vLLM's
``benchmark_latency`` and LMDeploy's static benchmark run them; ``capacity_config`` for the
KV pool an engine reports at start-up; ``load_configs`` for a prefix loaded back from CPU
DRAM; ``offload_config`` and :mod:`validation.hitrate` for serving with part of every
prompt in a CPU KV cache), runs it, reads the predicted figure (``predict``) and prints the
signed error; ``--out`` writes the page. A row's ``settings`` (``key=value`` overrides, as ``--set``
takes them) are applied last. The rows are a test set: nothing in kvsim is fitted on them
(``FIT_PROVENANCE`` says what is).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.config.loader import build_config
from sim.cost import cost_model_for
from sim.errors import KvsimError
from sim.memory.hbm_plan import max_model_len, plan_hbm
from sim.run import simulate
from validation import hitrate
from validation.fit import read_data

DATA = Path(__file__).parent / "data" / "fidelity_measurements.csv"
DIAGNOSES = Path(__file__).parent / "data" / "fidelity_diagnoses.csv"
DOCS = Path(__file__).parents[1] / "docs"
OUTLIER = 0.25  # rows off by more than this get a section of their own, each with its diagnosis
EXPLAINED = ("yes", "partly", "no")  # a diagnosis's `explained`

# Held out by the project (never used for anything) and fit-only sources (never test rows).
# vLLM PR #2031's block counts are a check in tests/test_hbm_plan.py, never fitted: test rows.
FORBIDDEN_SOURCES = (
    "llm-inference-bench",  # argonne-lcf LLM-Inference-Bench results
    "argonne-lcf",
    "llm-d-benchmark",  # its empirical vLLM memory results
    "offloading-connector",  # the vLLM blog post on its KV offloading connector (Jan 2026)
    "vllm-project.github.io/pull/149",  # the same post's source
    "blog.vllm.ai/2026/01",
)
FIT_ONLY_SOURCES = tuple(
    f"github.com/vllm-project/vllm/{kind}/{n}"
    for n in (3763, 4594, 5206, 10511, 12126, 17122, 21429, 24700)  # host costs of V0 (early
    # 2024); memory profiles; fused-MoE kernel times
    for kind in ("pull", "issues")
)

# metric -> (unit family, what kvsim reports)
METRICS = {
    "output_throughput": "tok/s",  # batch x output tokens / time until the batch finishes
    "e2e_latency": "time",  # time until the whole batch has finished
    "ttft": "time",  # first token of a request alone
    "itl": "time",  # mean time between output tokens of a request alone
    "total_throughput": "tok/s",  # (prompt + output tokens of the batch) / the same time
    "request_throughput": "req/s",  # batch / the same time
    "mean_ttft": "time",  # mean over the batch's requests (from each one's arrival)
    "mean_tpot": "time",  # mean over the batch's requests of their time per output token
    "kv_capacity_blocks": "blocks",  # KV blocks of the start-up memory plan (vLLM "# GPU blocks")
    "kv_capacity_tokens": "tokens",  # the same in tokens (vLLM V1 "GPU KV cache size")
    "kv_max_concurrency": "concurrency",  # the pool over max_model_len ("Maximum concurrency")
    "kv_load_time": "time",  # a prefix's KV loaded from CPU DRAM back into HBM
    # serving with part of every prompt in CPU DRAM (validation/hitrate.py)
    "offload_request_throughput": "req/s",
    "offload_output_throughput": "tok/s",
    "offload_mean_ttft": "time",
    "offload_round_time": "time",
}
UNIT_SECONDS = {"s": 1.0, "ms": 1e-3}
UNITS = {
    "tok/s": "tok/s",
    "req/s": "req/s",
    "s": "time",
    "ms": "time",
    "blocks": "blocks",
    "tokens": "tokens",
    "x": "concurrency",
}
CAPACITY = ("kv_capacity_blocks", "kv_capacity_tokens", "kv_max_concurrency")
OFFLOAD = (
    "offload_request_throughput",
    "offload_output_throughput",
    "offload_mean_ttft",
    "offload_round_time",
)
TRACE_BLOCK = 512  # tokens per Mooncake hash id (docs/workloads.md)
LOAD_GAP_MS = 600_000  # arrivals of the DRAM-load runs' requests: each finishes before the next

# Which data fitted which parameter of the profiles these rows run on (read from the profiles'
# headers and comments; extend it when a parameter gets a new fit). Never an end-to-end row.
FIT_PROVENANCE = (
    (
        "GEMM and per-kernel latencies, efficiencies (`efficiency.gemm*`, `efficiency.kernels`)",
        "h100-sxm, a100-80g-sxm, a40",
        "Vidur operator tables (github.com/microsoft/vidur, data/profiling/compute/{h100,a100}, "
        "commit 7d47513; the A40's, data/profiling/compute/a40, commits e26eb8f and f943db9, "
        "tp 1 rows of Llama-2-7B, CodeLlama-34B, Llama-2-70B and phi-2 in "
        "validation/data/vidur_a40; `kvsim calibrate`, docs/validation.md)",
    ),
    (
        "`efficiency.gemm_memory` of h200-sxm (its other GEMM and kernel parameters are "
        "h100-sxm's: the same die and clocks; gh200 carries all of them, its GEMM rate scaled "
        "by its measured large-GEMM ratio, stas00/ml-engineering PR #60); `efficiency.hbm` "
        "of a100-80g-sxm, h100-sxm, h200-sxm, gh200; the decode-attention bandwidth h200-sxm "
        "and gh200 carry",
        "h200-sxm; a100-80g-sxm, h100-sxm, h200-sxm, gh200",
        "torch's one-token GEMV on an H200 (tile-ai/TileOPs PR #244), with h100-sxm's "
        "gemm_latency held; BabelStream triad and dot on Azure's ND A100 v4, ND H100 v5 and "
        "ND H200 v5 "
        "(Azure/AI-benchmarking-guide), BabelStream triad on a GH200 "
        "(dnhkng/GH200_benchmarking); decode attention as h100-sxm's ratio to its weight "
        "streaming, at most the card's fastest stream (validation/data/memory_streaming.csv, "
        "`python -m validation.streamfit`)",
    ),
    (
        "vLLM's custom all-reduce (`interconnect.custom_allreduce`: its one- and two-stage "
        "kernels)",
        "h100-sxm (h200-sxm carries it)",
        "vLLM's benchmark_device_communicators.py kernel times in a CUDA graph on H100s, 0.5-4 "
        "MiB at 2 and 4 GPUs (vllm-project/vllm#24111, #24532; "
        "validation/data/custom_allreduce.csv, `validation.commfit.fit_custom`)",
    ),
    (
        "all-reduce model (`interconnect.*`), NIC (`nic.*`)",
        "h100-sxm, a100-80g-sxm (h200-sxm copies h100)",
        "NCCL collective tables in `../shared/calibration/measured-comm` "
        "(`kvsim calibrate --comm`)",
    ),
    (
        "`efficiency.attention`, `efficiency.attention_extra_keys` (prefill flash attention)",
        "h100-sxm (h100-pcie, h200-sxm, gh200 carry the fraction), a100-80g-sxm, "
        "a40 (rtx3090 carries the fraction)",
        "FlashAttention-3 paper (arXiv:2407.08608) Fig. 5, causal, head dim 128, H100 SXM; "
        "FlashAttention-2 causal forward, head dim 128, on an A100 (github.com/liangan1/"
        "GPU_travel, performance/flash-attn) and on an RTX A5000 (GA102, as a fraction of "
        "the A5000's peak; github.com/gpu-mode/ring-attention, "
        "notebooks/flash_attn_benchmark_results.txt) (validation/data/attention_kernels.csv, "
        "`python -m validation.attentionfit`)",
    ),
    (
        "`efficiency.decode_attention`, `efficiency.decode_attention_latency` (paged decode)",
        "h100-sxm with the h100-pcie rows (h100-pcie carries the fraction; h200-sxm, gh200 the "
        "call's time), a100-80g-sxm, a40 (rtx3090 carries the fraction)",
        "FlashAttention-3 paged decode on an H100 PCIe, 128 to 32,000 tokens "
        "(Dao-AILab/flash-attention#1572; github.com/TheRainstorm/attention_tests@75cdb15); "
        "Vidur's A100 and A40 decode-attention profiles (github.com/microsoft/"
        "vidur, data/profiling/a100/attention.csv, data/profiling/compute/a40/meta-llama/"
        "Llama-2-7b-hf/attention.csv) (same CSV and fit)",
    ),
    (
        "`efficiency.moe_gemm`, `efficiency.moe_gemm_memory`, `efficiency.moe_row_time`, "
        "`efficiency.moe_latency` (fused-MoE routed experts, on rows padded to the tile height, "
        "vs the dense GEMM's rate and bandwidth; a time per padded row; the call's fixed time)",
        "h100-sxm with the h200-sxm rows, a100-80g-sxm (h100-pcie, h200-sxm, gh200 carry "
        "h100-sxm's four; a40, l40s, rtx3090 carry its call time)",
        "vLLM's tuned Triton fused_moe, benchmark_moe.py kernel times: Mixtral-8x7B at TP 2 "
        "on H100, vllm-project/vllm#24700, with Gemma-4-26B-A4B's 128 small experts on H200, "
        "vllm-project/vllm#44818; Qwen3-Coder-30B-A3B on an A100-SXM4-80GB, "
        "YangLiuWillow/pie tuned_moe/VALIDATION.md, with Moonlight-16B-A3B's 64 experts of "
        "1408, vllm-project/vllm#40542 (validation/data/moe_kernels.csv, "
        "`python -m validation.moefit`)",
    ),
    (
        "`efficiency.step_overhead`, `efficiency.sequence_overhead` of vLLM V0 in early 2024 "
        "(the settings of the vllm-pr3240, -pr3692 and -pr4002 rows: 2.3 ms, 40 us)",
        "those rows only",
        "Ray's per-step dispatch to the TP workers, 2.0 ms on top of the profile's 0.3 ms "
        "(vllm-project/vllm#3763, TP 2 on an A100); detokenisation, ~20 us a sequence (#5206), "
        "and the sampler's logprobs, ~21 us a sequence (#4594): a lower bound",
    ),
    (
        "`efficiency.step_overhead`, `efficiency.sequence_overhead` (vLLM V1 host costs)",
        "all",
        "estimates from profiler traces in vLLM issues (#11133 step gaps, #6913 scheduling and "
        "output processing, #46112 per-sequence update); not fitted",
    ),
    (
        "`efficiency.async_step_gap` (the GPU's idle time a step under "
        "`engine.async_scheduling`, set on the rows of vLLM 0.14 or later)",
        "every GPU profile (the rows of vLLM 0.14 or later use it: emmy, tekton)",
        "an estimate: the 150-170 us step gap of vllm-project/vllm#11133's V1 prototype at "
        "batch 256; not fitted",
    ),
    (
        "host copies (`link.h2d`, `link.d2h`, `link.half_efficiency_bytes`, "
        "`link.chunk_blend`, `link.load_overhead`)",
        "h100-sxm, h100-pcie (others carry the per-chunk cost over)",
        "nvbandwidth copy-engine plateau (hardware-figures.md [M3]) and the cuMemcpyBatchAsync "
        "chunk microbenchmark of vLLM PR #48434 (validation/data/host_copy_bandwidth.csv, "
        "`python -m validation.copyfit`); the per-load cost is an estimate",
    ),
    (
        "the serving front end (`engine.frontend_latency`, `engine.frontend_token_latency`; "
        "the rows measured through vLLM's OpenAI API server set 10 ms and 2 us a token)",
        "all (0 by default: kvsim's TTFT is the engine's)",
        "client TTFT less vLLM's server-side TTFT, 8.4-12.2 ms (vllm-project/vllm#54628, "
        "'Backend parity'); tokenization ~2 us a token (ModelTC/LightLLM#1258); docs/model.md",
    ),
    (
        "copy-kernel rates (`link.sm_h2d`, `link.sm_d2h`; the LMCache rows load with "
        "`link.h2d_copier=sm`)",
        "h100-sxm (h100-pcie, h200-sxm carry both); a100-80g-sxm, a40, rtx3090 (`sm_h2d` = "
        "`h2d`); gh200 (`sm_h2d`)",
        "nvbandwidth host_to_device_memcpy_sm / device_to_host_memcpy_sm: 8x H800 SXM "
        "(liguodongiot/llm-action@07bac36), an A10 on Gen4 "
        "(sscargal/stevescargall.com.v2@6b3bb6f), GH200 96GB [M6]; docs/tiering.md",
    ),
    (
        "`hbm.runtime_reserve_tp` (vLLM <= 0.10's accounting; the profiles model later vLLMs: 0)",
        "the vllm-i21348 row's setting, 1.88 GiB (h100-sxm and h200-sxm say it in a comment)",
        "vLLM V1's logged memory profile of Qwen3-235B-A22B-FP8 on 4 H200, vllm-project/vllm#21429 "
        "(fit; checked against #10511's TP 1 to TP 2 rise on an H100)",
    ),
    (
        "`hbm.driver_reserve`, `hbm.runtime_reserve`, the sampler's bytes per logit",
        "all (h100-sxm fitted; others estimated or carried)",
        "vLLM's logged memory profiles, vllm-project/vllm#10511 and #12126 (fit only: never "
        "test rows); A100's torch-visible total from a logged mem_get_info, RTX 3090's from "
        "torch's out-of-memory messages (GaoLii/DSP#10, xiaoxiangAQ/GAS-Net#7), A40's from one "
        "('GPU 0 has a total capacity of 44.34 GiB', a public vLLM tutorial on RunPod A40s) and "
        "its nvidia-smi total (guqiong96/Lvllm#35)",
    ),
)


@dataclass(frozen=True)
class Outcome:
    """One row's prediction: the figure in the row's unit and its signed relative error, or
    why kvsim could not reproduce the row (``problem``; ``predicted`` is NaN then)."""

    row: pd.Series
    predicted: float
    problem: str = ""

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted / float(self.row["value"]) - 1.0


def load_rows(path: Path = DATA, held_out: bool = False) -> pd.DataFrame:
    """The measurement set, one row per measurement (ids as the index); refuses, with the
    row's id, a row that cites a held-out or fit-only source (unless ``held_out``: the file is
    the project's held-out set, read by its owner) or whose metric and unit are not ones the
    page knows."""
    frame = pd.read_csv(path, dtype={"tp": "Int64", "batch": "Int64"}, keep_default_na=False)
    for _, row in frame.iterrows():
        problem = _row_problem(row, held_out)
        if problem:
            raise ValueError(f"{path}: row {row['id']}: {problem}")
    return frame.set_index("id", drop=False)


def load_diagnoses(path: Path = DIAGNOSES) -> pd.DataFrame:
    """Why each outlier row is off (ids as the index): ``explained`` (yes, partly, no) and the
    ``diagnosis`` with its evidence; refuses, naming the row, an ``explained`` it does not
    know or an id given twice."""
    frame = read_data(path, dtype=str, keep_default_na=False)
    for row in frame.itertuples():
        if row.explained not in EXPLAINED:
            raise ValueError(
                f"{path}: row {row.id}: explained {row.explained!r}, expected one of {EXPLAINED}"
            )
    twice = frame["id"][frame["id"].duplicated()].tolist()
    if twice:
        raise ValueError(f"{path}: ids given twice: {twice}")
    return frame.set_index("id", drop=False)


def outliers(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Rows off by more than :data:`OUTLIER`, worst first."""
    far = [o for o in outcomes if abs(o.error) > OUTLIER]
    return sorted(far, key=lambda o: -abs(o.error))


def outlier_table(outcomes: Sequence[Outcome], diagnoses: pd.DataFrame) -> list[str]:
    """The outliers, each with whether its error is explained and why it is off."""
    lines = ["| id | error | explained | why |", "|---|---|---|---|"]
    for o in outliers(outcomes):
        rid = o.row["id"]
        known = rid in diagnoses.index
        explained = diagnoses.at[rid, "explained"] if known else "no"
        why = diagnoses.at[rid, "diagnosis"] if known else "no diagnosis yet"
        lines.append(f"| {rid} | {o.error:+.1%} | {explained} | {why} |")
    return lines


def _row_problem(row: pd.Series, held_out: bool = False) -> str | None:
    """Why a row cannot be in the test set (None: it can); ``held_out`` rows may cite the
    held-out sources (never the fit-only ones)."""
    cited = " ".join(str(row[c]) for c in ("source", "where", "quote", "notes")).lower()
    banned = [s for s in (() if held_out else FORBIDDEN_SOURCES) + FIT_ONLY_SOURCES if s in cited]
    if banned:
        return f"cites {banned[0]!r}, a held-out or fit-only source"
    metric, unit = row["metric"], row["unit"]
    if metric not in METRICS:
        return f"metric {metric!r} is not one of {sorted(METRICS)}"
    if UNITS.get(unit) != METRICS[metric]:
        return f"unit {unit!r} does not measure {metric} (expected a {METRICS[metric]} unit)"
    return None


def is_simulated(row: pd.Series) -> bool:
    """Whether the harness runs this row (``simulate`` = yes); other rows say why not."""
    return str(row["simulate"]).strip() == "yes"


def settings(row: pd.Series) -> list[str]:
    """The row's ``key=value`` overrides (``settings``, space-separated), as ``--set`` takes."""
    return str(row.get("settings", "")).split()


def row_config(row: pd.Series) -> dict:
    """The kvsim config (as a mapping) that reproduces the row's benchmark: ``batch``
    identical requests arriving at once, ``max_num_seqs`` = the batch, prefix caching off."""
    batch, prompt = int(row["batch"]), int(row["input_tokens"])
    return {
        "seed": 0,
        "model": {"profile": row["model_profile"], "dtype": row["dtype"]},
        "hardware": row["hardware_profile"],
        "workload": {
            "kind": "synthetic",
            "num_requests": batch,
            "arrival": {"kind": "all_at_once"},
            "prompt_tokens": prompt,
            "output_tokens": int(row["output_tokens"]),
        },
        "engine": {
            "max_num_seqs": batch,
            "max_batched_tokens": max(8192, prompt),
            "chunked_prefill": True,
            "block_tokens": 16,
            "gpu_memory_utilization": 0.9,
            "tensor_parallel_size": int(row["tp"]),
        },
        "kv": {"mode": "hbm", "dtype": row["kv_dtype"], "prefix_caching": False},
    }


def capacity_config(row: pd.Series) -> dict:
    """The config of a KV-capacity row: the engine as it started (``batch`` = ``max_num_seqs``,
    ``input_tokens`` = the tokens of its profiling batch, ``max_num_batched_tokens``; the
    row's ``settings`` add the utilisation) and one one-token request, enough to plan HBM.
    The row's ``output_tokens`` (empty: a start-up has none) is not read."""
    startup = row.copy()
    startup["output_tokens"] = 1
    config = row_config(startup)
    config["engine"].update(max_batched_tokens=int(row["input_tokens"]))
    config["workload"].update(num_requests=1, prompt_tokens=16, output_tokens=1)
    return config


def load_configs(row: pd.Series, trace: Path) -> tuple[dict, dict]:
    """The two runs that time a prefix load of ``input_tokens`` tokens from CPU DRAM (as an
    LMCache retrieve or vLLM's offloading connector does it), fetched before compute.

    Both replay ``trace`` (:func:`write_load_trace`): a request computes the prefix, a
    second with other content follows, then the first prompt comes again. In the first
    config the HBM pool holds one request, so the second evicts the prefix to DRAM and the
    third loads it back; in the second, the pool keeps it in HBM. The third request's TTFT
    differs between them by the load."""
    prompt = int(row["input_tokens"])
    base = row_config(row)
    base["workload"] = {"kind": "trace", "format": "mooncake", "path": str(trace)}
    base["engine"].update(max_num_seqs=1, max_batched_tokens=max(8192, prompt))
    base["kv"].update(mode="offload", prefix_caching=True, layerwise=False)
    evicting = json.loads(json.dumps(base))
    evicting["engine"]["kv_pool_blocks"] = -(-prompt // base["engine"]["block_tokens"]) + 1
    return evicting, base


def write_load_trace(prompt: int, path: Path) -> Path:
    """A Mooncake trace of the DRAM-load runs: prompts A, B (no id shared with A), A again."""
    ids = -(-prompt // TRACE_BLOCK)
    first, other = list(range(ids)), list(range(ids, 2 * ids))
    rows = [(0, first), (LOAD_GAP_MS, other), (2 * LOAD_GAP_MS, first)]
    lines = [
        json.dumps({"timestamp": t, "input_length": prompt, "output_length": 1, "hash_ids": h})
        for t, h in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _build(row: pd.Series, config: dict):
    return build_config(config, source=f"fidelity row {row['id']}", overrides=settings(row))


def predict_capacity(row: pd.Series) -> float:
    """The KV pool of the row's start-up plan, in blocks or tokens, or in sequences of the
    max_model_len (vLLM's "Maximum concurrency for N tokens per request: Cx")."""
    config = _build(row, capacity_config(row))
    blocks = plan_hbm(config, cost_model_for(config)).pool_blocks
    tokens = blocks * config.engine.block_tokens
    if row["metric"] == "kv_capacity_blocks":
        return float(blocks)
    if row["metric"] == "kv_max_concurrency":
        longest = max_model_len(config)[1]
        if not longest:
            raise RuntimeError(f"row {row['id']}: no engine.max_model_len or context_length")
        return tokens / longest
    return float(tokens)


def predict_load(row: pd.Series) -> float:
    """The DRAM load time of the row's prefix (:func:`load_configs`), in the row's unit."""
    with tempfile.TemporaryDirectory() as folder:
        trace = write_load_trace(int(row["input_tokens"]), Path(folder) / "load.jsonl")
        runs = [simulate(_build(row, config)) for config in load_configs(row, trace)]
    for result in runs:
        if (result.requests["status"] != "finished").any():
            raise RuntimeError(f"row {row['id']}: kvsim rejected a request of the benchmark")
    if runs[0].summary["dram_hit_rate"] <= 0 or runs[1].summary["dram_hit_rate"] > 0:
        raise RuntimeError(f"row {row['id']}: the runs did not load the prefix from DRAM once")
    loaded, kept = (float(r.requests["ttft_s"].iloc[-1]) for r in runs)
    return (loaded - kept) / UNIT_SECONDS[row["unit"]]


def hit_rate_benchmark(row: pd.Series, block_tokens: int) -> hitrate.Benchmark:
    """The row's throughput-against-hit-rate point (``num_requests`` empty: ``batch``) on an
    engine of ``block_tokens``-token KV blocks."""
    batch = int(row["batch"])
    return hitrate.Benchmark(
        requests=int(row["num_requests"] or batch),
        concurrency=batch,
        prompt=int(row["input_tokens"]),
        output=int(row["output_tokens"]),
        hit_rate=float(row["hit_rate"]),
        block_tokens=block_tokens,
    )


def offload_config(row: pd.Series) -> dict:
    """A hit-rate row's engine: as :func:`row_config`, in ``offload`` mode with prefix
    caching, prompt blocks written through to DRAM as computed, and loads fetched before
    compute (vLLM's offloading connector)."""
    config = row_config(row)
    config["kv"].update(hitrate.OFFLOAD_KV)
    return config


def predict_offload(row: pd.Series) -> float:
    """The row's figure over the measured phase of :mod:`validation.hitrate`'s trace."""
    config = offload_config(row)
    source = f"fidelity row {row['id']}"
    try:
        bench = hit_rate_benchmark(row, config["engine"]["block_tokens"])
        figures = hitrate.run(config, bench, settings(row), source)[0]
    except RuntimeError as error:
        raise RuntimeError(f"row {row['id']}: {error}") from None
    seconds = {"offload_mean_ttft": figures.mean_ttft_s, "offload_round_time": figures.round_s}
    if row["metric"] in seconds:
        return seconds[row["metric"]] / UNIT_SECONDS[row["unit"]]
    rates = {
        "offload_request_throughput": figures.request_throughput,
        "offload_output_throughput": figures.output_throughput,
    }
    return rates[row["metric"]]


def predict(row: pd.Series) -> float:
    """Run the row's config and return kvsim's figure for the row's metric, in its unit."""
    metric = row["metric"]
    if metric in CAPACITY:
        return predict_capacity(row)
    if metric == "kv_load_time":
        return predict_load(row)
    if metric in OFFLOAD:
        return predict_offload(row)
    result = simulate(_build(row, row_config(row)))
    requests = result.requests
    if (requests["status"] != "finished").any():
        raise RuntimeError(f"row {row['id']}: kvsim rejected a request of the benchmark")
    span = float(requests["finish_s"].max())
    rates = {
        "output_throughput": requests["output_tokens"].sum() / span,
        "total_throughput": (requests["prompt_tokens"] + requests["output_tokens"]).sum() / span,
        "request_throughput": len(requests) / span,
    }
    if metric in rates:
        return float(rates[metric])
    seconds = {
        "e2e_latency": span,
        "ttft": requests["ttft_s"].iloc[0],
        "itl": requests["tpot_s"].iloc[0],
        "mean_ttft": requests["ttft_s"].mean(),
        "mean_tpot": requests["tpot_s"].mean(),
    }[metric]
    return float(seconds) / UNIT_SECONDS[row["unit"]]


def run(rows: pd.DataFrame) -> list[Outcome]:
    """Predict every simulable row, in file order; a row kvsim refuses or cannot reproduce
    gets its reason instead of failing the others."""
    return [_outcome(row) for _, row in rows.iterrows() if is_simulated(row)]


def _outcome(row: pd.Series) -> Outcome:
    try:
        return Outcome(row, predict(row))
    except (RuntimeError, KvsimError) as error:
        return Outcome(row, math.nan, " ".join(str(error).split()))


def failed_table(outcomes: Sequence[Outcome]) -> list[str]:
    """Simulated rows kvsim could not reproduce, with the reason."""
    lines = ["| id | category | metric | measured | why kvsim could not reproduce it |"]
    lines.append("|---|---|---|---|---|")
    for o in outcomes:
        r = o.row
        lines.append(
            f"| {r['id']} | {r['category']} | {r['metric']} | {r['value']} {r['unit']} "
            f"| {o.problem.replace('|', '/')} |"
        )
    return lines


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _lengths(row: pd.Series) -> str:
    """Input / output tokens; for an offload row, the share of the prompt found in DRAM and
    the round's requests."""
    text = f"{row['input_tokens']} / {row['output_tokens']}"
    if str(row.get("hit_rate", "")).strip():
        requests = row["num_requests"] or row["batch"]
        text += f", hit {float(row['hit_rate']):g}, {requests} requests"
    return text


def outcome_table(outcomes: Sequence[Outcome]) -> list[str]:
    """The per-row markdown table."""
    lines = [
        "| id | category | model | GPU (profile) | engine | TP | batch | in / out | metric "
        "| measured | predicted | error | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        r = o.row
        lines.append(
            f"| {r['id']} | {r['category']} | {r['model']} ({r['dtype']}) | {r['hardware']} "
            f"({r['hardware_profile']}) | {r['engine']} {r['version']} | {r['tp']} | {r['batch']} "
            f"| {_lengths(r)} | {r['metric']} ({r['unit']}) | {_fmt(float(r['value']))} "
            f"| {_fmt(o.predicted)} | {o.error:+.1%} | [link]({r['source']}) |"
        )
    return lines


def settings_table(outcomes: Sequence[Outcome]) -> list[str]:
    """The rows run with ``--set`` overrides beyond their columns (none: no section), grouped
    by the overrides, so a reader sees what each row's engine was told."""
    groups: dict[str, list[str]] = {}
    for o in outcomes:
        if keys := settings(o.row):
            groups.setdefault(" ".join(keys), []).append(o.row["id"])
    if not groups:
        return []
    lines = [
        "## Rows run with settings",
        "",
        "Overrides a row's engine needs beyond its columns, as `--set` takes them (why: each "
        "row's `notes`).",
        "",
        "| settings | rows |",
        "|---|---|",
    ]
    lines += [f"| `{k}` | {', '.join(ids)} |" for k, ids in groups.items()]
    return [*lines, ""]


def error_summary(outcomes: Sequence[Outcome]) -> list[str]:
    """Median and worst absolute error, overall, on vLLM's rows (the engine kvsim models)
    when other engines' rows are there too, and per category."""
    lines = ["| rows | n | median abs. error | worst abs. error (row) |", "|---|---|---|---|"]
    groups = [("all", list(outcomes))]
    vllm = [o for o in outcomes if "vLLM" in o.row["engine"]]
    if 0 < len(vllm) < len(outcomes):
        groups.append(("vLLM engines", vllm))
    categories = list(dict.fromkeys(o.row["category"] for o in outcomes))
    if len(categories) > 1:
        groups += [(c, [o for o in outcomes if o.row["category"] == c]) for c in categories]
    for name, group in groups:
        errors = np.abs([o.error for o in group])
        worst = group[int(np.argmax(errors))]
        lines.append(
            f"| {name} | {len(group)} | {np.median(errors):.1%} "
            f"| {errors.max():.1%} ({worst.row['id']}) |"
        )
    return lines


def skipped_table(rows: pd.DataFrame) -> list[str]:
    """Rows kept in the set but not simulated, with the reason."""
    lines = ["| id | category | model | metric | measured | why not simulated | source |"]
    lines.append("|---|---|---|---|---|---|---|")
    for _, r in rows.iterrows():
        if not is_simulated(r):
            reason = str(r["simulate"]).removeprefix("no:").strip()
            lines.append(
                f"| {r['id']} | {r['category']} | {r['model']} | {r['metric']} "
                f"| {_fmt(float(r['value']))} {r['unit']} | {reason} | [link]({r['source']}) |"
            )
    return lines


def provenance() -> list[str]:
    """The generated section on which data fitted which parameter."""
    lines = ["| parameter | profiles | fitted on |", "|---|---|---|"]
    lines += [f"| {p} | {profiles} | {data} |" for p, profiles, data in FIT_PROVENANCE]
    return lines


def page(rows: pd.DataFrame, results: Sequence[Outcome], only: str | None) -> str:
    """docs/fidelity.md: how to rerun, the table, the error summary, rows kvsim could not
    reproduce (if any), skipped rows, provenance."""
    scope = f" (category `{only}` only)" if only else ""
    outcomes = [o for o in results if not o.problem]
    failed = [o for o in results if o.problem]
    failures = ["## Simulated rows kvsim could not reproduce", "", *failed_table(failed), ""]
    parts = [
        "# Fidelity: public serving measurements against kvsim",
        "",
        "<!-- generated by `python -m validation.fidelity --out docs/fidelity.md`; do not edit -->",
        "",
        f"kvsim's prediction for {len(outcomes)} published, measured serving results{scope}, "
        "each rerun as the benchmark ran it: N identical requests arriving at once with "
        "`max_num_seqs` = N (vLLM's `benchmark_latency`, LMDeploy's static benchmark), one "
        "request alone (concurrency 1; a long prefill is one such request), the KV pool of the "
        "engine's start-up plan (vLLM's `# GPU blocks` or its `Maximum concurrency`), a "
        "prefix loaded back from CPU "
        "DRAM (two offload runs of a three-request trace, the prefix evicted to DRAM in one "
        "and kept in HBM in the other), or serving with part of every prompt in a CPU KV "
        "cache (a closed-loop client of the benchmark's concurrency; the prompts' prefixes "
        "served once, then the prompts: `validation/hitrate.py`). Error = predicted / "
        "measured - 1: for a time, "
        "positive means kvsim is slower than the engine; for a throughput or a capacity, "
        "negative means it gives less. kvsim models "
        "a vLLM-like engine: rows of other engines (LMDeploy TurboMind, NVIDIA NIM) test its "
        "kernel-level cost model more than vLLM's runtime overheads. The measurements, with the "
        "exact quote of each number and where it stands on "
        "its page, are `validation/data/fidelity_measurements.csv` "
        "([columns](../validation/data/README.md)). They are a test set: no parameter of kvsim "
        "was fitted on them (last section). Rerun with",
        "",
        "```bash",
        "python -m validation.fidelity --out docs/fidelity.md   # seconds; --only decode",
        "```",
        "",
        "## Error",
        "",
        *error_summary(outcomes),
        "",
        "## Every row",
        "",
        *outcome_table(outcomes),
        "",
        *settings_table(outcomes),
        f"## Rows off by more than {OUTLIER:.0%}",
        "",
        "Why each is off, as far as it is known (`validation/data/fidelity_diagnoses.csv`): "
        "`explained` says whether the cause is shown (yes), shown for part of the gap "
        "(partly) or not found (no). A diagnosis never changes a parameter: the rows stay "
        "a test set.",
        "",
        *outlier_table(outcomes, load_diagnoses()),
        "",
        *(failures if failed else []),
        "## Kept but not simulated",
        "",
        *skipped_table(rows),
        "",
        "## Which data fitted which parameter",
        "",
        "Generated from `FIT_PROVENANCE` in `validation/fidelity.py` (read from the hardware "
        "profiles' headers and comments). Only component-level data is fitted: operator tables, "
        "kernel and collective benchmarks, copy-bandwidth measurements, logged memory profiles.",
        "",
        *provenance(),
        "",
    ]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table; with ``--out``, write the page."""
    parser = argparse.ArgumentParser(prog="python -m validation.fidelity", description=__doc__)
    parser.add_argument("--out", type=Path, help="write the page here (docs/fidelity.md)")
    parser.add_argument(
        "--only", help="one category (decode, prefill, kv_load, kv_capacity, offload)"
    )
    parser.add_argument("--data", type=Path, default=DATA, help="the measurement CSV")
    parser.add_argument(
        "--held-out", action="store_true",
        help="--data is the project's held-out set (its rows may cite the held-out sources); "
        "its page goes only where --out says, never into docs/",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.held_out:
        _refuse_held_out_into_the_project(parser, args.data, args.out)
    rows = load_rows(args.data, args.held_out)
    if args.only:
        rows = rows[rows["category"] == args.only]
        if not len(rows):
            parser.error(f"--only {args.only}: no row has that category")
    results = run(rows)
    outcomes = [o for o in results if not o.problem]
    for o in results:
        if o.problem:
            print(f"row {o.row['id']}: {o.problem}", file=sys.stderr)
    if not outcomes:
        print(f"no simulable rows{' in ' + args.only if args.only else ''}", file=sys.stderr)
        return 1
    text = page(rows, results, args.only)
    print("\n".join([*error_summary(outcomes), "", *outcome_table(outcomes)]))
    if args.out is not None:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    return 0 if all(math.isfinite(o.predicted) for o in results) else 1


def _refuse_held_out_into_the_project(
    parser: argparse.ArgumentParser, data: Path, out: Path | None
) -> None:
    """``--held-out`` reads a file of the owner's and writes nowhere in the project's docs."""
    if data.resolve() == DATA.resolve():
        parser.error(f"--held-out: {data} is the project's test set, which never holds "
                     "held-out rows; give the held-out file with --data")  # fmt: skip
    if out is not None and out.resolve().parent == DOCS.resolve():
        parser.error(f"--held-out: {out} is in the project's docs; write the page elsewhere")


if __name__ == "__main__":
    raise SystemExit(main())
