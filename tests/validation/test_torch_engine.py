"""The mini-engine computes the right numbers in every mode and takes the simulator's steps."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sim.config.loader import build_config, load_hardware  # noqa: E402
from sim.errors import KvsimError  # noqa: E402
from sim.run import simulate  # noqa: E402
from sim.workload import build_requests  # noqa: E402
from validation.engine import MiniEngine  # noqa: E402
from validation.torchmodel import (  # noqa: E402
    attend,
    dense_attention,
    dense_forward,
    random_weights,
    step_layout,
)

pytestmark = pytest.mark.torch
TINY = {
    "name": "tiny", "layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32,
    "intermediate": 256, "vocab": 512, "dtype": "fp32",
}  # fmt: skip
RTOL = 1e-3  # issue 7: paged attention equals dense SDPA within 1e-3 relative


def config(mode: str, pool: int, *, seqs: int = 4, budget: int = 64, requests: int = 6,
           workload: dict | None = None, **kv):  # fmt: skip
    """A tiny closed-batch run config for the mini-engine and the simulator."""
    data = {
        "seed": 3,
        "model": TINY,
        "hardware": "cpu-host",
        "workload": {
            "kind": "synthetic", "num_requests": requests, "arrival": {"kind": "all_at_once"},
            "prompt_tokens": {"kind": "uniform", "min": 5, "max": 70},
            "output_tokens": {"kind": "uniform", "min": 2, "max": 9},
        },
        "engine": {"max_num_seqs": seqs, "max_batched_tokens": budget, "block_tokens": 8,
                   "kv_pool_blocks": pool},
        "kv": {"mode": mode, "prefix_caching": False, "layerwise": False, **kv},
    }  # fmt: skip
    if workload is not None:
        data["workload"] = workload
    return build_config(data, "<test>")


def documents(requests: int = 16) -> dict:
    """Questions on 6 shared documents (Zipf 0.5) after an 8-token system prompt: prefix hits."""
    return {
        "kind": "documents", "num_requests": requests, "arrival": {"kind": "all_at_once"},
        "num_documents": 6, "document_tokens": {"kind": "uniform", "min": 24, "max": 64},
        "question_tokens": {"kind": "uniform", "min": 4, "max": 16},
        "output_tokens": {"kind": "uniform", "min": 2, "max": 8},
        "zipf_s": 0.5, "system_prompt_tokens": 8,
    }  # fmt: skip


BLOCK = 2 * 2 * 2 * 32 * 4 * 8  # tiny model: layers x K,V x kv_heads x head_dim x 4 B x 8 tokens


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|."""
    return float((got - want).abs().max() / want.abs().max())


