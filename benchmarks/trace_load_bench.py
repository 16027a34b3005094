"""Load time of the real traces (the 12k-row Mooncake trace should load in well under 1 s).

python benchmarks/trace_load_bench.py
"""

from __future__ import annotations

import time

from sim.config.workload import TraceWorkload
from sim.workload import build_requests
from sim.workload.trace import traces_root

TRACES = [
    ("mooncake", "mooncake_fast25_conversation_trace.jsonl"),
    ("mooncake", "mooncake_fast25_synthetic_trace.jsonl"),
    ("azure", "azure_llm_2023_conv.csv"),
    ("azure", "azure_llm_2023_code.csv"),
]


def main() -> None:
    """Print the best of three load times of each trace."""
    root = traces_root()
    if root is None:
        raise SystemExit("no traces folder: set KVSIM_TRACES")
    print(f"{'trace':<45} {'requests':>9} {'best of 3 (s)':>14}")
    for fmt, name in TRACES:
        spec = TraceWorkload(kind="trace", format=fmt, path=name)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            requests = build_requests(spec, 0, root, 16)
            times.append(time.perf_counter() - start)
        print(f"{name:<45} {len(requests):>9} {min(times):>14.3f}")


if __name__ == "__main__":
    main()
