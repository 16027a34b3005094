"""Generators: multi-turn sessions, shared documents, presets, bursts, fitted traces."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from sim.config import build_config
from sim.workload import Requests
from tests.conftest import BASE
from tests.workload.workload_helpers import build, workload

MULTI_TURN = {
    "kind": "multi_turn",
    "num_sessions": 40,
    "session_arrival": {"kind": "gamma", "rate": 2.0, "cv": 2.0},
    "turns": {"kind": "uniform", "min": 1, "max": 6},
    "think_time": {"kind": "exponential", "mean": "5s"},
    "user_tokens": {"kind": "uniform", "min": 1, "max": 120},
    "output_tokens": {"kind": "uniform", "min": 1, "max": 90},
    "system_prompt_tokens": 100,
}
DOCUMENTS = {
    "kind": "documents",
    "num_requests": 60,
    "arrival": {"kind": "poisson", "rate": 5.0},
    "num_documents": 4,
    "document_tokens": {"kind": "uniform", "min": 30, "max": 200},
    "question_tokens": {"kind": "uniform", "min": 1, "max": 20},
    "output_tokens": {"kind": "uniform", "min": 1, "max": 30},
    "system_prompt_tokens": 10,
}


def hits(prefix: np.ndarray, cache: set[int]) -> int:
    """Blocks of ``prefix`` found in ``cache``, stopping at the first miss (prefix matching)."""
    return next((i for i, h in enumerate(prefix.tolist()) if h not in cache), len(prefix))


@pytest.mark.parametrize("block_tokens", [4, 16])
def test_multi_turn_infinite_cache_hits_exactly_the_history(block_tokens: int) -> None:
    """Turn n+1 hits all of turn n's prompt and generated blocks and nothing more."""
    requests = build(MULTI_TURN, block_tokens=block_tokens)
    cache: set[int] = set()
    previous: dict[int, int] = {}
    for r in range(len(requests)):
        session, turn = int(requests.session[r]), int(requests.turn[r])
        prefix = requests.prefix_hashes[r]
        got = hits(prefix, cache)
        if turn == 0:
            shared = 100 // block_tokens if r > 0 else 0  # the system prompt, after session 0
            assert got == shared
        else:
            last = previous[session]
            history = requests.prompt_tokens[last] + requests.output_tokens[last]
            assert got == history // block_tokens
            seen = np.concatenate([requests.prefix_hashes[last], requests.output_hashes[last]])
            assert prefix[:got].tolist() == seen.tolist()
            assert turn == requests.turn[last] + 1
        assert not set(prefix[got:].tolist()) & cache  # nothing past the first miss is cached
        cache.update(prefix.tolist())
        cache.update(requests.output_hashes[r].tolist())
        previous[session] = r
    assert requests.turn.max() >= 3


def test_multi_turn_shapes() -> None:
    spec = MULTI_TURN | {"max_context_tokens": 400, "think_time": 2.0, "system_prompts": 3}
    requests = build(spec)
    assert np.all(requests.prompt_tokens + requests.output_tokens <= 400)
    assert np.all(np.diff(requests.arrival_s) >= 0)
    for session in np.unique(requests.session):
        rows = np.flatnonzero(requests.session == session)
        assert requests.turn[rows].tolist() == list(range(len(rows)))  # turns end, never skip
        assert np.allclose(np.diff(requests.arrival_s[rows]), 2.0)
        assert np.all(np.diff(requests.prompt_tokens[rows]) > 0)
    firsts = [requests.prefix_hashes[r][0] for r in np.flatnonzero(requests.turn == 0)]
    assert len(set(firsts)) == 3  # three system prompts in use


def token_identities(requests: Requests, owner) -> list[list[tuple]]:
    """Each request's sequence as token identities, from ``owner(request, position)``."""
    return [
        [owner(r, p) for p in range(int(requests.prompt_tokens[r]))] for r in range(len(requests))
    ]


def assert_hashes_mean_equal_prefixes(
    requests: Requests, tokens: list[list[tuple]], bt: int
) -> None:
    """Brute force: hash of block i equal <=> token prefixes up to block i equal."""
    by_prefix: dict[tuple, int] = {}
    by_hash: dict[int, tuple] = {}
    for r, sequence in enumerate(tokens):
        assert len(requests.prefix_hashes[r]) == len(sequence) // bt
        for i, value in enumerate(requests.prefix_hashes[r].tolist()):
            prefix = tuple(sequence[: (i + 1) * bt])
            assert by_prefix.setdefault(prefix, value) == value
            assert by_hash.setdefault(value, prefix) == prefix


