"""What a workload builder gets besides its spec: the seed, where paths resolve, block size."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class WorkloadContext:
    """The run-level facts a workload builder needs.

    Attributes:
        seed: the run seed; every random draw comes from Generators seeded by it.
        base_dir: folder that relative trace paths resolve against (the config's folder).
        block_tokens: the simulator's KV block size; prefix hashes are made at this size.
    """

    seed: int = 0
    base_dir: Path = Path(".")
    block_tokens: int = 16

    def generators(self, n: int, stream: int | None = None) -> list[np.random.Generator]:
        """``n`` independent Generators spawned from the run seed (same seed, same streams).

        ``stream`` names a separate family (e.g. trace selection inside a fitted workload),
        independent of the default one.
        """
        return spawn_generators(self.seed, n, stream)


def spawn_generators(seed: int, n: int, stream: int | None = None) -> list[np.random.Generator]:
    """``n`` Generators from ``seed``; a ``stream`` tag gives an independent family."""
    root = np.random.SeedSequence(seed, spawn_key=() if stream is None else (stream,))
    return [np.random.default_rng(s) for s in root.spawn(n)]
