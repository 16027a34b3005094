"""Fixtures for the validation package's tests: the shared measured tables."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def measured_ops() -> Path:
    """Measured operator tables: $KVSIM_CALIBRATION, else ../shared/calibration; skip if absent."""
    root = Path(os.environ.get("KVSIM_CALIBRATION", REPO.parent / "shared" / "calibration"))
    folder = root / "measured-ops" if (root / "measured-ops").is_dir() else root
    if not (folder / "h100").is_dir() or not (folder / "a100").is_dir():
        pytest.skip(
            f"measured operator tables not found at {root} (set KVSIM_CALIBRATION to the folder "
            "holding measured-ops/h100 and measured-ops/a100)"
        )
    return folder
