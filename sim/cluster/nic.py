"""The timeline's NIC columns of a cluster run: each instance-step's bytes in and out."""

from __future__ import annotations

import numpy as np

from sim.memory.links import Link


class NicColumns:
    """A step observer: the bytes an instance's NIC delivered in and out since its last
    step (``nic_in_bytes``, ``nic_out_bytes``), one entry per timeline row. Steps taken in
    runs ahead of the clock (no pool, no disaggregation: the NIC carries nothing) get 0."""

    def __init__(self, nic_in: Link, nic_out: Link):
        self.nic_in, self.nic_out = nic_in, nic_out
        self.rows: list[tuple[float, float]] = []
        self._mark = (0.0, 0.0)

    def step_ended(self, row: dict[str, float]) -> None:
        now = (self.nic_in.bytes_delivered, self.nic_out.bytes_delivered)
        self.rows.append((now[0] - self._mark[0], now[1] - self._mark[1]))
        self._mark = now

    def steps_ended(self, rows: dict[str, float | np.ndarray], steps: int) -> None:
        self.step_ended({})
        self.rows += [(0.0, 0.0)] * (steps - 1)

    def columns(self) -> dict[str, np.ndarray]:
        """``nic_in_bytes`` and ``nic_out_bytes``, one value per step."""
        table = np.asarray(self.rows, dtype=np.float64).reshape(-1, 2)
        return {"nic_in_bytes": table[:, 0], "nic_out_bytes": table[:, 1]}
