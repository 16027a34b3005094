"""Sweep files: a base config plus axes over key paths, expanded into points.

A sweep file is a YAML mapping::

    base: quickstart.yaml          # a run config, relative to this file (or an inline mapping)
    set: {kv.mode: offload}        # optional: constants laid on the base
    grid: {kv.eviction: [lru, s3fifo], hardware: [h100-sxm, h200-sxm]}   # cartesian product
    zip: {workload.num_requests: [1, 8], workload.prompt_tokens: [512, 8192]}  # varied together
    exclude: [{hardware: h100-sxm, kv.eviction: s3fifo}]   # optional: drop matching points
    seeds: [0, 1, 2]               # optional: every point once per seed

``zip`` may also be a list of such mappings (each group varies together; groups cross).
Points are ordered grid (first key slowest), then zip rows, then seeds. Each point's id is a
hash of its resolved config, so it does not depend on axis order or spelling.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sim.config.loader import apply_override, build_config, read_yaml
from sim.config.run import RunConfig
from sim.errors import ConfigError, KvsimError

SWEEP_KEYS = ("base", "set", "grid", "zip", "exclude", "seeds")
ID_LENGTH = 12
MAX_LISTED = 3  # points named per distinct error


@dataclass(frozen=True)
class Point:
    """One configuration of a sweep: its axis values, seed, resolved config and stable id."""

    index: int
    point_id: str
    params: dict[str, Any]
    seed: int
    config: RunConfig = field(repr=False, compare=False)
    base_dir: Path = field(default=Path("."), compare=False)

    @property
    def label(self) -> str:
        """``kv.mode=hbm, seed=0``: the point's axis values, for messages."""
        return params_label(self.params, self.seed)


@dataclass(frozen=True)
class Sweep:
    """An expanded sweep: axis key paths (in column order) and the points, in run order."""

    source: str
    axes: tuple[str, ...]
    points: tuple[Point, ...]


def format_value(value: Any) -> str:
    """An axis value as one short string (mappings and lists as compact JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping | list):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def params_label(params: Mapping[str, Any], seed: int) -> str:
    """``kv.mode=hbm, seed=0``: axis values and seed as one string."""
    return ", ".join([*(f"{k}={format_value(v)}" for k, v in params.items()), f"seed={seed}"])


def point_id(config: RunConfig) -> str:
    """The stable id of a resolved config: a SHA-256 prefix of its canonical JSON.

    ``engine.check`` is left out: checking invariants does not change a point's results.
    """
    data = config.model_dump(mode="json")
    data["engine"].pop("check", None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:ID_LENGTH]


def with_checks(sweep: Sweep) -> Sweep:
    """The sweep with ``engine.check: true`` at every point (same point ids)."""
    points = tuple(
        replace(p, config=p.config.model_copy(
            update={"engine": p.config.engine.model_copy(update={"check": True})}
        ))
        for p in sweep.points
    )  # fmt: skip
    return replace(sweep, points=points)


def check_fits(config: RunConfig) -> None:
    """Raise the start-up ConfigError of a point: a cost table that cannot price its model,
    or a model that leaves no HBM for KV (as ``sim.cluster.Cluster`` would)."""
    from sim.cost import cost_model_for
    from sim.memory.hbm_plan import plan_hbm

    plan_hbm(config, cost_model_for(config))


# --- reading the sweep file ---------------------------------------------------------------


def _check_path(path: Any, key: str, source: str) -> None:
    """A key path is a non-empty dotted string (``engine.max_num_seqs``)."""
    if not isinstance(path, str) or not path or any(not p for p in path.split(".")):
        raise ConfigError(f"expected a dotted key path, got {path!r}", source=source, key=key)


def _axes(raw: Any, key: str, source: str) -> dict[str, list[Any]]:
    """A ``grid`` or ``zip`` mapping of key path -> non-empty list of values."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(
            "expected a mapping of key path -> list of values", source=source, key=key
        )
    axes: dict[str, list[Any]] = {}
    for path, values in raw.items():
        _check_path(path, key, source)
        where = f"{key}.{path}"
        if path == "seed" or path.startswith("seed."):
            raise ConfigError("vary the seed with 'seeds: [...]'", source=source, key=where)
        if not isinstance(values, list) or not values:
            raise ConfigError(
                f"expected a non-empty list, got {values!r}", source=source, key=where
            )
        axes[path] = values
    return axes


