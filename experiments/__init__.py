"""Sweeps over run configs, their result store, and the figures drawn from run files.

``experiments.load(DIR)`` reads a sweep's ``results.parquet`` into pandas.
"""

from __future__ import annotations

from experiments.store import load

__all__ = ["load"]