def test_paged_attention_equals_dense_sdpa():
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, hd, bt = 4, 2, 32, 8
    new, context = [13, 1, 1, 6], [0, 29, 8, 17]  # a prefill, two decodes, a chunk after cache
    pool = torch.zeros(1, 2, 40, bt, kv_heads, hd)
    order = (torch.randperm(39, generator=gen) + 1).tolist()  # scattered blocks, 0 unused
    tables, at = [], 0
    for c, n in zip(context, new, strict=True):
        k = -(-(c + n) // bt)
        tables.append(order[at : at + k])
        at += k
    full = [[torch.randn(c + n, h, hd, generator=gen) for h in (heads, kv_heads, kv_heads)]
            for c, n in zip(context, new, strict=True)]  # fmt: skip
    flat = pool[0].flatten(1, 2)
    for (_, k, v), c, table in zip(full, context, tables, strict=True):
        slots = [table[p // bt] * bt + p % bt for p in range(c)]
        flat[0, slots], flat[1, slots] = k[:c], v[:c]
    q_new = torch.cat([q[c:] for (q, _, _), c in zip(full, context, strict=True)])
    k_new = torch.cat([k[c:] for (_, k, _), c in zip(full, context, strict=True)])
    v_new = torch.cat([v[c:] for (_, _, v), c in zip(full, context, strict=True)])
    out = attend(q_new, k_new, v_new, pool, 0, step_layout(new, context, tables, bt))
    want = torch.cat(
        [dense_attention(q, k, v)[c:] for (q, k, v), c in zip(full, context, strict=True)]
    )
    assert relative_error(out, want) < RTOL


def prefix_config(mode: str, pool: int, seqs: int = 2, budget: int = 32):
    """``mode`` with a prefix cache on the documents workload (offload: a 30-block host pool)."""
    kv = {"prefix_caching": True, "ssd_capacity": 0}
    if mode == "offload":
        kv["dram_capacity"] = 30 * BLOCK
    return config(mode, pool, seqs=seqs, budget=budget, workload=documents(), **kv)


ENGINE_CASES = [  # every mode; offload and hbm with a prefix cache that evicts
    ("hbm", lambda: config("hbm", 40, seqs=2)),
    ("dram_centric", lambda: config("dram_centric", 22, seqs=2)),
    ("hbm+prefix", lambda: prefix_config("hbm", 16)),
    ("offload", lambda: prefix_config("offload", 24)),
]


@pytest.mark.parametrize(("name", "make"), ENGINE_CASES, ids=[c[0] for c in ENGINE_CASES])
def test_engine_logits_equal_a_dense_forward_in_every_mode(name, make):
    cfg = make()
    mode = cfg.kv.mode
    requests = build_requests(cfg.workload, cfg.seed, block_tokens=8)
    engine = MiniEngine(cfg, requests, record_logits=True)
    run = engine.run()
    if mode == "dram_centric":
        assert run.steps.d2h_bytes.sum() > 0  # KV really went through to the host pool
    if mode == "offload":  # blocks went down to the host pool and came back on prefix hits
        assert run.steps.d2h_bytes.sum() > 0 and run.steps.h2d_bytes.sum() > 0
    if cfg.kv.prefix_caching:
        assert sum(len(t) for t in engine.kv.tables.values()) == 0 and engine.kv.index
    weights = random_weights(cfg.model, cfg.seed)
    for rid, logits in engine.logits.items():
        sequence = torch.tensor(engine.sequences[rid])
        prompt = int(requests.prompt_tokens[rid])
        reference = dense_forward(cfg.model, weights, sequence[:-1])[prompt - 1 :]
        assert relative_error(torch.stack(logits), reference) < RTOL, (mode, rid)


def test_modes_produce_the_same_tokens():
    tokens = {}
    for mode, pool in (("hbm", 40), ("dram_centric", 22)):
        cfg = config(mode, pool, seqs=2)
        tokens[mode] = (
            MiniEngine(cfg, build_requests(cfg.workload, cfg.seed, block_tokens=8)).run().tokens
        )
    assert tokens["hbm"] == tokens["dram_centric"]
    cached = {}
    for name, cfg in (
        ("no cache", config("hbm", 40, seqs=2, budget=32, workload=documents())),
        ("hbm", prefix_config("hbm", 16)),
        ("offload", prefix_config("offload", 24)),
    ):
        requests = build_requests(cfg.workload, cfg.seed, block_tokens=8)
        cached[name] = MiniEngine(cfg, requests).run().tokens
    assert cached["no cache"] == cached["hbm"] == cached["offload"]


def run_beside_the_simulator(cfg):
    """The mini-engine and the simulator on one workload; asserts they took the same steps."""
    requests = build_requests(cfg.workload, cfg.seed, block_tokens=8)
    run = MiniEngine(cfg, requests).run()
    sim = simulate(cfg, requests)
    assert list(run.steps.batch_size) == list(sim.timeline.batch_size)
    assert list(run.steps.step_tokens) == list(sim.timeline.step_tokens)
    assert run.preemptions == sim.summary["preemptions"]
    return run, sim


@pytest.mark.parametrize(
    ("mode", "pool", "budget"),
    [("hbm", 40, 64), ("hbm", 12, 32), ("dram_centric", 4096, 64)],  # 12 blocks: preemptions
)
def test_engine_takes_the_simulators_steps(mode, pool, budget):
    run, sim = run_beside_the_simulator(config(mode, pool, budget=budget, requests=8))
    if pool == 12:
        assert run.preemptions > 0
    # write-through moves exactly the new tokens' KV: 2 layers x K,V x 2 heads x 32 x 4 B each
    per_token = 2 * 2 * 2 * 32 * 4
    expected = 0 if mode == "hbm" else int(run.steps.step_tokens.sum()) * per_token
    assert run.steps.d2h_bytes.sum() == expected == sim.summary["d2h_bytes"]


@pytest.mark.parametrize("mode", ["hbm", "offload"])
def test_preempted_requests_of_a_hashless_workload_find_their_own_blocks_in_both(mode):
    """Distinct prompts (no prefix identity) in a 12-block pool, prefix caching on: the
    requests preempted by recompute find their blocks again (hashes of their own) in the
    mini-engine as in the simulator, on the same steps, moving the same bytes."""
    kv = {"prefix_caching": True, "ssd_capacity": 0}
    if mode == "offload":
        kv["dram_capacity"] = 30 * BLOCK
    run, sim = run_beside_the_simulator(config(mode, 12, budget=32, requests=8, **kv))
    assert run.preemptions > 0 and sim.summary["prefix_rehit_tokens"] > 0
    assert run.steps.h2d_bytes.sum() == sim.summary["h2d_bytes"]
    assert run.steps.d2h_bytes.sum() == sim.summary["d2h_bytes"]


@pytest.mark.parametrize(
    ("mode", "pool", "seqs", "budget"),
    [("offload", 24, 2, 32), ("offload", 24, 4, 64), ("offload", 16, 1, 32), ("hbm", 16, 2, 32)],
)
def test_prefix_cache_takes_the_simulators_steps_and_moves_its_bytes(mode, pool, seqs, budget):
    run, sim = run_beside_the_simulator(prefix_config(mode, pool, seqs=seqs, budget=budget))
    # the same blocks were written through or back, and loaded on host-pool hits
    assert run.steps.h2d_bytes.sum() == sim.summary["h2d_bytes"]
    assert run.steps.d2h_bytes.sum() == sim.summary["d2h_bytes"]
    assert sim.summary["hbm_hit_rate"] > 0.3
    if mode == "offload":
        assert sim.summary["dram_hit_rate"] > 0 and sim.summary["h2d_bytes"] > 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kv": {"mode": "dram_centric", "prefix_caching": True}}, "kv.prefix_caching with"),
        ({"kv": {"mode": "offload", "write_policy": "write_back"}}, "kv.write_policy"),
        ({"kv": {"mode": "offload", "ssd_capacity": "1GiB"}}, "an SSD tier"),
        ({"kv": {"mode": "offload", "dram_capacity": "64GiB"}}, "kv.dram_capacity"),
        ({"engine": {"preemption": "swap", "kv_pool_blocks": 40}}, "engine.preemption: swap"),
        ({"engine": {"kv_pool_blocks": None}}, "engine.kv_pool_blocks"),
    ],
)
def test_unsupported_settings_are_refused(change, message):
    cfg = config("hbm", 40)
    data = cfg.model_dump(mode="json")
    for section, values in change.items():
        data[section] |= values
    data["kv"].setdefault("prefix_caching", False)
    with pytest.raises(KvsimError, match=message):
        cfg2 = build_config(data, "<test>")
        MiniEngine(cfg2, build_requests(cfg2.workload, cfg2.seed, block_tokens=8)).run()


def test_moe_model_is_refused():
    cfg = config("hbm", 40)
    mixtral = cfg.model_copy(update={"model": cfg.model.model_copy(update={"gated_mlp": False})})
    with pytest.raises(KvsimError, match="ungated MLPs"):
        random_weights(mixtral.model, 0)
    assert np.isfinite(load_hardware("cpu-host").compute.bf16_flops)