def test_multi_turn_hashes_brute_force() -> None:
    spec = MULTI_TURN | {"num_sessions": 12, "system_prompts": 2}
    requests = build(spec, block_tokens=8)
    spec_obj = workload(spec)
    variants: dict[int, int] = {}
    for r in range(len(requests)):  # a session's variant shows in its first block's hash
        variants.setdefault(int(requests.session[r]), int(requests.prefix_hashes[r][0]))

    def owner(r: int, p: int) -> tuple:
        session = int(requests.session[r])
        if p < spec_obj.system_prompt_tokens:
            return ("system", variants[session], p)
        return ("session", session, p)

    assert_hashes_mean_equal_prefixes(requests, token_identities(requests, owner), 8)


def test_documents_hashes_brute_force() -> None:
    """Token identities rebuilt from the generator's own streams (documents: 2nd and 3rd)."""
    from sim.workload.context import WorkloadContext
    from sim.workload.distributions import draw_lengths
    from sim.workload.documents import zipf_weights

    requests = build(DOCUMENTS, block_tokens=4)
    spec = workload(DOCUMENTS)
    rngs = WorkloadContext(0).generators(5)
    lengths = draw_lengths(spec.document_tokens, 4, rngs[1])
    doc = rngs[2].choice(4, size=60, p=zipf_weights(4, spec.zipf_s))
    question = requests.prompt_tokens - 10 - lengths[doc]
    assert np.all((question >= 1) & (question <= 20))

    def owner(r: int, p: int) -> tuple:
        if p < 10:
            return ("system", p)
        if p < 10 + lengths[doc[r]]:
            return ("doc", int(doc[r]), p)
        return ("own", r, p)

    assert_hashes_mean_equal_prefixes(requests, token_identities(requests, owner), 4)
    assert np.bincount(doc, minlength=4)[0] > np.bincount(doc, minlength=4)[3]  # Zipf


def test_synthetic_shared_prefix_and_unchanged_default() -> None:
    base = {
        "kind": "synthetic",
        "num_requests": 50,
        "arrival": {"kind": "poisson", "rate": 3.0},
        "prompt_tokens": {"kind": "uniform", "min": 10, "max": 300},
        "output_tokens": 8,
    }
    plain = build(base)
    assert plain.prefix_hashes is None
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(0).spawn(3)]
    gaps = rngs[0].exponential(1 / 3.0, size=50)
    gaps[0] = 0
    assert plain.arrival_s.tolist() == np.cumsum(gaps).tolist()  # same streams as before
    assert plain.prompt_tokens.tolist() == rngs[1].integers(10, 300, 50, endpoint=True).tolist()

    shared = build(base | {"shared_prefix_tokens": 64}, block_tokens=16)
    assert shared.prompt_tokens.tolist() == plain.prompt_tokens.tolist()
    heads = {tuple(h[:4].tolist()) for h in shared.prefix_hashes if len(h) >= 4}
    assert len(heads) == 1
    tails = [h[4:].tolist() for h in shared.prefix_hashes]
    assert len(set(itertools.chain(*tails))) == sum(map(len, tails))  # the rest is unique