def _zip_groups(raw: Any, source: str) -> list[dict[str, list[Any]]]:
    """``zip``: one mapping (one group) or a list of mappings; lists in a group align."""
    groups = raw if isinstance(raw, list) else [raw]
    out = []
    for i, group in enumerate(groups):
        key = "zip" if not isinstance(raw, list) else f"zip[{i}]"
        axes = _axes(group, key, source)
        lengths = {path: len(values) for path, values in axes.items()}
        if len(set(lengths.values())) > 1:
            sizes = ", ".join(f"{p}: {n}" for p, n in lengths.items())
            raise ConfigError(
                f"lists varied together must have one length; got {sizes}", source=source, key=key
            )
        if axes:
            out.append(axes)
    return out


def _seeds(raw: Any, source: str) -> list[int] | None:
    """``seeds``: distinct integers >= 0 (None when absent: the base's seed)."""
    if raw is None:
        return None
    ints = isinstance(raw, list) and all(type(s) is int for s in raw)
    if not ints or not raw or min(raw) < 0 or len(set(raw)) != len(raw):
        raise ConfigError(
            f"expected a list of distinct integers >= 0, got {raw!r}", source=source, key="seeds"
        )
    return list(raw)


def _base(raw: Any, sweep_path: Path, source: str) -> tuple[dict[str, Any], Path, str]:
    """The base mapping, the folder its trace paths resolve against, and its name."""
    if isinstance(raw, str):
        path = sweep_path.parent / raw
        if not path.is_file():
            raise ConfigError(
                f"cannot read file {raw!r}: not found at {path}; expected a run config path "
                "relative to the sweep file, or an inline mapping",
                source=source,
                key="base",
            )
        data = read_yaml(path)
        if not isinstance(data, dict):
            raise ConfigError("expected a run config (a YAML mapping)", source=str(path))
        return data, path.parent, str(path)
    if isinstance(raw, Mapping):
        return dict(raw), sweep_path.parent, source
    raise ConfigError(
        f"expected a run config path or an inline mapping, got {raw!r}", source=source, key="base"
    )


def _excludes(raw: Any, axes: list[str], source: str) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(e, Mapping) and e for e in raw):
        raise ConfigError("expected a list of {axis: value} mappings", source=source, key="exclude")
    for entry in raw:
        for path in entry:
            if path not in axes:
                raise ConfigError(
                    f"{path!r} is not an axis; axes: {', '.join(axes)}",
                    source=source,
                    key="exclude",
                )
    return [dict(e) for e in raw]


def _constants(raw: Any, source: str) -> dict[str, Any]:
    """``set``: key path -> one value, laid on the base before the axes."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError("expected a mapping of key path -> value", source=source, key="set")
    for path in raw:
        _check_path(path, "set", source)
    return dict(raw)


def _excluded(params: Mapping[str, Any], excludes: list[dict[str, Any]]) -> bool:
    return any(all(params[k] == v for k, v in entry.items()) for entry in excludes)


def _combinations(
    grid: dict[str, list[Any]], zips: list[dict[str, list[Any]]]
) -> Iterator[dict[str, Any]]:
    """Axis values of every point: the grid's product crossed with each zip group's rows."""
    dims: list[list[dict[str, Any]]] = [[{k: v} for v in vs] for k, vs in grid.items()]
    for group in zips:
        rows = zip(*group.values(), strict=True)
        dims.append([dict(zip(group, row, strict=True)) for row in rows])
    for combo in itertools.product(*dims):
        yield {k: v for part in combo for k, v in part.items()}


def _apply(data: dict[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with each key path set (shorter paths first, so a profile name comes first)."""
    data = copy.deepcopy(data)
    for path in sorted(values, key=lambda p: p.count(".")):
        apply_override(data, path.split("."), copy.deepcopy(values[path]))
    return data


