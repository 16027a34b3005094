"""Write a run's files: the resolved config, summary, requests and timeline tables."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from sim.config.loader import dump_config
from sim.engine import RunResult

RUN_FILES = ("config.resolved.yaml", "summary.json", "requests.parquet", "timeline.parquet")


def _json_safe(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def write_run(result: RunResult, out: str | Path) -> Path:
    """Write the run directory atomically (a temporary sibling renamed into place)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    (tmp / "config.resolved.yaml").write_text(dump_config(result.config))
    (tmp / "summary.json").write_text(json.dumps(_json_safe(result.summary), indent=2) + "\n")
    result.requests.to_parquet(tmp / "requests.parquet", index=False)
    result.timeline.to_parquet(tmp / "timeline.parquet", index=False)
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        os.replace(out, old)
        os.replace(tmp, out)
        for path in old.iterdir():
            path.unlink()
        old.rmdir()
    else:
        os.replace(tmp, out)
    return out