def test_on_off_arrivals() -> None:
    fixed = {"kind": "on_off", "rate_on": 50.0, "rate_off": 0.0, "on_s": 2.0, "off_s": 8.0}
    spec = {
        "kind": "synthetic",
        "num_requests": 3000,
        "arrival": fixed | {"periods": "fixed"},
        "prompt_tokens": 10,
        "output_tokens": 10,
    }
    arrival = build(spec).arrival_s
    gaps = np.diff(arrival)
    starts = np.concatenate([[0], np.flatnonzero(gaps > 4.0) + 1, [len(arrival)]])
    spans = [arrival[b - 1] - arrival[a] for a, b in itertools.pairwise(starts)]
    assert max(spans) < 2.0 and len(spans) >= 25  # bursts of at most on_s, off_s apart
    mean_rate = (len(arrival) - 1) / arrival[-1]
    assert mean_rate == pytest.approx(50 * 2 / 10, rel=0.1)

    mmpp = {"kind": "on_off", "rate_on": 40.0, "rate_off": 2.0, "on_s": 5.0, "off_s": 25.0}
    arrival = build(spec | {"num_requests": 20000, "arrival": mmpp}).arrival_s
    assert (len(arrival) - 1) / arrival[-1] == pytest.approx((40 * 5 + 2 * 25) / 30, rel=0.15)
    counts = np.bincount((arrival // 1.0).astype(int))
    assert counts.std() / counts.mean() > 1.5  # far burstier than Poisson (about 0.35)


def test_fitted_from_trace(write) -> None:
    rows = "".join(
        f'{{"timestamp": {t}, "input_length": {p}, "output_length": {o}, "hash_ids": []}}\n'
        for t, p, o in [(0, 100, 5), (1000, 200, 9), (1500, 3000, 2000), (4500, 400, 1)]
    )
    path = write("f.jsonl", rows)
    spec = {
        "kind": "fitted",
        "from": {"format": "mooncake", "path": str(path)},
        "num_requests": 500,
    }
    requests = build(spec)
    pairs = set(zip(requests.prompt_tokens.tolist(), requests.output_tokens.tolist(), strict=True))
    assert pairs == {(100, 5), (200, 9), (3000, 2000), (400, 1)}  # joint draws from the rows
    assert set(np.round(np.diff(requests.arrival_s), 6).tolist()) == {1.0, 0.5, 3.0}
    assert requests.report.requests == 4

    faster = build(spec | {"from": {"format": "mooncake", "path": str(path), "rate_scale": 2}})
    assert faster.arrival_s[-1] == pytest.approx(requests.arrival_s[-1] / 2)

    clipped = build(spec | {"max_total_tokens": 1000, "arrival": {"kind": "poisson", "rate": 6}})
    total = clipped.prompt_tokens + clipped.output_tokens
    assert total.max() == 1000 and clipped.prompt_tokens.min() >= 1
    big = clipped.prompt_tokens[total == 1000]
    assert set(big.tolist()) == {600}  # 3000:2000 shrunk to 600:400
    assert len(build(spec | {"num_requests": None})) == 4


def test_fitted_from_real_azure_trace(traces_dir: Path) -> None:
    spec = {
        "kind": "fitted",
        "from": {"format": "azure", "path": "azure_llm_2023_conv.csv"},
        "num_requests": 4000,
        "arrival": {"kind": "poisson", "rate": 6.0},
        "max_total_tokens": 4096,
    }
    requests = build(spec, base_dir=traces_dir)
    assert len(requests) == 4000
    assert (requests.prompt_tokens + requests.output_tokens).max() <= 4096
    assert 900 < requests.prompt_tokens.mean() < 1400  # the trace's mean is 1,155
    assert 3500 / 6 * 0.9 < requests.arrival_s[-1] < 4000 / 6 * 1.1


@pytest.mark.parametrize(
    "name", ["short-chat", "long-doc-summary", "doc-qa", "multi-turn-chat", "bursty"]
)
def test_presets_build(name: str) -> None:
    requests = build(name)
    assert len(requests) > 100 and requests.prefix_hashes is not None
    assert build({"preset": name}).arrival_s.tolist() == requests.arrival_s.tolist()


def test_preset_overrides_and_config_round_trip() -> None:
    config = build_config(
        BASE | {"workload": {"preset": "multi-turn-chat", "num_sessions": 7}},
        overrides=["workload.think_time.mean=3s"],
    )
    assert config.workload.kind == "multi_turn" and config.workload.num_sessions == 7
    assert config.workload.think_time.mean == 3.0
    dumped = config.model_dump(mode="json")
    assert "preset" not in dumped["workload"]
    assert build_config(dumped) == config
    swapped = workload({"preset": "bursty", "arrival": {"kind": "all_at_once"}})
    assert swapped.arrival.kind == "all_at_once"  # a new kind replaces, not merges
    with pytest.raises(ValidationError, match="did you mean 'short-chat'"):
        workload("short-chat2")
    assert build_config(BASE | {"workload": "short-chat"}).workload.num_requests == 1000


def test_fitted_round_trip_keeps_from_key(tmp_path: Path) -> None:
    data = BASE | {"workload": {"kind": "fitted", "from": {"format": "azure", "path": "x.csv"}}}
    dumped = build_config(data).model_dump(mode="json")
    assert "from" in dumped["workload"] and build_config(dumped) == build_config(data)


@pytest.mark.parametrize("spec", ["short-chat", "bursty", "doc-qa", MULTI_TURN, DOCUMENTS], ids=str)
def test_same_seed_same_table(spec) -> None:
    a, b, c = build(spec, seed=3), build(spec, seed=3), build(spec, seed=4)
    for name in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert all(np.array_equal(x, y) for x, y in zip(a.prefix_hashes, b.prefix_hashes, strict=True))
    assert all(np.array_equal(x, y) for x, y in zip(a.output_hashes, b.output_hashes, strict=True))
    assert not np.array_equal(a.arrival_s, c.arrival_s)
