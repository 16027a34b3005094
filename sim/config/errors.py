"""Pydantic validation errors as one message: file, key path, value and what was expected."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from sim.errors import ConfigError


class KeyedValueError(ValueError):
    """A section's validator blaming one key inside it (``key``, dotted, relative to the
    section), so that the message names the key the user wrote, not the whole section."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated and Optional from a field annotation."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _members(annotation: Any) -> tuple[Any, ...]:
    annotation = _unwrap(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(_unwrap(a) for a in typing.get_args(annotation))
    return (annotation,)


def _tagged_member(annotation: Any, tag: str) -> type[BaseModel] | None:
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            kind = member.model_fields.get("kind")
            if kind is not None and tag in typing.get_args(kind.annotation):
                return member
    return None


def _walk(root: type[BaseModel], loc: tuple[Any, ...]) -> tuple[str, list[str]]:
    """The dotted key path of ``loc`` (union tags dropped) and the known keys at its parent."""
    path: list[str] = []
    current: Any = root
    known: list[str] = list(root.model_fields)
    for item in loc:
        model = next(
            (m for m in _members(current) if isinstance(m, type) and issubclass(m, BaseModel)),
            None,
        )
        if isinstance(item, str) and model is not None and item in model.model_fields:
            known = list(model.model_fields)
            path.append(item)
            current = model.model_fields[item].annotation
        elif isinstance(item, str) and (tagged := _tagged_member(current, item)) is not None:
            current = tagged
        elif isinstance(item, int):
            path[-1:] = [f"{path[-1]}[{item}]"] if path else [f"[{item}]"]
            args = typing.get_args(_unwrap(current))
            current = args[0] if args else Any
        else:
            if model is not None:
                known = list(model.model_fields)
            path.append(str(item))
            current = Any
    return ".".join(path), known


def suggest(name: str, known: list[str]) -> str:
    """A ' (did you mean 'x'?)' hint, or ''."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _describe(root: type[BaseModel], error: dict[str, Any]) -> str:
    key, known = _walk(root, tuple(error["loc"]))
    value = error.get("input")
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, KeyedValueError):
        key = ".".join(part for part in (key, cause.key) if part)
        value = _inside(value, cause.key)
    if error["type"] == "extra_forbidden":
        leaf = key.rsplit(".", 1)[-1]
        expected = ", ".join(sorted(k for k in known if k != "kind"))
        return f"key '{key}': unknown key{suggest(leaf, known)}; expected one of: {expected}"
    if error["type"] == "missing":
        return f"key '{key}': required key is missing"
    message = error["msg"].removeprefix("Value error, ")
    if key and "got " not in message:  # NOTE: unit and policy messages already show the value
        message = f"{message} (got {_shown(value)})"
    return f"key '{key}': {message}" if key else message


def _inside(data: Any, key: str) -> Any:
    """``data[a][b]`` for the key ``a.b`` (``data`` itself where it holds no such key)."""
    node = data
    for name in key.split("."):
        if not isinstance(node, dict) or name not in node:
            return data
        node = node[name]
    return node


def _shown(value: Any, limit: int = 80) -> str:
    """A value as the user wrote it: scalars by repr, mappings and lists in YAML flow style."""
    if isinstance(value, dict | list):
        text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6).strip()
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def config_error(root: type[BaseModel], error: ValidationError, source: str) -> ConfigError:
    """One ConfigError listing every problem pydantic found, one per line."""
    lines = [_describe(root, e) for e in error.errors(include_url=False)]
    return ConfigError("\n  ".join(lines), source=source)
