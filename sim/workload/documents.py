"""Shared-document workloads (RAG, long-document QA): many questions on a few documents.

A request's sequence is [system prompt][document d][question + answer, its own]; requests
on the same document share its blocks, all requests share the system prompt's blocks.
"""

from __future__ import annotations

import numpy as np

from sim.config.workload import DocumentsWorkload
from sim.workload import hashing
from sim.workload.context import WorkloadContext
from sim.workload.distributions import draw_arrivals, draw_lengths
from sim.workload.requests import Requests


def zipf_weights(n: int, s: float) -> np.ndarray:
    """Probabilities proportional to 1 / (rank + 1) ** s for ranks 0 .. n-1."""
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return weights / weights.sum()


def generate_documents(spec: DocumentsWorkload, context: WorkloadContext) -> Requests:
    """Questions on Zipf-popular documents, with prefix and output hashes."""
    arrival_rng, doc_rng, choice_rng, question_rng, output_rng = context.generators(5)
    n = spec.num_requests
    doc_tokens = draw_lengths(spec.document_tokens, spec.num_documents, doc_rng)
    doc = choice_rng.choice(
        spec.num_documents, size=n, p=zipf_weights(spec.num_documents, spec.zipf_s)
    )
    question = draw_lengths(spec.question_tokens, n, question_rng)
    output = draw_lengths(spec.output_tokens, n, output_rng)
    system = spec.system_prompt_tokens
    prompt = system + doc_tokens[doc] + question

    system_chain = hashing.chain(hashing.SYSTEM, 0)
    doc_chain = hashing.combine(hashing.combine(system_chain, hashing.DOCUMENT), doc)
    own_chain = hashing.combine(hashing.combine(doc_chain, hashing.REQUEST), np.arange(n))
    seg_row = np.repeat(np.arange(n), 3)
    seg_tokens = np.column_stack([np.full(n, system), doc_tokens[doc], question + output])
    seg_chain = np.column_stack([np.broadcast_to(system_chain, (n,)), doc_chain, own_chain])
    prefix, generated = hashing.sequence_hashes(
        seg_row, seg_tokens.ravel(), seg_chain.ravel(), prompt, output, context.block_tokens
    )
    return Requests(
        arrival_s=draw_arrivals(spec.arrival, n, arrival_rng),
        prompt_tokens=prompt,
        output_tokens=output,
        prefix_hashes=prefix,
        output_hashes=generated,
    )
