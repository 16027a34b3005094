"""Short readable labels for a sweep axis' values: legend entries, panel titles, ticks.

A mapping reads as its ``kind`` (a trace or fitted workload adds its file's stem:
``trace: mooncake_fast25_conversation_trace``; a preset its name); ``cluster.kv_pool`` reads
``no pool`` (null) or ``pool 1 TiB`` (its capacity); any other value is its compact text
(:func:`experiments.sweep.format_value`). Outside ``workload`` and ``cluster.kv_pool``, whose
values say what they are, a label names its axis (``engine.max_num_seqs=64``) unless asked
bare (tick labels). Where two values of an axis would read alike, each adds the top-level
keys in which they differ (``pool 1 TiB (bandwidth=100GB/s)``); a label longer than
:data:`MAX_LABEL` characters is cut, and labels that are still alike are numbered.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath
from typing import Any

from experiments.sweep import format_value
from sim.units import BYTES

MAX_LABEL = 48
POOL = "cluster.kv_pool"
WORKLOAD = "workload"
SELF_NAMED = (POOL, WORKLOAD)  # axes whose labels say what they are


def parse(text: str) -> Any:
    """An axis value back from its results-table text (mappings and lists are JSON there,
    null is ``None``); other text as it is."""
    if text == "None":
        return None
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _capacity(value: Any) -> str:
    """A size as written with a space (``1TiB`` -> ``1 TiB``); a bare number in binary units."""
    written = BYTES.written(value)
    if written is None:
        return format_value(value)
    number, unit = written
    return f"{number:g} {unit}" if unit else BYTES.format(number)


def _workload(value: Mapping[str, Any]) -> str:
    """``shared_context``; ``trace: FILE_STEM`` for a trace or fitted workload; a preset's name."""
    if "preset" in value:
        return str(value["preset"])
    source = value.get("from")
    path = value.get("path") or (source.get("path") if isinstance(source, Mapping) else None)
    kind = str(value.get("kind", "?"))
    return f"{kind}: {PurePosixPath(str(path)).stem}" if path else kind


def _base(axis: str, value: Any) -> str:
    """The label of one value before telling alike values apart."""
    if axis == POOL and value is None:
        return "no pool"
    if isinstance(value, Mapping):
        if axis == POOL and "capacity" in value:
            return f"pool {_capacity(value['capacity'])}"
        if axis == WORKLOAD:
            return _workload(value)
        if "kind" in value:
            return str(value["kind"])
    return format_value(value)


def _differences(value: Any, alike: list[Any]) -> str:
    """The top-level keys in which ``value`` differs from the values labelled like it."""
    if not all(isinstance(v, Mapping) for v in alike):
        return format_value(value)
    keys = sorted({k for v in alike for k in v})
    differ = [k for k in keys if len({format_value(v.get(k)) for v in alike}) > 1]
    return ", ".join(f"{k}={format_value(value.get(k))}" for k in differ)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def value_labels(axis: str, values: Iterable[Any], named: bool = True) -> dict[str, str]:
    """A label for each distinct value of ``axis``, keyed by its text (``format_value``);
    ``named``: prefix ``AXIS=`` where the label does not say what it is."""
    texts = list(dict.fromkeys(format_value(v) for v in values))
    parsed = {t: parse(t) for t in texts}
    base = {t: _base(axis, parsed[t]) for t in texts}
    labels = {}
    for text in texts:
        alike = [parsed[t] for t in texts if base[t] == base[text]]
        extra = _differences(parsed[text], alike) if len(alike) > 1 else ""
        label = f"{base[text]} ({extra})" if extra else base[text]
        labels[text] = label if axis in SELF_NAMED or not named else f"{axis}={label}"
    labels = {t: _cut(label) for t, label in labels.items()}
    counts = list(labels.values())
    return {
        t: f"{label} #{i + 1}" if counts.count(label) > 1 else label
        for i, (t, label) in enumerate(labels.items())
    }
