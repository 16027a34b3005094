"""Where measured tables are found: a path as given, under the working directory, or under
the calibration root (``$KVSIM_CALIBRATION``, else ``shared/calibration`` beside the checkout)."""

from __future__ import annotations

import os
from pathlib import Path

CALIBRATION_ENV = "KVSIM_CALIBRATION"


def calibration_root() -> Path | None:
    """``$KVSIM_CALIBRATION``, else the ``shared/calibration`` folder beside this checkout."""
    env = os.environ.get(CALIBRATION_ENV)
    if env:
        return Path(env).expanduser()
    beside = Path(__file__).resolve().parents[3] / "shared" / "calibration"
    return beside if beside.is_dir() else None


def resolve_table_path(path: str) -> Path:
    """``path`` if absolute, else under the working directory, else under the calibration root.

    Raises:
        ValueError: naming every place looked at (a config validator turns it into the
            ConfigError of ``hardware.cost_table``).
    """
    given = Path(path).expanduser()
    candidates = [given] if given.is_absolute() else [Path.cwd() / given]
    root = calibration_root()
    if root is not None and not given.is_absolute():
        candidates.append(root / given)
    for candidate in candidates:
        if candidate.exists():
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    raise ValueError(
        f"measured tables {path!r} not found (looked at {looked}); expected a long-format "
        f"CSV/parquet from 'kvsim calibrate --device' or a folder of Vidur mlp.csv tables "
        f"(set ${CALIBRATION_ENV} to the folder holding them)"
    )
