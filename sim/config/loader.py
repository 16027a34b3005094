"""Load a run config: YAML, ``--set`` overrides, profile resolution, validation.

Loading has no side effects. Every failure is a :class:`ConfigError` naming the file, the
key path, the value and what was expected.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sim.config.base import deep_merge
from sim.config.errors import config_error, suggest
from sim.config.hardware import HardwareSpec
from sim.config.model import ModelSpec
from sim.config.run import RunConfig
from sim.errors import ConfigError

PROFILE_PACKAGES = {"hardware": "hardware_profiles", "model": "model_profiles"}


def read_yaml(path: str | Path) -> Any:
    """Parse one YAML file; syntax errors name the file and line."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", source=str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"expected YAML text (UTF-8), got byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start}",
            source=str(path),
        ) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # NOTE: a SafeLoader
    except DuplicateKeyError as exc:
        raise ConfigError(str(exc), source=f"{path}:{exc.line}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid YAML: {problem}", source=where) from None


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names the same key twice (YAML would silently keep the last)."""

    def __init__(self, key: object, line: int, first: int):
        super().__init__(
            f"duplicate key {key!r} (first given on line {first}); expected each key once"
        )
        self.line = line


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a mapping with a repeated key."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(key, line, seen[key])
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def profile_dir(section: str) -> Path:
    """Folder of the bundled profiles for ``hardware`` or ``model``."""
    return Path(str(files(PROFILE_PACKAGES[section])))


def profile_names(section: str) -> list[str]:
    """Names of the bundled profiles (``calibrated/NAME`` included)."""
    root = profile_dir(section)
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def load_profile(section: str, name: str) -> dict[str, Any]:
    """The raw mapping of a named profile."""
    path = profile_dir(section) / f"{name}.yaml"
    if not path.is_file():
        known = profile_names(section)
        raise ConfigError(
            f"unknown {section} profile {name!r}{suggest(name, known)}; known: {', '.join(known)}",
            key=section,
        )
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("a profile must be a mapping", source=str(path))
    return data


def resolve_profile(section: str, value: Any) -> Any:
    """A profile name, or ``{profile: NAME, ...overrides}``, becomes the full mapping."""
    if isinstance(value, str):
        return load_profile(section, value)
    if isinstance(value, Mapping) and "profile" in value:
        overrides = {k: v for k, v in value.items() if k != "profile"}
        return deep_merge(load_profile(section, str(value["profile"])), overrides)
    return value


def parse_override(text: str) -> tuple[list[str], Any]:
    """``engine.max_num_seqs=64`` -> (['engine', 'max_num_seqs'], 64)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects KEY=VALUE, got {text!r}")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_override(data: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``data[path...] = value``, turning a profile name into ``{profile: name}`` on the way."""
    node = data
    for depth, key in enumerate(path[:-1]):
        child = node.get(key)
        if isinstance(child, str) and depth == 0 and key in PROFILE_PACKAGES:
            child = {"profile": child}
        elif not isinstance(child, dict):
            if child is not None:
                dotted = ".".join(path[: depth + 1])
                raise ConfigError(f"cannot set a key inside {child!r}", key=dotted)
            child = {}
        node[key] = child
        node = child
    node[path[-1]] = value


def build_config(data: Any, source: str = "<config>", overrides: Iterable[str] = ()) -> RunConfig:
    """Validate a raw mapping (plus ``--set`` overrides) into a :class:`RunConfig`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{EXPECTED_MAPPING}, got {_kind_of(data)}", source=source)
    data = copy.deepcopy(data)
    parsed = [parse_override(text) for text in overrides]
    try:
        for path, value in parsed:
            apply_override(data, path, value)
        for section in PROFILE_PACKAGES:
            if section in data:
                data[section] = resolve_profile(section, data[section])
        _resolve_group_hardware(data)
    except ConfigError as error:
        raise error.at(source) from None
    return validate(RunConfig, data, source)


def _resolve_group_hardware(data: dict[str, Any]) -> None:
    """Each cluster group's ``hardware`` profile name (or ``{profile: ...}``) as a mapping."""
    cluster = data.get("cluster")
    groups = cluster.get("groups") if isinstance(cluster, dict) else None
    for i, group in enumerate(groups if isinstance(groups, list) else []):
        if isinstance(group, dict) and group.get("hardware") is not None:
            try:
                group["hardware"] = resolve_profile("hardware", group["hardware"])
            except ConfigError as error:
                raise ConfigError(error.message, key=f"cluster.groups.{i}.hardware") from None


EXPECTED_MAPPING = (
    "expected a run config: a YAML mapping of seed, model, hardware, workload, engine, kv"
)


def _kind_of(data: Any) -> str:
    """What a YAML document holds, for messages: 'an empty file', 'a list', ..."""
    if data is None:
        return "an empty file"
    return {list: "a list", str: "a string"}.get(type(data), f"a {type(data).__name__}")


def validate(schema: type[BaseModel], data: Any, source: str) -> Any:
    """``schema.model_validate(data)`` with errors turned into one ConfigError."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise config_error(schema, exc, source) from None


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> RunConfig:
    """Read, override, resolve and validate one run config file."""
    return build_config(read_yaml(path), str(path), overrides)


def load_model(name: str) -> ModelSpec:
    """A bundled model profile by name."""
    return validate(ModelSpec, load_profile("model", name), f"model_profiles/{name}.yaml")


def load_hardware(name: str) -> HardwareSpec:
    """A bundled hardware profile by name."""
    return validate(HardwareSpec, load_profile("hardware", name), f"hardware_profiles/{name}.yaml")


def set_by_run(config: RunConfig, key: str) -> bool:
    """Whether the run gave ``key`` (a dotted path such as ``hardware.hbm.capacity``) itself,
    rather than leaving it to a default or to the bundled profile it names.

    Messages blame such a key: it is the one the user wrote.
    """
    section, *path = key.split(".")
    node: Any = getattr(config, section)
    if section in PROFILE_PACKAGES:
        if node.name not in profile_names(section):
            return True  # an inline profile: the run wrote every key
        loader = load_hardware if section == "hardware" else load_model
        base: Any = loader(node.name)
        for name in path:
            node, base = getattr(node, name), getattr(base, name)
        return node != base
    for name in path[:-1]:
        node = getattr(node, name)
    return path[-1] in node.model_fields_set


def dump_config(config: RunConfig) -> str:
    """The resolved config as YAML, every default filled in (SI units)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
