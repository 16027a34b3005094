"""Block copies queued during a step and sent as one transfer per link and kind."""

from __future__ import annotations

import simpy

from sim.memory.links import Links


class CopyQueue:
    """Copies by (link, blocking); :meth:`flush` starts each queue as one batched transfer
    of block-sized pieces. Blocking copies hold up the next step (``blocking``)."""

    def __init__(self, links: Links, piece_bytes: float):
        self.links = links
        self.piece_bytes = piece_bytes
        self.queued: dict[tuple[str, bool], float] = {}
        self.blocking: list[simpy.Event] = []

    def add(self, link: str, nbytes: float, blocking: bool) -> None:
        """Queue ``nbytes`` on ``link`` (``d2h``, ``h2d``, ``ssd_read``, ``ssd_write``)."""
        key = (link, blocking)
        self.queued[key] = self.queued.get(key, 0.0) + nbytes

    def add_each(self, link: str, block_bytes: float, count: int, blocking: bool) -> None:
        """Queue ``count`` copies of ``block_bytes`` (the same float sum as one call each)."""
        if count == 0:
            return
        key = (link, blocking)
        total = self.queued.get(key, 0.0)
        for _ in range(count):
            total += block_bytes
        self.queued[key] = total

    def wait_for(self, event: simpy.Event) -> None:
        """The next step waits for ``event`` (a copy sent outside the queue)."""
        self.blocking.append(event)

    def flush(self) -> None:
        """Start the queued copies."""
        for (link, blocking), nbytes in self.queued.items():
            event = getattr(self.links, link).transfer(nbytes, self.piece_bytes)
            if blocking:
                self.blocking.append(event)
        self.queued = {}

    def take_blocking(self) -> list[simpy.Event]:
        """The copies the next step waits for (the queue of them is emptied)."""
        blocking, self.blocking = self.blocking, []
        return blocking
