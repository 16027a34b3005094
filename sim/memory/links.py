"""Host links as fluid-shared resources: concurrent transfers split a direction's bandwidth.

Each :class:`Link` is one direction (H2D, D2H, DRAM->SSD, SSD->DRAM). A transfer first pays
the per-transfer latency, then joins the active set; every active transfer progresses at
``bandwidth / n_active``. Rates are recomputed whenever a transfer joins or leaves, and one
completion timer (the earliest finish) is rescheduled; stale timers are ignored. A copy made
of contiguous chunks of ``s`` bytes puts ``nbytes / chunk_efficiency(s)`` bytes' worth of link
time on the link (:func:`chunk_efficiency`): small chunks are slower, and that time is shared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

import simpy

from sim.config.hardware import Direction, HardwareSpec

_DONE_BYTES = 1e-3  # bytes left below which a transfer counts as delivered (float rounding)


def chunk_efficiency(chunk_bytes: float, half_efficiency_bytes: float, blend: float = 1.0) -> float:
    """Fraction of the link's bandwidth that copies of ``chunk_bytes`` contiguous bytes get:
    ``1 / (1 + (h/s)^p)^(1/p)``; with ``p = blend = 1``, ``s / (s + h)``."""
    if half_efficiency_bytes <= 0 or chunk_bytes <= 0:
        return 1.0
    if blend == 1.0:
        return chunk_bytes / (chunk_bytes + half_efficiency_bytes)
    return (1.0 + (half_efficiency_bytes / chunk_bytes) ** blend) ** (-1.0 / blend)


@dataclass
class _Transfer:
    remaining: float
    done: simpy.Event
    nbytes: float


@dataclass
class Link:
    """One direction of a link with fluid fair sharing; counts bytes and busy time."""

    env: simpy.Environment
    name: str
    bandwidth: float
    latency: float = 0.0
    half_efficiency_bytes: float = 0.0
    blend: float = 1.0
    bytes_submitted: float = 0.0
    bytes_delivered: float = 0.0
    busy_s: float = 0.0
    _active: dict[int, _Transfer] = field(default_factory=dict)
    _ids: count = field(default_factory=count)
    _last: float = 0.0
    _version: int = 0

    def transfer(
        self, nbytes: float, chunk_bytes: float | None = None, latencies: int = 1
    ) -> simpy.Event:
        """Start moving ``nbytes``; the returned event fires when the last byte arrives.

        ``chunk_bytes`` is the size of each contiguous piece (small pieces are slower);
        ``latencies`` is how many per-transfer latencies the copy pays (one per call).
        """
        done = self.env.event()
        self.bytes_submitted += nbytes
        efficiency = chunk_efficiency(chunk_bytes or nbytes, self.half_efficiency_bytes, self.blend)
        wire = nbytes / efficiency
        job = _Transfer(remaining=wire, done=done, nbytes=nbytes)
        delay = self.latency * latencies
        if nbytes <= 0:
            self._finish(job)
        elif delay > 0:
            self.env.timeout(delay).callbacks.append(lambda _: self._join(job))
        else:
            self._join(job)
        return done

    @property
    def in_flight(self) -> int:
        """Transfers sharing the link now."""
        return len(self._active)

    @property
    def bytes_on_the_wire(self) -> float:
        """Bytes of the transfers that joined the link, counted as submitted (the invariants
        check that delivered + these never exceed what was submitted)."""
        return sum(job.nbytes for job in self._active.values())

    def _advance(self) -> None:
        now = self.env.now
        elapsed = now - self._last
        if self._active and elapsed > 0:
            share = elapsed * self.bandwidth / len(self._active)
            for job in self._active.values():
                job.remaining -= share
            self.busy_s += elapsed
        self._last = now

    def _join(self, job: _Transfer) -> None:
        self._advance()
        self._active[next(self._ids)] = job
        self._reschedule()

    def _finish(self, job: _Transfer) -> None:
        self.bytes_delivered += job.nbytes
        job.done.succeed()

    def _reschedule(self) -> None:
        self._version += 1
        if not self._active:
            return
        version = self._version
        first = min(job.remaining for job in self._active.values())
        due = [k for k, job in self._active.items() if job.remaining <= first + _DONE_BYTES]
        delay = max(first, 0.0) * len(self._active) / self.bandwidth
        self.env.timeout(delay).callbacks.append(lambda _: self._on_timer(version, due))

    def _on_timer(self, version: int, due: list[int]) -> None:
        if version != self._version:
            return
        self._advance()
        # the due transfers are done by construction: float residue must not keep them alive
        for key in due:
            self._finish(self._active.pop(key))
        for key in [k for k, job in self._active.items() if job.remaining <= _DONE_BYTES]:
            self._finish(self._active.pop(key))
        self._reschedule()


@dataclass
class Links:
    """All directions: host-to-device, device-to-host, SSD reads and writes."""

    h2d: Link
    d2h: Link
    ssd_read: Link
    ssd_write: Link

    @classmethod
    def from_hardware(cls, env: simpy.Environment, hw: HardwareSpec) -> Links:
        """Links with the profile's bandwidths, latencies and chunk efficiency (each
        direction's as its copier moves the bytes: ``hardware.link.copy_path``)."""
        link, ssd = hw.link, hw.ssd

        def host(direction: Direction) -> Link:
            bandwidth, half, blend = link.copy_path(direction)
            return Link(env, direction, bandwidth, link.latency, half, blend)

        return cls(
            h2d=host("h2d"),
            d2h=host("d2h"),
            ssd_read=Link(env, "ssd_read", ssd.read, ssd.latency),
            ssd_write=Link(env, "ssd_write", ssd.write, ssd.latency),
        )

    def all(self) -> tuple[Link, ...]:
        """Every direction."""
        return (self.h2d, self.d2h, self.ssd_read, self.ssd_write)
