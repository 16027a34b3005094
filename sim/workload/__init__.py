"""Workloads: a config's ``workload`` section becomes a :class:`Requests` table.

Each source registers a builder ``(spec, context) -> Requests`` for its ``kind`` in
``BUILDERS``; the :class:`WorkloadContext` carries the seed, the folder that relative trace
paths resolve against, and the simulator's block size (for prefix hashes).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.workload.context import WorkloadContext
from sim.workload.documents import generate_documents
from sim.workload.fitted import generate_fitted
from sim.workload.requests import LoadReport, Requests
from sim.workload.sessions import generate_multi_turn
from sim.workload.shared_context import generate_shared_context
from sim.workload.synthetic import generate_synthetic
from sim.workload.trace import load_trace_requests

Builder = Callable[[Any, WorkloadContext], Requests]

BUILDERS: dict[str, Builder] = {
    "synthetic": generate_synthetic,
    "multi_turn": generate_multi_turn,
    "documents": generate_documents,
    "shared_context": generate_shared_context,
    "trace": load_trace_requests,
    "fitted": generate_fitted,
}

DEFAULT_BLOCK_TOKENS = 16  # EngineConfig's default block size


def build_requests(
    spec: Any, seed: int, base_dir: Path = Path("."), block_tokens: int = DEFAULT_BLOCK_TOKENS
) -> Requests:
    """The request table of a workload spec.

    Args:
        spec: the validated ``workload`` section.
        seed: the run seed.
        base_dir: folder relative trace paths resolve against (then ``$KVSIM_TRACES``).
        block_tokens: the simulator's block size, for prefix hashes.
    """
    return BUILDERS[spec.kind](spec, WorkloadContext(seed, Path(base_dir), block_tokens))


__all__ = ["BUILDERS", "LoadReport", "Requests", "WorkloadContext", "build_requests"]
