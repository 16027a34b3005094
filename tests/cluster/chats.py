"""The multi-turn chat the cluster tests run: Llama-3-8B / H100, shared system prompts,
growing histories."""

from __future__ import annotations


def chat(sessions: int = 40, rate: float = 2.0, **extra) -> dict:
    """A run config of ``sessions`` conversations arriving at ``rate`` per second."""
    return {
        "seed": 3,
        "model": "llama-3-8b",
        "hardware": "h100-sxm",
        "workload": {
            "preset": "multi-turn-chat",
            "num_sessions": sessions,
            "session_arrival": {"kind": "poisson", "rate": rate},
            "think_time": {"kind": "exponential", "mean": 2.0},
        },
        **extra,
    }
