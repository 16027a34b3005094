"""Helpers for workload tests: validate a workload mapping, build it, percentiles by hand."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from sim.config.workload import WorkloadConfig
from sim.workload import Requests, build_requests

_ADAPTER: TypeAdapter[Any] = TypeAdapter(WorkloadConfig)


def workload(data: Any) -> Any:
    """A validated ``workload`` section."""
    return _ADAPTER.validate_python(data)


def build(data: Any, base_dir: Path = Path("."), seed: int = 0, block_tokens: int = 16) -> Requests:
    """Validate and build a workload mapping."""
    return build_requests(workload(data), seed, base_dir, block_tokens)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile, written out (numpy's default method)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
