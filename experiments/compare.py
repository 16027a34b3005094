"""``kvsim compare``: the ``summary.json`` of runs side by side, with differences.

A column per run (named by its folder), a row per summary key; each run after the first
shows its difference from the first, absolute and in percent. Works on ``kvsim run``
directories and on sweep point folders (``DIR/points/ID``) alike.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import KvsimError
from sim.units import format_bytes

SUMMARY = "summary.json"
HEADLINE = (
    "requests_finished", "requests_rejected", "output_tokens_per_s", "requests_per_s",
    "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s",
    "hbm_reuse_hit_rate", "dram_reuse_hit_rate", "ssd_reuse_hit_rate",
    "hbm_hit_rate", "dram_hit_rate", "ssd_hit_rate",
    "hbm_peak_bytes", "hbm_kv_peak_bytes", "kv_pool_bytes",
    "preemptions", "stall_s", "sim_time_s", "overloaded",
)  # fmt: skip
COLUMNS = ("key", "run", "value", "delta", "percent")


def _read_summary(folder: Path) -> dict[str, Any]:
    path = folder / SUMMARY
    if not path.is_file():
        sweep = (folder / "sweep.json").is_file()
        hint = f"; it is a sweep directory: compare its points ({folder}/points/ID)"
        raise KvsimError(
            f"{folder}: no {SUMMARY}; expected a run directory written by 'kvsim run' or a "
            f"sweep point folder{hint if sweep else ''}"
        )
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise KvsimError(f"{path}: not valid JSON ({error.msg}, line {error.lineno})") from None
    if not isinstance(summary, dict):
        kind = type(summary).__name__
        raise KvsimError(f"{path}: expected a mapping of summary keys, got a JSON {kind}")
    return summary


def run_names(folders: Sequence[Path]) -> list[str]:
    """Each folder's name; names two folders share take parent folders until they differ."""
    depth = [1] * len(folders)
    while True:
        names = ["/".join(f.parts[-d:]) for f, d in zip(folders, depth, strict=True)]
        shared = {n for n in names if names.count(n) > 1}
        longer = [
            i for i, n in enumerate(names) if n in shared and depth[i] < len(folders[i].parts)
        ]
        if not longer:
            break
        for i in longer:
            depth[i] += 1
    seen: dict[str, int] = {}
    for i, name in enumerate(names):  # NOTE: the same folder given twice
        seen[name] = seen.get(name, 0) + 1
        names[i] = name if seen[name] == 1 else f"{name}#{seen[name]}"
    return names


def _keys(summaries: list[dict[str, Any]], keys: Sequence[str] | None) -> list[str]:
    present = list(dict.fromkeys(k for s in summaries for k in s))
    if keys is None:
        return [k for k in HEADLINE if k in present]
    unknown = [k for k in keys if k not in present]
    if unknown:
        raise KvsimError(
            f"--keys {','.join(unknown)}: in no run's {SUMMARY}; keys: {', '.join(present)}"
        )
    return list(keys)


def _number(value: Any) -> float | None:
    """A summary value as a number to subtract (not booleans, mappings or nulls)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def compare(folders: Sequence[str | Path], keys: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per key and run: ``key``, ``run``, ``value`` (as in its ``summary.json``;
    ``None`` where it lacks the key), and for numbers the ``delta`` from the first run and
    that as a ``percent`` of the first run's value (NaN where it is 0 or not a number)."""
    if not folders:
        raise KvsimError("compare needs at least one run directory")
    paths = [Path(f) for f in folders]
    summaries = [_read_summary(p) for p in paths]
    names = run_names(paths)
    rows = []
    for key in _keys(summaries, keys):
        base = _number(summaries[0].get(key))
        for name, summary in zip(names, summaries, strict=True):
            value = summary.get(key)
            number = _number(value)
            delta = number - base if number is not None and base is not None else math.nan
            percent = delta / abs(base) * 100 if base else math.nan
            rows.append((key, name, value, delta, percent))
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table["value"] = pd.Series([row[2] for row in rows], dtype=object)  # NOTE: ints stay ints
    table.attrs["runs"] = names
    return table


def _seconds(value: float) -> str:
    if abs(value) < 1:
        return f"{value * 1e3:.1f} ms"
    return f"{value:,.2f} s" if abs(value) < 1000 else f"{value:,.0f} s"


def show(key: str, value: Any) -> str:
    """A summary value, readable: ``52.1 ms``, ``1.50 GiB``, ``23.4%``, ``2,465.0/s``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict | list | str):
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if key.endswith("_rate"):
        return f"{value:.1%}"
    if key.endswith("_bytes"):
        return format_bytes(value)
    if key.endswith("_per_s"):
        return f"{value:,.1f}/s"
    if key.endswith("_s"):
        return _seconds(value)
    whole = isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e15)
    return f"{int(value):,d}" if whole else f"{value:,.4g}"


def show_delta(key: str, delta: float, percent: float) -> str:
    """A difference in the key's unit (rates in percentage points), and in percent."""
    if math.isnan(delta):
        return ""
    if delta == 0:
        return "(=)"
    sign = "+" if delta > 0 else "-"
    if key.endswith("_rate"):
        text = f"{delta * 100:+.1f} pp"
    elif key.endswith(("_bytes", "_s")) and not key.endswith("_per_s"):
        text = sign + show(key, abs(delta))
    else:
        text = sign + show(key, abs(delta)).lstrip("-")
    return f"({text}, {percent:+.1f}%)" if not math.isnan(percent) else f"({text})"


def format_table(table: pd.DataFrame) -> str:
    """The comparison as aligned text: a row per key, a column per run."""
    names = table.attrs["runs"]
    header = ["key", *names]
    lines = [header]
    for key, rows in table.groupby("key", sort=False):
        cells = [str(key)]
        for i, row in enumerate(rows.itertuples()):
            text = show(str(key), row.value)
            change = show_delta(str(key), row.delta, row.percent) if i else ""
            cells.append(f"{text} {change}".rstrip())
        lines.append(cells)
    widths = [max(len(line[c]) for line in lines) for c in range(len(header))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
           for line in lines]  # fmt: skip
    note = f"differences against {names[0]}" if len(names) > 1 else ""
    return "\n".join([*out, *([note] if note else [])])
