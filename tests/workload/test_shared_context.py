"""The multi-tenant workload (``shared_context``): customers' contexts, users' sessions."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest

from sim.config import build_config
from sim.errors import ConfigError
from sim.workload import Requests
from sim.workload.context import WorkloadContext
from sim.workload.distributions import draw_lengths
from tests.conftest import BASE
from tests.workload.test_generators import assert_hashes_mean_equal_prefixes, token_identities
from tests.workload.workload_helpers import build, workload

SHARED = {
    "kind": "shared_context",
    "num_requests": 300,
    "arrival": {"kind": "poisson", "rate": 5.0},
    "customers": 4,
    "users_per_customer": 3,
    "context_tokens": {"kind": "uniform", "min": 40, "max": 300},
    "query_tokens": {"kind": "uniform", "min": 1, "max": 40},
    "output_tokens": {"kind": "uniform", "min": 1, "max": 30},
    "turns": 3,
}


def drawn_tenants(spec: dict, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(context length per customer, customer and user per request), redrawn from the
    generator's streams (2nd, 3rd and 4th of seven) by plain numpy calls."""
    rngs = WorkloadContext(seed).generators(7)
    spec_obj, n, customers = workload(spec), spec["num_requests"], spec["customers"]
    contexts = draw_lengths(spec_obj.context_tokens, customers, rngs[1])
    weights = 1.0 / np.arange(1, customers + 1) ** spec_obj.zipf_s
    customer = rngs[2].choice(customers, size=n, p=weights / weights.sum())
    users = spec["users_per_customer"]
    user = customer * users + rngs[3].integers(0, users, size=n)
    return contexts, customer, user


def test_one_user_hand_computed() -> None:
    """One customer, one user, fixed lengths: 7 queries in sessions of 3 turns, B = 16."""
    spec = {
        "kind": "shared_context", "num_requests": 7, "arrival": {"kind": "all_at_once"},
        "customers": 1, "users_per_customer": 1, "context_tokens": 100, "query_tokens": 20,
        "output_tokens": 10, "turns": 3,
    }  # fmt: skip
    requests = build(spec, block_tokens=16)
    assert requests.session.tolist() == [0, 0, 0, 1, 1, 1, 2]
    assert requests.turn.tolist() == [0, 1, 2, 0, 1, 2, 0]
    # turn t: 100 context + t * (20 + 10) history + 20 query
    assert requests.prompt_tokens.tolist() == [120, 150, 180, 120, 150, 180, 120]
    assert [len(h) for h in requests.prefix_hashes] == [7, 9, 11, 7, 9, 11, 7]  # prompt // 16
    # blocks filled while answering: (prompt + 10) // 16 - prompt // 16
    assert [len(h) for h in requests.output_hashes] == [1, 1, 0, 1, 1, 0, 1]  # 190 // 16 = 11
    first, second, fourth = (requests.prefix_hashes[r] for r in (0, 1, 3))
    history = np.concatenate([first, requests.output_hashes[0]])
    assert second[:8].tolist() == history.tolist()  # turn 1 starts with turn 0's 130 tokens
    assert fourth[:6].tolist() == first[:6].tolist()  # a new session: the 6 context blocks
    assert fourth[6] != first[6]  # block 6 holds tokens 96..111: context + its own query


def test_default_turns_make_every_query_new() -> None:
    spec = {k: v for k, v in SHARED.items() if k != "turns"}
    requests = build(spec)
    contexts, customer, _ = drawn_tenants(spec)
    assert requests.turn.tolist() == [0] * 300
    assert sorted(requests.session.tolist()) == list(range(300))
    query = requests.prompt_tokens - contexts[customer]
    assert query.min() >= 1 and query.max() <= 40  # prompt = context + query, no history


