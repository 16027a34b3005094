"""docs/config.md is generated from the schema: it must be current and cover every key."""

from __future__ import annotations

import importlib.util
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, Field, create_model

from sim.config.run import RunConfig

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_config_doc", ROOT / "scripts/gen_config_doc.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # NOTE: its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _keys(cls: type[BaseModel], seen: set) -> set[str]:
    """Every field name of every schema class reachable from ``cls`` (a plain walk)."""
    if cls in seen:
        return set()
    seen.add(cls)
    names = {info.alias or name for name, info in cls.model_fields.items()}
    stack = [info.annotation for info in cls.model_fields.values()]
    while stack:
        tp = stack.pop()
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            names |= _keys(tp, seen)
        else:
            stack.extend(typing.get_args(tp))
    return names


def test_config_doc_is_current():
    text = _generator().render()
    assert (ROOT / "docs/config.md").read_text() == text, (
        "docs/config.md is out of date: run python scripts/gen_config_doc.py"
    )


def test_every_schema_key_has_a_row():
    text = (ROOT / "docs/config.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in text.splitlines()
            if line.startswith("| `")}  # fmt: skip
    missing = _keys(RunConfig, set()) - rows
    assert not missing, f"keys without a row in docs/config.md: {sorted(missing)}"


def test_a_new_key_changes_the_document(monkeypatch):
    gen = _generator()
    before = gen.render()
    engine = RunConfig.model_fields["engine"].annotation
    grown = create_model(
        "EngineConfig", __base__=engine, spare_knob=(int, Field(3, description="a new knob"))
    )
    patched = create_model("RunConfig", __base__=RunConfig, engine=(grown, grown()))
    monkeypatch.setattr(gen, "RunConfig", patched)
    after = gen.render()
    assert after != before
    assert "| `spare_knob` | int |  | `3` | a new knob |" in after


def test_a_key_without_a_meaning_is_an_error(monkeypatch):
    gen = _generator()
    engine = RunConfig.model_fields["engine"].annotation
    grown = create_model("EngineConfig", __base__=engine, undocumented=(int, 1))
    patched = create_model("RunConfig", __base__=RunConfig, engine=(grown, grown()))
    monkeypatch.setattr(gen, "RunConfig", patched)
    with pytest.raises(ValueError, match=r"no description for EngineConfig.undocumented"):
        gen.render()
