"""Multi-turn chat sessions: each turn's prompt is the whole history plus a new message.

Session s's token sequence is append-only: [system prompt][user 0][answer 0][user 1]...
Turn t's prompt is the sequence up to and including user message t, so its blocks are
turn t-1's prompt and answer blocks plus new ones; the hashes say so (``hashing``).
"""

from __future__ import annotations

import numpy as np

from sim.config.workload import MultiTurnWorkload
from sim.errors import KvsimError
from sim.workload import hashing
from sim.workload.context import WorkloadContext
from sim.workload.distributions import draw_arrivals, draw_durations, draw_lengths
from sim.workload.requests import Requests


def segment_cumsum(values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Inclusive running sums of ``values`` restarting at each segment (segments contiguous)."""
    total = np.cumsum(values)
    before = np.repeat(total[starts] - values[starts], counts)
    return total - before


def generate_multi_turn(spec: MultiTurnWorkload, context: WorkloadContext) -> Requests:
    """Sessions of turns in arrival order, with prefix and output hashes."""
    starts_rng, turns_rng, user_rng, output_rng, think_rng, system_rng = context.generators(6)
    sessions = spec.num_sessions
    start = draw_arrivals(spec.session_arrival, sessions, starts_rng)
    turns = draw_lengths(spec.turns, sessions, turns_rng)
    variant = system_rng.integers(0, spec.system_prompts, size=sessions)
    total = int(turns.sum())
    first = np.cumsum(turns) - turns
    session = np.repeat(np.arange(sessions), turns)
    turn = np.arange(total) - first[session]

    user = draw_lengths(spec.user_tokens, total, user_rng)
    output = draw_lengths(spec.output_tokens, total, output_rng)
    think = draw_durations(spec.think_time, total, think_rng)
    think[turn == 0] = 0.0
    arrival = start[session] + segment_cumsum(think, first, turns)
    exchanged = segment_cumsum(user + output, first, turns) - (user + output)
    prompt = spec.system_prompt_tokens + exchanged + user

    keep = np.ones(total, dtype=bool)
    if spec.max_context_tokens is not None:
        over = (prompt + output > spec.max_context_tokens).astype(np.int64)
        keep = segment_cumsum(over, first, turns) == 0  # a session ends before its first overflow
    if not keep.any():
        raise KvsimError(
            "workload: every session's first turn exceeds max_context_tokens "
            f"({spec.max_context_tokens}); raise it or shorten the prompts"
        )
    order = np.flatnonzero(keep)[np.argsort(arrival[keep], kind="stable")]
    session, turn, prompt, output = session[order], turn[order], prompt[order], output[order]
    prefix, generated = _session_hashes(
        session, variant[session], prompt, output, spec.system_prompt_tokens, context.block_tokens
    )
    return Requests(
        arrival_s=arrival[order],
        prompt_tokens=prompt,
        output_tokens=output,
        session=session,
        prefix_hashes=prefix,
        turn=turn,
        output_hashes=generated,
    )


def _session_hashes(
    session: np.ndarray,
    variant: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    system_tokens: int,
    block_tokens: int,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each request is [system prompt (shared by variant)][the session's own tokens]."""
    system_chain = hashing.chain(hashing.SYSTEM, variant)
    system = np.full(len(prompt), system_tokens)
    return hashing.shared_then_own(system_chain, system, session, prompt, output, block_tokens)
