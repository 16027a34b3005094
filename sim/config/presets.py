"""Named workload presets: ``workload: NAME`` or ``workload: {preset: NAME, ...overrides}``.

A preset is a plain mapping of one workload kind; overrides are merged into it key by key
(nested mappings recursively) before validation, so the resolved config shows every value.
"""

from __future__ import annotations

from typing import Any

from sim.config.errors import suggest


def _lognormal(mean: float, sigma: float, low: int, high: int) -> dict[str, Any]:
    return {"kind": "lognormal", "mean": mean, "sigma": sigma, "min": low, "max": high}


_CHAT_PROMPT = _lognormal(600, 0.9, 16, 8192)
_CHAT_OUTPUT = _lognormal(250, 0.8, 4, 2048)

PRESETS: dict[str, dict[str, Any]] = {
    # Independent short chat requests behind one shared system prompt.
    "short-chat": {
        "kind": "synthetic",
        "num_requests": 1000,
        "arrival": {"kind": "poisson", "rate": 10.0},
        "prompt_tokens": _CHAT_PROMPT,
        "output_tokens": _CHAT_OUTPUT,
        "shared_prefix_tokens": 256,
    },
    # Long documents, each summarised about once: prefill-heavy, little sharing.
    "long-doc-summary": {
        "kind": "documents",
        "num_requests": 200,
        "arrival": {"kind": "poisson", "rate": 0.5},
        "num_documents": 200,
        "zipf_s": 0.0,
        "document_tokens": _lognormal(12000, 0.6, 2000, 60000),
        "question_tokens": 32,
        "output_tokens": _lognormal(400, 0.4, 64, 1024),
        "system_prompt_tokens": 128,
    },
    # Many questions on a few long documents (RAG / long-document QA).
    "doc-qa": {
        "kind": "documents",
        "num_requests": 1000,
        "arrival": {"kind": "poisson", "rate": 4.0},
        "num_documents": 20,
        "zipf_s": 1.0,
        "document_tokens": _lognormal(8000, 0.5, 1000, 32000),
        "question_tokens": _lognormal(60, 0.5, 8, 512),
        "output_tokens": _lognormal(200, 0.6, 8, 1024),
        "system_prompt_tokens": 256,
    },
    # Chat sessions: each turn resends the whole history (prefix reuse across turns).
    "multi-turn-chat": {
        "kind": "multi_turn",
        "num_sessions": 200,
        "session_arrival": {"kind": "poisson", "rate": 1.0},
        "turns": _lognormal(5, 0.6, 1, 20),
        "think_time": {"kind": "exponential", "mean": 20.0},
        "user_tokens": _lognormal(150, 0.8, 4, 2048),
        "output_tokens": _CHAT_OUTPUT,
        "system_prompt_tokens": 1024,
        "system_prompts": 4,
        "max_context_tokens": 32768,
    },
    # Chat requests in on/off bursts: 5 s at 40 req/s, then 25 s at 2 req/s (mean 8 req/s).
    "bursty": {
        "kind": "synthetic",
        "num_requests": 2000,
        "arrival": {"kind": "on_off", "rate_on": 40.0, "rate_off": 2.0, "on_s": 5.0, "off_s": 25.0},
        "prompt_tokens": _CHAT_PROMPT,
        "output_tokens": _CHAT_OUTPUT,
        "shared_prefix_tokens": 256,
    },
}  # fmt: skip


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid on ``base``; a nested mapping whose ``kind`` changes is replaced whole."""
    merged = dict(base)
    for key, value in over.items():
        old = merged.get(key)
        if (
            isinstance(old, dict)
            and isinstance(value, dict)
            and value.get("kind", old.get("kind")) == old.get("kind")
        ):
            merged[key] = merge(old, value)
        else:
            merged[key] = value
    return merged


def expand_preset(value: str | dict[str, Any]) -> dict[str, Any]:
    """The preset's mapping with the overrides in ``value`` merged in."""
    overrides = {} if isinstance(value, str) else {k: v for k, v in value.items() if k != "preset"}
    name = value if isinstance(value, str) else value["preset"]
    if name not in PRESETS:
        known = ", ".join(PRESETS)
        raise ValueError(
            f"unknown workload preset {name!r}{suggest(str(name), list(PRESETS))}; known: {known}"
        )
    return merge(PRESETS[name], overrides)