def load_sweep(path: str | Path) -> Sweep:
    """Read, expand and validate a sweep file; every invalid point is reported in one error."""
    path = Path(path)
    raw = read_yaml(path)
    return expand(raw, path)


def expand(raw: Any, path: Path) -> Sweep:
    """Expand a parsed sweep mapping (``path`` locates relative files and names errors)."""
    source = str(path)
    if not isinstance(raw, Mapping):
        raise ConfigError("a sweep file must be a YAML mapping", source=source)
    unknown = [k for k in raw if k not in SWEEP_KEYS]
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r}; expected: {', '.join(SWEEP_KEYS)}", source=source
        )
    if "base" not in raw:
        raise ConfigError("missing 'base' (a run config path or mapping)", source=source)
    base, base_dir, base_name = _base(raw["base"], path, source)
    base = _apply(base, _constants(raw.get("set"), source))
    grid = _axes(raw.get("grid"), "grid", source)
    zips = _zip_groups(raw.get("zip"), source)
    axes = [*grid, *(k for group in zips for k in group)]
    repeated = sorted({a for a in axes if axes.count(a) > 1})
    if repeated:
        raise ConfigError(f"axis {repeated[0]!r} appears twice in grid/zip", source=source)
    excludes = _excludes(raw.get("exclude"), axes, source)
    seeds = _seeds(raw.get("seeds"), source)
    combos = [p for p in _combinations(grid, zips) if not _excluded(p, excludes)]
    return _resolve(source, (base, base_dir, base_name), axes, combos, seeds)


def _resolve(
    source: str,
    base: tuple[dict[str, Any], Path, str],
    axes: list[str],
    combos: list[dict[str, Any]],
    seeds: list[int] | None,
) -> Sweep:
    """Build every point's config; collect all errors, then raise them together."""
    if not combos:
        raise ConfigError("the sweep has no points (every combination is excluded)", source=source)
    data0, base_dir, base_name = base
    points: list[Point] = []
    errors: dict[str, list[str]] = {}
    seen: dict[str, Point] = {}
    index = -1
    for params in combos:
        for seed in seeds if seeds is not None else [None]:
            index += 1
            data = _apply(data0, params)
            if seed is not None:
                data["seed"] = seed
            try:
                config = build_config(data, base_name)
                check_fits(config)
            except KvsimError as error:
                where = f"#{index} {params_label(params, data.get('seed', 0))}"
                errors.setdefault(_error_text(error), []).append(where)
                continue
            point = Point(index, point_id(config), params, config.seed, config, base_dir)
            other = seen.setdefault(point.point_id, point)
            if other is not point:
                text = f"resolves to the same config as #{other.index} ({other.label})"
                errors.setdefault(text, []).append(f"#{index} {point.label}")
                continue
            points.append(point)
    if errors:
        raise ConfigError(_error_report(errors, index + 1), source=source)
    return Sweep(source, tuple(axes), tuple(points))


def _error_text(error: KvsimError) -> str:
    """An error without its source (the sweep file names it): ``key 'k': message``."""
    if isinstance(error, ConfigError):
        return f"key '{error.key}': {error.message}" if error.key else error.message
    return str(error)


def _error_report(errors: dict[str, list[str]], total: int) -> str:
    """All invalid points, grouped by error: what is wrong and which points it hits."""
    bad = sum(len(v) for v in errors.values())
    lines = [f"{bad} of {total} points are invalid; nothing was run:"]
    for text, where in errors.items():
        lines.append(f"  {text} ({len(where)} point{'s' if len(where) > 1 else ''}):")
        lines.extend(f"    {w}" for w in where[:MAX_LISTED])
        if len(where) > MAX_LISTED:
            lines.append(f"    ... and {len(where) - MAX_LISTED} more")
    return "\n".join(lines)
