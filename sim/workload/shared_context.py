"""Multi-tenant queries on shared contexts: customers, their users, and the users' sessions.

Customer c's requests all start with its context (a document or system prompt), then carry
the user session's own tokens: request = [context c][query 0][answer 0][query 1] ... up to
its own query. Requests of one customer share the context's blocks; two customers share
none (their chains differ from the first block); a session's turn t hits turn t-1's prompt
and answer blocks, as in ``multi_turn``.

Arrivals follow the arrival process, whoever sends them: request i picks a customer
(Zipf) and one of its users (uniform), and is that user's next turn. A user's requests,
in arrival order, fall into consecutive sessions of ``turns`` turns each (drawn per
session); each session gets its own id (in order of its first request), which the
``session`` router keeps on one instance.
"""

from __future__ import annotations

import numpy as np

from sim.config.workload import SharedContextWorkload
from sim.workload import hashing
from sim.workload.context import WorkloadContext
from sim.workload.distributions import Length, draw_arrivals, draw_lengths
from sim.workload.documents import zipf_weights
from sim.workload.requests import Requests
from sim.workload.sessions import segment_cumsum


def generate_shared_context(spec: SharedContextWorkload, context: WorkloadContext) -> Requests:
    """Queries of Zipf-popular customers' users, with prefix and output hashes."""
    rngs = context.generators(7)
    arrival_rng, context_rng, customer_rng, user_rng, query_rng, output_rng, turns_rng = rngs
    n, customers = spec.num_requests, spec.customers
    context_tokens = draw_lengths(spec.context_tokens, customers, context_rng)
    customer = customer_rng.choice(customers, size=n, p=zipf_weights(customers, spec.zipf_s))
    user = customer * spec.users_per_customer + user_rng.integers(
        0, spec.users_per_customer, size=n
    )
    query = draw_lengths(spec.query_tokens, n, query_rng)
    output = draw_lengths(spec.output_tokens, n, output_rng)
    session, turn, history = user_sessions(user, query + output, spec.turns, turns_rng)
    prompt = context_tokens[customer] + history + query
    prefix, generated = _hashes(
        customer, session, context_tokens[customer], prompt, output, context.block_tokens
    )
    return Requests(
        arrival_s=draw_arrivals(spec.arrival, n, arrival_rng),
        prompt_tokens=prompt,
        output_tokens=output,
        session=session,
        prefix_hashes=prefix,
        turn=turn,
        output_hashes=generated,
    )


def user_sessions(
    user: np.ndarray, exchanged: np.ndarray, turns: Length, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each request's session id, turn and history tokens, requests in arrival order.

    A user's requests (in order) split into consecutive sessions whose lengths are drawn
    from ``turns``; a turn's history is the ``exchanged`` tokens (query + answer) of its
    session's earlier turns. Session ids count sessions in order of their first request.

    Returns:
        (session, turn, history), one value per request.
    """
    n = len(user)
    order = np.argsort(user, kind="stable")  # by user; a user's requests in arrival order
    _, first, counts = np.unique(user[order], return_index=True, return_counts=True)
    slot_user = np.repeat(np.arange(len(first)), counts)  # the user (dense) of each slot
    lengths = draw_lengths(turns, n, rng)  # the k-th slot of a user: its k-th session's length
    session_start = segment_cumsum(lengths, first, counts) - lengths
    starts = session_start < counts[slot_user]
    is_start = np.zeros(n, dtype=bool)
    is_start[first[slot_user[starts]] + session_start[starts]] = True
    start_slot = np.flatnonzero(is_start)
    group = np.cumsum(is_start) - 1  # the session (sorted by user, then start) of each slot
    turn_sorted = np.arange(n) - start_slot[group]
    sizes = np.diff(np.append(start_slot, n))
    spent = exchanged[order]
    history_sorted = segment_cumsum(spent, start_slot, sizes) - spent
    ids = np.empty(len(start_slot), dtype=np.int64)
    ids[np.argsort(order[start_slot], kind="stable")] = np.arange(len(start_slot))
    session, turn, history = (np.empty(n, dtype=np.int64) for _ in range(3))
    session[order], turn[order], history[order] = ids[group], turn_sorted, history_sorted
    return session, turn, history


def _hashes(
    customer: np.ndarray,
    session: np.ndarray,
    context_tokens: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    block_tokens: int,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each request is [its customer's context][its session's own tokens]."""
    context_chain = hashing.chain(hashing.CONTEXT, customer)
    return hashing.shared_then_own(
        context_chain, context_tokens, session, prompt, output, block_tokens
    )
