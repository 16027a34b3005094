"""The workload seam: every source (generator or trace loader) yields a :class:`Requests`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.errors import KvsimError


@dataclass(frozen=True)
class Requests:
    """A request table in arrival order (structure of arrays).

    Attributes:
        arrival_s: arrival times, seconds, non-decreasing.
        prompt_tokens: prompt length of each request (> 0).
        output_tokens: tokens each request generates (> 0).
        session: conversation id per request, or -1 (optional).
        prefix_hashes: per request, the hashes of its prompt's full blocks at the
            simulator's block size (equal hash = equal prefix up to that block), or None
            when the source carries no prefix identity.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    session: np.ndarray | None = None
    prefix_hashes: list[np.ndarray] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "output_tokens"):
            if len(getattr(self, name)) != n:
                raise KvsimError(
                    f"workload: {name} has {len(getattr(self, name))} rows, expected {n}"
                )
        if n == 0:
            raise KvsimError("workload: no requests")
        if np.any(np.diff(self.arrival_s) < 0):
            raise KvsimError("workload: arrival times must be non-decreasing")
        if np.any(self.prompt_tokens <= 0) or np.any(self.output_tokens <= 0):
            raise KvsimError("workload: prompt and output lengths must be positive")

    def __len__(self) -> int:
        return len(self.arrival_s)
