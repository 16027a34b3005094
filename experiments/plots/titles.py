"""Default figure titles: the models, hardware and KV modes of the runs a figure draws.

They are read from each run's ``config.resolved.yaml``: ``llama-3-70b fp8 · h100-sxm ·
kv.mode=hbm/dram_centric sparse``. A facet with more than three values is counted instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

CONFIG = "config.resolved.yaml"
MAX_NAMED = 3
FACETS = (("model", "models"), ("hardware", "GPUs"), ("mode", "KV modes"))
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read(path: Path) -> dict[str, Any]:
    with path.open() as handle:
        data = yaml.load(handle, Loader=_LOADER)  # NOTE: a safe loader (C if available)
    return data if isinstance(data, dict) else {}


def run_facets(run_dir: str | Path) -> dict[str, str]:
    """``model`` (name, and dtype unless bf16), ``hardware`` and ``mode`` (kv.mode, and the
    access kind unless full) of a run; empty for a run without its resolved config."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        return {}
    config = _read(path)
    model, kv = config.get("model") or {}, config.get("kv") or {}
    dtype = model.get("dtype")
    access = (kv.get("access") or {}).get("kind", "full")
    facets = {
        "model": f"{model.get('name', '?')}{'' if dtype in (None, 'bf16') else f' {dtype}'}",
        "hardware": str((config.get("hardware") or {}).get("name", "?")),
        "mode": f"{kv.get('mode', '?')}{'' if access == 'full' else f' {access}'}",
    }
    return facets


def describe(run_dirs: Iterable[str | Path]) -> str:
    """``llama-3-8b · h100-sxm · kv.mode=hbm``: each facet's values over the runs."""
    seen: dict[str, dict[str, None]] = {facet: {} for facet, _ in FACETS}
    for run_dir in run_dirs:
        for facet, value in run_facets(run_dir).items():
            seen[facet][value] = None
    parts = []
    for facet, noun in FACETS:
        values = list(seen[facet])
        if not values:
            continue
        text = "/".join(values) if len(values) <= MAX_NAMED else f"{len(values)} {noun}"
        parts.append(f"kv.mode={text}" if facet == "mode" and len(values) <= MAX_NAMED else text)
    return " · ".join(parts)


def joined(*parts: str) -> str:
    """Non-empty parts joined by an em dash (a panel's label and the runs' description)."""
    return " — ".join(p for p in parts if p)
