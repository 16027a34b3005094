"""Workloads: a config's ``workload`` section becomes a :class:`Requests` table.

New sources (trace loaders) register a builder for their ``kind`` in ``BUILDERS``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.config.workload import SyntheticWorkload
from sim.workload.requests import Requests
from sim.workload.synthetic import generate_synthetic

Builder = Callable[[Any, int, Path], Requests]

BUILDERS: dict[str, Builder] = {
    "synthetic": lambda spec, seed, base_dir: generate_synthetic(spec, seed),
}


def build_requests(spec: SyntheticWorkload, seed: int, base_dir: Path = Path(".")) -> Requests:
    """The request table of a workload spec; ``base_dir`` resolves relative trace paths."""
    return BUILDERS[spec.kind](spec, seed, base_dir)


__all__ = ["BUILDERS", "Requests", "build_requests"]
