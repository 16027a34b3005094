"""Synthetic workloads: drawn arrivals and lengths, every draw from a seeded Generator."""

from __future__ import annotations

import numpy as np

from sim.config.workload import SyntheticWorkload
from sim.workload import hashing
from sim.workload.context import WorkloadContext
from sim.workload.distributions import draw_arrivals, draw_lengths
from sim.workload.requests import Requests


def generate_synthetic(spec: SyntheticWorkload, context: WorkloadContext) -> Requests:
    """Independent requests; separate random streams for arrivals, prompts and outputs."""
    arrivals, prompts, outputs = context.generators(3)
    n = spec.num_requests
    prompt = draw_lengths(spec.prompt_tokens, n, prompts)
    output = draw_lengths(spec.output_tokens, n, outputs)
    prefix = output_hashes = None
    if spec.shared_prefix_tokens > 0:
        prefix, output_hashes = _shared_prefix_hashes(
            prompt, output, spec.shared_prefix_tokens, context.block_tokens
        )
    return Requests(
        arrival_s=draw_arrivals(spec.arrival, n, arrivals),
        prompt_tokens=prompt,
        output_tokens=output,
        prefix_hashes=prefix,
        output_hashes=output_hashes,
    )


def _shared_prefix_hashes(
    prompt: np.ndarray, output: np.ndarray, shared: int, block_tokens: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Hashes of [shared prefix][rest of the request, unique to it]."""
    n = len(prompt)
    head = np.minimum(prompt, shared)
    seg_row = np.repeat(np.arange(n), 2)
    seg_tokens = np.column_stack([head, prompt + output - head]).ravel()
    shared_chain = hashing.chain(hashing.SYSTEM, 0)
    own_chain = hashing.combine(hashing.combine(shared_chain, hashing.REQUEST), np.arange(n))
    seg_chain = np.column_stack([np.broadcast_to(shared_chain, (n,)), own_chain]).ravel()
    return hashing.sequence_hashes(seg_row, seg_tokens, seg_chain, prompt, output, block_tokens)
