"""Sweeps over run configs, their result store, and the figures drawn from run files.

``experiments.load(DIR)`` reads a sweep's ``results.parquet`` into pandas.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load"]


def __getattr__(name: str) -> Any:
    """``load`` on first use: importing the package (for its ``kvsim`` commands) stays quick."""
    if name == "load":
        from experiments.store import load

        return load
    raise AttributeError(f"module 'experiments' has no attribute {name!r}")