def reference_sessions(user: np.ndarray, exchanged: np.ndarray, turns: int):
    """Sessions by a plain loop: a user's k-th request is turn k % turns of its k // turns-th
    session; ids count sessions by first request; history = the session's earlier tokens."""
    seen: dict[int, int] = defaultdict(int)
    ids: dict[tuple[int, int], int] = {}
    spent: dict[int, int] = defaultdict(int)
    session, turn, history = [], [], []
    for u, tokens in zip(user.tolist(), exchanged.tolist(), strict=True):
        k = seen[u]
        seen[u] += 1
        sid = ids.setdefault((u, k // turns), len(ids))
        session.append(sid)
        turn.append(k % turns)
        history.append(spent[sid])
        spent[sid] += tokens
    return session, turn, history


def test_sessions_match_a_plain_loop() -> None:
    """Sessions, turns and prompts as a loop over the redrawn users and queries gives them."""
    requests = build(SHARED)
    contexts, customer, user = drawn_tenants(SHARED)
    query = draw_lengths(workload(SHARED).query_tokens, 300, WorkloadContext(0).generators(7)[4])
    session, turn, history = reference_sessions(user, query + requests.output_tokens, 3)
    assert requests.session.tolist() == session
    assert requests.turn.tolist() == turn
    assert requests.prompt_tokens.tolist() == (contexts[customer] + history + query).tolist()
    assert requests.turn.max() == 2 and len(set(session)) > 100


def test_drawn_turns_partition_each_users_requests() -> None:
    spec = SHARED | {"num_requests": 2000, "turns": {"kind": "uniform", "min": 2, "max": 5}}
    requests = build(spec)
    _, _, user = drawn_tenants(spec)
    for u in np.unique(user):
        rows = np.flatnonzero(user == u)
        sessions = requests.session[rows]
        cuts = np.flatnonzero(np.diff(sessions)) + 1  # a user's sessions are consecutive
        lengths = np.diff(np.concatenate([[0], cuts, [len(rows)]]))
        assert len(set(sessions.tolist())) == len(lengths)
        assert np.all((lengths[:-1] >= 2) & (lengths[:-1] <= 5)) and lengths[-1] <= 5
        for a, b in itertools.pairwise(np.concatenate([[0], cuts, [len(rows)]])):
            assert requests.turn[rows[a:b]].tolist() == list(range(b - a))
    firsts = [int(np.flatnonzero(requests.session == s)[0]) for s in range(requests.session.max())]
    assert firsts == sorted(firsts)  # ids in order of first request
    assert set(np.bincount(requests.session).tolist()) >= {2, 3, 4, 5}


def test_hashes_mean_equal_prefixes_brute_force() -> None:
    spec = SHARED | {"num_requests": 60}
    requests = build(spec, block_tokens=8)
    contexts, customer, _ = drawn_tenants(spec)

    def owner(r: int, p: int) -> tuple:
        c = int(customer[r])
        return ("context", c, p) if p < contexts[c] else ("session", int(requests.session[r]), p)

    assert_hashes_mean_equal_prefixes(requests, token_identities(requests, owner), 8)


def customer_hashes(requests: Requests, customer: np.ndarray) -> dict[int, set[int]]:
    """Every prefix and output hash of each customer's requests."""
    found: dict[int, set[int]] = defaultdict(set)
    for r, c in enumerate(customer.tolist()):
        found[c].update(requests.prefix_hashes[r].tolist())
        found[c].update(requests.output_hashes[r].tolist())
    return found


@pytest.mark.parametrize("block_tokens", [4, 16])
def test_a_customer_shares_its_context_and_no_other(block_tokens: int) -> None:
    requests = build(SHARED, block_tokens=block_tokens)
    contexts, customer, _ = drawn_tenants(SHARED)
    for c in range(4):
        rows = np.flatnonzero(customer == c)
        full = contexts[c] // block_tokens  # the context's full blocks
        heads = {tuple(requests.prefix_hashes[r][:full].tolist()) for r in rows}
        assert len(heads) == 1 and len(next(iter(heads))) == full > 0
    for a, b in itertools.combinations(customer_hashes(requests, customer).values(), 2):
        assert not a & b


def test_zipf_popularity_of_customers() -> None:
    spec = SHARED | {"num_requests": 20000, "customers": 3, "zipf_s": 1.0}
    requests = build(spec)
    first_block = np.array([h[0] for h in requests.prefix_hashes])
    _, counts = np.unique(first_block, return_counts=True)  # a customer by its first block
    shares = np.sort(counts)[::-1] / 20000
    assert shares == pytest.approx([6 / 11, 3 / 11, 2 / 11], abs=0.015)  # 1, 1/2, 1/3
    uniform = build(spec | {"zipf_s": 0.0})
    _, counts = np.unique([h[0] for h in uniform.prefix_hashes], return_counts=True)
    assert counts / 20000 == pytest.approx([1 / 3] * 3, abs=0.015)


def test_arrival_rate() -> None:
    spec = SHARED | {"num_requests": 20000, "arrival": {"kind": "poisson", "rate": 5.0}}
    arrival = build(spec).arrival_s
    assert arrival[0] == 0.0 and np.all(np.diff(arrival) >= 0)
    assert np.diff(arrival).mean() == pytest.approx(1 / 5.0, rel=0.03)  # 4 sigma: 0.7% each


def test_same_seed_same_table() -> None:
    a, b, c = build(SHARED, seed=3), build(SHARED, seed=3), build(SHARED, seed=4)
    for name in ("arrival_s", "prompt_tokens", "output_tokens", "session", "turn"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert all(np.array_equal(x, y) for x, y in zip(a.prefix_hashes, b.prefix_hashes, strict=True))
    assert all(np.array_equal(x, y) for x, y in zip(a.output_hashes, b.output_hashes, strict=True))
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"users": 3}, r"key 'workload.users': unknown key \(did you mean 'customers'\?\)"),
        ({"customers": 0}, r"key 'workload.customers': Input should be greater than 0 \(got 0\)"),
        ({"users_per_customer": None}, r"key 'workload.users_per_customer': required key"),
        ({"turns": {"kind": "uniform", "min": 3, "max": 2}}, r"'workload.turns': min \(3\) must"),
        ({"zipf_s": -1}, r"key 'workload.zipf_s': .*greater than or equal to 0 \(got -1\)"),
        ({"context_tokens": "long"}, r"key 'workload.context_tokens'"),
    ],
    ids=str,
)
def test_bad_keys_name_the_key(change: dict, message: str) -> None:
    spec = {k: v for k, v in (SHARED | change).items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        build_config(BASE | {"workload": spec}, "<test>")


def test_round_trip_and_runs_with_prefix_hits() -> None:
    """In a roomy HBM pool the run's hit rate is the infinite cache's (a loop over hashes)."""
    from sim.run import simulate
    from tests.workload.test_generators import hits

    small = SHARED | {"num_requests": 40, "customers": 2, "context_tokens": 1024}
    config = build_config(BASE | {"workload": small}, "<test>")
    assert build_config(config.model_dump(mode="json")) == config
    requests, cache, found = build(small), set(), 0
    for prefix, generated in zip(requests.prefix_hashes, requests.output_hashes, strict=True):
        found += hits(prefix, cache)
        cache.update(prefix.tolist() + generated.tolist())
    ideal = found / sum(map(len, requests.prefix_hashes))
    summary = simulate(config).summary
    assert summary["requests_finished"] == 40 and ideal > 0.9
    assert summary["hbm_hit_rate"] == pytest.approx(ideal, abs=0.01)
