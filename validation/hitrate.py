"""Serving against the CPU-cache hit rate, as KV-offload benchmarks run it.

Such a benchmark (LMCache's ``long_doc_qa``, vLLM's ``benchmark_serving`` with a prefix
dataset) serves ``requests`` prompts of ``prompt`` tokens, ``concurrency`` at a time (a
closed-loop client, ``workload.max_concurrency``: a request is sent when one in flight
finishes, and its latencies count from then), where the first ``hit_rate`` of every prompt
was served once before: the engine finds it in its CPU DRAM cache and loads it instead of
computing it. kvsim replays it as one trace of two phases, a day apart
(:func:`write_trace`):

1. **warm**: every request's prefix, as a request of its own, in the same order and at the
   same concurrency: computed in HBM and written through to DRAM;
2. **measure**: the requests, each its prefix and then tokens of its own.

The figures are over phase 2 alone (:func:`measure`). As in the benchmark, nothing evicts
the prefixes from HBM but the warm phase itself: prefixes served in order, more than the HBM
pool holds, leave none there by the time phase 2 asks for them (LRU evicts the oldest), and
:func:`check_hits` refuses a run where the prefixes were not all found in DRAM and nowhere
else (a pool that holds them, or a DRAM cache that does not). The hit rate is realised in
whole KV blocks (``round(hit_rate x prompt / block)`` blocks a prompt;
:attr:`Benchmark.prefix_tokens`).

``python -m validation.hitrate --model M --hardware H --prompt N --output N --concurrency C
--requests R --hit-rates 0,0.5,1 [--set key=value ...] [--plot out.png]`` prints the curve
(and draws it); ``validation/fidelity.py`` runs the published points of it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sim.config.loader import build_config
from sim.errors import KvsimError
from sim.run import simulate

PHASE_GAP_S = 86_400.0  # between the phases: the first has long finished when the next starts


@dataclass(frozen=True)
class Benchmark:
    """One point of a throughput-against-hit-rate benchmark."""

    requests: int
    concurrency: int
    prompt: int
    output: int
    hit_rate: float
    block_tokens: int

    def __post_init__(self) -> None:
        if not 0.0 <= self.hit_rate <= 1.0:
            raise ValueError(f"hit_rate {self.hit_rate} is not a fraction in [0, 1]")
        if min(self.requests, self.concurrency, self.prompt, self.output) < 1:
            raise ValueError(f"{self}: requests, concurrency and lengths must be >= 1")

    @property
    def prefix_tokens(self) -> int:
        """Tokens of a prompt found in DRAM: the hit rate in whole blocks (at most the
        prompt's full blocks)."""
        blocks = min(
            round(self.hit_rate * self.prompt / self.block_tokens), self.prompt // self.block_tokens
        )
        return blocks * self.block_tokens


@dataclass(frozen=True)
class Phases:
    """When each phase arrives (s) and how many requests it holds."""

    warm: int
    measure_s: float
    measured: int


def write_trace(bench: Benchmark, path: Path) -> Phases:
    """The two phases as a JSONL trace (``t`` in s, ``hash_ids`` per ``block_tokens``
    tokens; the ids of different prompts never meet but where a prefix is shared)."""
    per_prompt = -(-bench.prompt // bench.block_tokens)
    prefix = bench.prefix_tokens // bench.block_tokens
    warm = bench.requests if prefix else 0
    own = iter(range(bench.requests * prefix, 1 << 62))
    prefixes = [list(range(i * prefix, (i + 1) * prefix)) for i in range(bench.requests)]
    rows = [(0.0, bench.prefix_tokens, bench.output, ids) for ids in prefixes[:warm]]
    start = PHASE_GAP_S if warm else 0.0  # a trace's times start at its first row
    rows += [
        (start, bench.prompt, bench.output, ids + [next(own) for _ in range(per_prompt - prefix)])
        for ids in prefixes
    ]
    lines = [
        json.dumps({"t": t, "input_length": n, "output_length": o, "hash_ids": ids})
        for t, n, o, ids in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    return Phases(warm, start, bench.requests)


def workload(path: Path, bench: Benchmark) -> dict:
    """The ``workload`` section that replays :func:`write_trace`'s file through a
    closed-loop client of the benchmark's concurrency."""
    return {
        "kind": "trace",
        "max_concurrency": bench.concurrency,
        "format": "jsonl",
        "path": str(path),
        "columns": {
            "arrival": "t",
            "prompt_tokens": "input_length",
            "output_tokens": "output_length",
            "hash_ids": "hash_ids",
        },
        "time_unit": "s",
        "hash_block_tokens": bench.block_tokens,
    }


def measured(requests: pd.DataFrame, phases: Phases) -> pd.DataFrame:
    """Phase 2's requests; refuses a run where the warm phase had not finished by then."""
    earlier = requests.iloc[: phases.warm]
    if len(earlier) and earlier["finish_s"].max() >= phases.measure_s:
        raise RuntimeError("the warm-up ran into the measured phase: the phases overlap")
    return requests.iloc[phases.warm :]


@dataclass(frozen=True)
class Figures:
    """Phase 2 as a benchmark client reports it."""

    round_s: float  # from the phase's start to its last finish
    request_throughput: float  # requests / round_s
    output_throughput: float  # output tokens / round_s
    mean_ttft_s: float  # from the moment the client sent each request


def measure(requests: pd.DataFrame, phases: Phases) -> Figures:
    """The benchmark's figures over phase 2 (``requests``: the run's request table)."""
    phase = measured(requests, phases)
    if (phase["status"] != "finished").any():
        raise RuntimeError("kvsim rejected a request of the measured phase")
    span = float(phase["finish_s"].max()) - phases.measure_s
    return Figures(
        round_s=span,
        request_throughput=len(phase) / span,
        output_throughput=float(phase["output_tokens"].sum()) / span,
        mean_ttft_s=float(phase["ttft_s"].mean()),
    )


def check_hits(summary: dict, bench: Benchmark) -> None:
    """Refuse a run whose prefixes were not found in DRAM, and only there: no prompt block
    may hit in HBM, and the DRAM hits must be every prefix block (but a last block holding
    the prompt's last token, which vLLM always computes)."""
    lookups = summary["prefix_lookup_blocks"]
    hbm = round(summary["hbm_hit_rate"] * lookups)
    dram = round(summary["dram_hit_rate"] * lookups)
    prefix = bench.prefix_tokens // bench.block_tokens
    whole = prefix - (bench.prefix_tokens == bench.prompt)
    if hbm or not bench.requests * whole <= dram <= bench.requests * prefix:
        raise RuntimeError(
            f"the measured prompts hit {dram} blocks in DRAM and {hbm} in HBM; the benchmark "
            f"needs {bench.requests} x {prefix} in DRAM and none in HBM (is kv.dram_capacity "
            "large enough to keep every prefix?)"
        )


# The engine of such a benchmark: a prefix cache in DRAM under HBM, prompt blocks written
# through as computed, loads fetched before compute (vLLM's offloading connector; LMCache
# loads inside the step: ``kv.prefix_loads=in_step``).
OFFLOAD_KV = {
    "mode": "offload",
    "prefix_caching": True,
    "layerwise": False,
    "write_policy": "write_through",
}


def run(
    config: dict, bench: Benchmark, overrides: Sequence[str] = (), source: str = "",
    strict: bool = True,
) -> tuple[Figures, dict[str, float]]:  # fmt: skip
    """Run ``bench`` on the engine of ``config`` (a run config mapping; its workload is
    replaced; ``overrides`` as ``--set`` takes them, applied last): the phase-2 figures and
    where the measured prompts' tokens were found (:func:`found`). ``strict``: a
    RuntimeError unless the prefixes were found in DRAM alone (:func:`check_hits`)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "hitrate.jsonl"
        phases = write_trace(bench, path)
        result = simulate(
            build_config({**config, "workload": workload(path, bench)}, source, list(overrides))
        )
    if strict:
        check_hits(result.summary, bench)
    return measure(result.requests, phases), found(result.summary, bench)


def found(summary: dict, bench: Benchmark) -> dict[str, float]:
    """The fraction of the measured prompts' tokens found in HBM and in DRAM (the warm
    phase's prompts share nothing, so every hit of the run is the measured phase's)."""
    blocks = summary["prefix_lookup_blocks"]
    tokens = bench.requests * bench.prompt / bench.block_tokens
    return {tier: round(summary[f"{tier}_hit_rate"] * blocks) / tokens for tier in ("hbm", "dram")}


def curve_config(args: argparse.Namespace) -> dict:
    """The run config of :func:`main`'s engine (vLLM's defaults but the given ones)."""
    return {
        "seed": 0,
        "model": {"profile": args.model},
        "hardware": args.hardware,
        "engine": {
            "tensor_parallel_size": args.tp,
            "max_num_seqs": args.max_num_seqs,
            "max_batched_tokens": args.max_batched_tokens,
            "block_tokens": args.block_tokens,
        },
        "kv": dict(OFFLOAD_KV),
    }


def _fractions(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected comma-separated fractions, e.g. 0,0.5,1"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Print (and with ``--plot`` draw) the benchmark's figures at each hit rate, with the
    share of the prompts' tokens actually found in HBM and in DRAM (a pool that holds the
    prefixes serves them from HBM: more requests, or a smaller pool, push them to DRAM)."""
    parser = argparse.ArgumentParser(prog="python -m validation.hitrate", description=__doc__)
    parser.add_argument("--model", required=True, help="a model profile (model_profiles/)")
    parser.add_argument("--hardware", required=True, help="a hardware profile")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    parser.add_argument("--prompt", type=int, required=True, help="prompt tokens a request")
    parser.add_argument("--output", type=int, required=True, help="output tokens a request")
    parser.add_argument("--concurrency", type=int, required=True, help="client slots")
    parser.add_argument("--requests", type=int, required=True, help="requests of a round")
    parser.add_argument(
        "--hit-rates", type=_fractions, default="0,0.25,0.5,0.75,1", help="comma-separated"
    )
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-batched-tokens", type=int, default=8192)
    parser.add_argument(
        "--block-tokens", type=int, default=16, help="KV block (the trace's prefix blocks too)"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--plot", type=Path, help="draw the curve here (PNG or PDF)")
    args = parser.parse_args(argv)
    config = curve_config(args)
    rows = []
    try:
        for rate in args.hit_rates:
            bench = Benchmark(
                args.requests, args.concurrency, args.prompt, args.output, rate, args.block_tokens
            )
            figures, tiers = run(config, bench, args.set, "validation.hitrate", strict=False)
            realised = {f"found_{tier}": share for tier, share in tiers.items()}
            rows.append(
                {"hit_rate": bench.prefix_tokens / bench.prompt, **realised, **vars(figures)}
            )
    except (ValueError, RuntimeError, KvsimError) as error:
        parser.error(" ".join(str(error).split()))
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    if args.plot is not None:
        from validation.plots import plot_hit_rate_curve

        print(f"wrote {plot_hit_rate_curve(table, args, args.plot)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
