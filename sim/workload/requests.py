"""The workload seam: every source (generator or trace loader) yields a :class:`Requests`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from sim.errors import KvsimError


@dataclass(frozen=True)
class LoadReport:
    """How a trace file became requests: rows read, and how many each step dropped."""

    path: str
    rows_in_file: int
    bad_rows_skipped: int = 0
    failed_requests_dropped: int = 0
    filtered_out: int = 0
    outside_time_window: int = 0
    sampled_out: int = 0
    beyond_max_requests: int = 0
    requests: int = 0

    def as_dict(self) -> dict[str, int | str]:
        """The report as a plain dict (for ``summary.json``)."""
        return asdict(self)


@dataclass(frozen=True)
class Requests:
    """A request table in arrival order (structure of arrays).

    Attributes:
        arrival_s: arrival times, seconds, non-decreasing.
        prompt_tokens: prompt length of each request (> 0).
        output_tokens: tokens each request generates (> 0).
        session: conversation id per request, or -1 (optional).
        prefix_hashes: per request, the hashes (uint64) of its prompt's full blocks at the
            simulator's block size (equal hash = equal prefix up to that block), or None
            when the source carries no prefix identity.
        turn: turn number within the session, 0 first (optional).
        output_hashes: per request, the hashes of the blocks that fill up while it generates
            (blocks ``prompt // B`` .. ``(prompt + output) // B - 1`` of its sequence), so a
            later turn can hit its history's generated blocks; None when unknown.
        report: for trace sources, what was read and what was dropped (optional).
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    session: np.ndarray | None = None
    prefix_hashes: list[np.ndarray] | None = field(default=None, repr=False)
    turn: np.ndarray | None = None
    output_hashes: list[np.ndarray] | None = field(default=None, repr=False)
    report: LoadReport | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "output_tokens", "session", "prefix_hashes", "turn"):
            column = getattr(self, name)
            if column is not None and len(column) != n:
                raise KvsimError(f"workload: {name} has {len(column)} rows, expected {n}")
        if self.output_hashes is not None and len(self.output_hashes) != n:
            raise KvsimError(
                f"workload: output_hashes has {len(self.output_hashes)} rows, expected {n}"
            )
        if n == 0:
            raise KvsimError("workload: no requests")
        if np.any(np.diff(self.arrival_s) < 0):
            raise KvsimError("workload: arrival times must be non-decreasing")
        if np.any(self.prompt_tokens <= 0) or np.any(self.output_tokens <= 0):
            raise KvsimError("workload: prompt and output lengths must be positive")

    def __len__(self) -> int:
        return len(self.arrival_s)
