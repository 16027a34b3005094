"""A request preempted by recompute finds the blocks it wrote that are still cached, as vLLM
V1's prefix cache gives them back: vLLM hashes every full block, and kvsim gives a preempted
request's blocks hashes of their own where the workload names none. Hand-computed on a
10-block pool of 16-token blocks:

r0 (64 prompt tokens) and r1 (48) are admitted together (4 + 3 blocks) and decode side by
side. At r1's 17th token (position 64) r0 already holds 6 blocks, r1 4, and r1 needs a fifth:
the newest, r1, is preempted with 64 tokens computed (4 blocks, the last of them generated),
which stay cached, tail first in eviction order. r1 cannot come back before r0 finishes (it
needs 5 blocks, 4 are left). With 60 output tokens r0 grows to 8 blocks (124 tokens) and
takes 2 of r1's cached blocks, its last two: r1 finds its first 2 blocks, 32 tokens. With 20
output tokens r0 needs no more: r1 finds all 4, 64 tokens, one of them generated, so its
lookup covers its output too (the prompt alone would give (48 - 1) // 16 = 2 blocks)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.kv.prefix import own_hashes
from sim.run import Simulation
from sim.workload import build_requests
from tests.conftest import make_config


def _run(prefix_caching: bool, r0_output: int) -> dict:
    workload = {
        "kind": "synthetic",
        "num_requests": 2,
        "arrival": {"kind": "all_at_once"},
        "prompt_tokens": 64,
        "output_tokens": 40,
    }
    config = make_config(
        "engine.kv_pool_blocks=10", f"kv.prefix_caching={str(prefix_caching).lower()}",
        engine={"check": True}, workload=workload,
    )  # fmt: skip
    requests = build_requests(config.workload, config.seed, block_tokens=16)
    requests.prompt_tokens[:] = [64, 48]
    requests.output_tokens[:] = [r0_output, 40]
    engine = Simulation(config, requests)
    result = engine.run()
    assert result.requests.preemptions.tolist() == [0, 1]
    # once r1 has finished no one can find its blocks: none stays cached (or indexed)
    assert not engine.kv.table.index and not engine.kv.tiers[0].evictable
    assert engine.kv.index.owners == 0
    return result.summary


@pytest.mark.parametrize(("r0_output", "found"), [(60, 32), (20, 64)])
def test_a_preempted_request_finds_its_blocks_still_cached(r0_output, found):
    summary = _run(True, r0_output)
    assert summary["recomputed_tokens"] == 64
    assert summary["prefix_rehit_tokens"] == found


def test_without_prefix_caching_a_preempted_request_computes_everything_again():
    summary = _run(False, 20)
    assert summary["recomputed_tokens"] == 64 and summary["prefix_rehit_tokens"] == 0


def test_own_hashes_are_distinct_and_never_zero():
    grid = np.concatenate([own_hashes(rid, 0, 300) for rid in range(300)])
    assert len(np.unique(grid)) == len(grid) == 90_000 and (grid != 0).all()
    # a request's hashes continue where its workload's stop, the same whatever the start
    assert np.array_equal(own_hashes(7, 5, 9), own_hashes(7, 0, 9)[5:])
