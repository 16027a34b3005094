"""Timing as the field does it: warm-up, synchronised clocks (CUDA events on a GPU), median.

On the CPU the clock is the calling thread's CPU time (``time.thread_time``): with torch
pinned to one thread every operator runs on that thread, and time the core spends on
other processes of a shared machine is not counted (it is, on a wall clock, and made CPU
timings here swing by 2x). Callers rotate their inputs (buffers together larger than the
caches, fresh random data) through the repeat index the timed function receives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

DEFAULT_CACHE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Timing:
    """Statistics of repeated runs of one operation (seconds)."""

    median_s: float
    min_s: float
    p10_s: float
    p90_s: float
    std_s: float
    repeats: int

    @classmethod
    def of(cls, samples: np.ndarray) -> Timing:
        """Statistics of ``samples``."""
        return cls(
            float(np.median(samples)),
            float(np.min(samples)),
            float(np.quantile(samples, 0.1)),
            float(np.quantile(samples, 0.9)),
            float(np.std(samples)),
            len(samples),
        )


def cache_bytes(device: str) -> int:
    """Last-level cache size of the device (CPU: sysfs L3; GPU: L2), or 64 MiB."""
    if device.startswith("cuda"):
        return int(
            getattr(torch.cuda.get_device_properties(0), "L2_cache_size", DEFAULT_CACHE_BYTES)
        )
    path = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
    try:
        text = path.read_text().strip()
    except OSError:
        return DEFAULT_CACHE_BYTES
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1], 1)
    return int(text.rstrip("KMG")) * scale


def rotation(item_bytes: int, device: str, most: int) -> int:
    """How many copies of an input of ``item_bytes`` together exceed twice the cache."""
    return int(min(max(-(-2 * cache_bytes(device) // max(item_bytes, 1)), 1), most))


def statistic(device: str) -> str:
    """Which summary of repeats the fits use: the median on a GPU, the minimum on the CPU.

    Interference on a shared CPU (other processes, an SMT sibling) only ever adds time, and
    comes and goes: the minimum over repeats is the steadiest estimate of an operation's
    own time there, while a GPU's repeats scatter symmetrically around their median.
    """
    return "median" if device.startswith("cuda") else "min"


def clock(device: str) -> Callable[[], float]:
    """The clock of ``device``: wall time on a GPU (callers synchronise), thread time on a CPU."""
    return time.perf_counter if device.startswith("cuda") else time.thread_time


def measure(
    fn: Callable[[int], object], device: str, repeats: int, warmup: int = 2, budget_s: float = 1.0
) -> Timing:
    """Time ``fn(i)`` for ``i = 0, 1, ...``: ``warmup`` untimed calls, then up to ``repeats``.

    Stops early (at least 3 repeats) once ``budget_s`` of measured time is spent.
    """
    cuda = device.startswith("cuda")
    for i in range(warmup):
        fn(i)
    if cuda:
        torch.cuda.synchronize()
    samples: list[float] = []
    for i in range(warmup, warmup + repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(i)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e-3)
        else:
            t0 = time.thread_time()
            fn(i)
            samples.append(time.thread_time() - t0)
        if len(samples) >= 3 and sum(samples) > budget_s:
            break
    return Timing.of(np.asarray(samples))
