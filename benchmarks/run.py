"""The speed benchmark: a fixed set of workloads, one table, JSON (issue 8). Not a test.

    python -m benchmarks.run [--quick] [--only KEY[,KEY...]] [--json FILE] [--repeat N]
                             [--max-requests N] [--instructions | --profile DIR]
                             [--against TREE]

Each workload runs in its own process (``--child KEY``), so peak RSS is its own. Columns:
wall time (building the workload + simulating), its CPU time (what to compare on a shared
machine), peak RSS, simulated seconds per wall second, engine steps per second, SimPy
events per second (for the replay workload: block accesses per second). ``--only 6``
picks workload 6, ``--only 4`` every ``4-*`` one, ``--only 2`` both ``2a`` and ``2b``;
``--only scale`` the 1,000,000-request run, which no other selection includes; ``--only 2b,7``
one instance on the Mooncake hour and eight on it at eight times the rate (the cluster
note: their wall-time ratio). Traces come
from ``$KVSIM_TRACES`` (else ``../shared/traces``). Figures depend on the machine and on
its other load (compare CPU seconds, or with ``--instructions`` the instructions executed,
counted by valgrind's callgrind: within 0.5% from run to run); docs/performance.md records
a run. ``--profile DIR`` writes where each workload's time goes, as pyinstrument sees it, to
``DIR/<key>.txt`` (its timings then include the profiler's overhead). ``--against TREE``
runs each workload here and in another checkout at the same moment, one process each, and
prints the ratio of their CPU seconds: on a shared machine a tree's seconds move by tens of
percent within the hour, a pair's ratio much less.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyinstrument import Profiler

MOONCAKE = "mooncake_fast25_conversation_trace.jsonl"
MOONCAKE_SYNTHETIC = "mooncake_fast25_synthetic_trace.jsonl"
REPLAY_POLICIES = ("fifo", "lru", "lfu", "arc", "s3fifo", "sieve", "opt", "prefix_lru")
REPLAY_CAPACITIES = (1000, 5000, 10_000, 30_000, 50_000, 100_000)


def _mooncake(kv: dict) -> dict:
    return {
        "seed": 0,
        "model": "llama-3-8b",
        "hardware": "h100-sxm",
        "workload": {"kind": "trace", "format": "mooncake", "path": MOONCAKE, "jitter_s": 3.0},
        "engine": {"max_num_seqs": 256, "max_batched_tokens": 8192, "block_tokens": 16},
        "kv": kv,
    }


def _mooncake_cluster(instances: int) -> dict:
    """The Mooncake hour (workload 2b) at ``instances`` x its rate on that many instances."""
    config = _mooncake({"mode": "hbm"})
    config["workload"]["rate_scale"] = float(instances)
    config["cluster"] = {"instances": instances, "router": {"kind": "round_robin"}}
    return config


def _peer(num_requests: int) -> dict:
    return {
        "seed": 0,
        "model": "llama-2-7b",
        "hardware": "h100-sxm",
        "workload": {
            "kind": "fitted",
            "from": {"format": "azure", "path": "azure_llm_2023_conv.csv"},
            "num_requests": num_requests,
            "arrival": {"kind": "poisson", "rate": 6.0},
            "max_total_tokens": 4096,
        },
        "engine": {"max_num_seqs": 128, "max_batched_tokens": 512, "chunked_prefill": True},
        "kv": {"mode": "hbm"},
    }


def _poisson(num_requests: int) -> dict:
    return {
        "seed": 0,
        "model": "llama-3-8b",
        "hardware": "h100-sxm",
        "workload": {"preset": "short-chat", "num_requests": num_requests},
        "engine": {"max_num_seqs": 256, "max_batched_tokens": 8192},
        "kv": {"mode": "hbm"},
    }


SEED_POINT = {
    "seed": 0,
    "model": "llama-2-7b",
    "hardware": "h100-sxm",
    "workload": {
        "kind": "synthetic",
        "num_requests": 32,
        "arrival": {"kind": "all_at_once"},
        "prompt_tokens": 8192,
        "output_tokens": 64,
    },
    "engine": {"max_num_seqs": 256, "max_batched_tokens": 8192, "block_tokens": 16},
    "kv": {"mode": "dram_centric", "access": "full"},
}

# 1,000,000 short requests at a rate the engine keeps up with (bounded memory check)
SCALE = {
    "seed": 0,
    "model": "llama-3-8b",
    "hardware": "h100-sxm",
    "workload": {
        "kind": "synthetic",
        "num_requests": 1_000_000,
        "arrival": {"kind": "poisson", "rate": 200.0},
        "prompt_tokens": {"kind": "uniform", "min": 64, "max": 256},
        "output_tokens": {"kind": "uniform", "min": 4, "max": 28},
    },
    "engine": {"max_num_seqs": 256, "max_batched_tokens": 8192},
    "kv": {"mode": "hbm"},
}


@dataclass(frozen=True)
class Workload:
    """One benchmark row: an engine config, the replay table (``config`` None), or a whole
    ``kvsim`` process (``extra["argv"]``: its arguments; a run's ``--out`` is added)."""

    key: str
    title: str
    config: dict | None = None
    quick: bool = False
    target: str = ""
    extra: dict = field(default_factory=dict)


WORKLOADS = (
    Workload(
        "1",
        "Mooncake conversation, dram_centric sparse",
        _mooncake({"mode": "dram_centric", "access": "sparse"}),
        target="<= 45 CPU s, < 2 GB",
    ),
    Workload(
        "2a",
        "Mooncake conversation, offload S3-FIFO",
        _mooncake({"mode": "offload", "eviction": "s3fifo"}),
        target="<= 90 CPU s",
    ),
    Workload("2b", "Mooncake conversation, hbm", _mooncake({"mode": "hbm"})),
    Workload("3", "seed point 32 x 8192, dram_centric full", SEED_POINT, quick=True),
    Workload("7", "cluster: 2b at 8x rate on 8 instances", _mooncake_cluster(8), target="<= 2x 2b"),
    Workload("4-10k", "Poisson short-chat 10k", _poisson(10_000), quick=True),
    Workload("4-20k", "Poisson short-chat 20k", _poisson(20_000), quick=True),
    Workload("4-40k", "Poisson short-chat 40k", _poisson(40_000)),
    Workload("4-80k", "Poisson short-chat 80k", _poisson(80_000)),
    Workload("5", "replay both Mooncake traces, 8 x 6", None, target="< 20 s"),
    Workload("6", "peer: Azure conv 4k, hbm", _peer(4000), quick=True, target="<= 2.3 s"),
    Workload("6-16k", "peer: Azure conv 16k, hbm", _peer(16_000), target="<= 4 s"),
    Workload("scale", "synthetic 1,000,000 requests", SCALE, target="< 4 GB"),
    # whole processes (interpreter start, imports, run, files written), as /usr/bin/time sees them
    Workload(
        "help", "process: kvsim --help", quick=True, target="<= 0.3 s", extra={"argv": ["--help"]}
    ),
    Workload(
        "6-run",
        "process: kvsim run benchmarks/peer.yaml",
        quick=True,
        target="<= 1.0 s",
        extra={"argv": ["run", "benchmarks/peer.yaml", "--force", "--quiet", "--out"]},
    ),
)
BY_KEY = {w.key: w for w in WORKLOADS}


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and its finished children so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _peak_rss_bytes() -> int:
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(self_kb, children_kb) * 1024


def _run_engine(config_data: dict) -> dict:
    from sim.config import build_config
    from sim.run import Simulation
    from sim.workload import build_requests
    from sim.workload.trace import traces_root

    start = time.perf_counter()
    config = build_config(config_data, "<benchmark>")
    requests = build_requests(
        config.workload, config.seed, traces_root() or Path("."), config.engine.block_tokens
    )
    built = time.perf_counter()
    engine = Simulation(config, requests)
    result = engine.run()
    wall = time.perf_counter() - start
    events = next(engine.env._eid)  # SimPy's event counter: events scheduled in the run
    s = result.summary
    return {
        "wall_s": wall,
        "build_s": built - start,
        "sim_s": s["sim_time_s"],
        "steps": s["steps"],
        "events": events,
        "requests": len(requests),
        "finished": s["requests_finished"],
    }


def _run_replay() -> dict:
    from sim.replay import read_trace, replay_table

    jobs = min(len(os.sched_getaffinity(0)), len(REPLAY_POLICIES) * len(REPLAY_CAPACITIES))
    start = time.perf_counter()
    accesses = 0
    for name in (MOONCAKE, MOONCAKE_SYNTHETIC):
        trace = read_trace(name)
        rows = replay_table(
            trace, {p: p for p in REPLAY_POLICIES}, REPLAY_CAPACITIES, jobs=jobs, progress=False
        )
        accesses += len(trace.keys) * len(rows)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "sim_s": None, "steps": None, "events": accesses, "jobs": jobs}


def _run_process(argv: list[str]) -> dict:
    """``python -m sim ARGV`` as a process of its own (a run writes a temporary folder), as
    an installed kvsim runs: with its modules' bytecode cached (pip compiles a package when
    it installs it; where ``PYTHONDONTWRITEBYTECODE`` is set, every process would compile
    every module again). ``cold_s``: the first run, which fills the cache."""
    import tempfile

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as cache:  # empty: the first run is cold
        env["PYTHONPYCACHEPREFIX"] = cache
        for _ in range(2):
            with tempfile.TemporaryDirectory() as tmp:
                args = [*argv, str(Path(tmp) / "run")] if argv[-1] == "--out" else argv
                start, cpu = time.perf_counter(), _cpu_s()
                command = [sys.executable, "-m", "sim", *args]
                subprocess.run(command, check=True, capture_output=True, env=env)
                walls.append(time.perf_counter() - start)
                cpus.append(_cpu_s() - cpu)
    row = {"wall_s": walls[1], "cold_s": walls[0], "sim_s": None, "steps": None, "events": None}
    return {**row, "process_cpu_s": cpus[1]}


def capped(config: dict, max_requests: int | None) -> dict:
    """A copy of an engine workload's config cut to its first ``max_requests`` requests (a
    trace's first ones; a drawn workload draws that many)."""
    config = copy.deepcopy(config)
    workload = config["workload"]
    if max_requests and workload.get("kind") == "trace":
        workload["max_requests"] = max_requests
    elif max_requests:
        workload["num_requests"] = min(workload["num_requests"], max_requests)
    return config


def child(key: str, max_requests: int | None = None, profile: Path | None = None) -> None:
    """Run one workload in this process and print its figures as one JSON line (``profile``:
    also write pyinstrument's report of the run there)."""
    workload = BY_KEY[key]
    profiler = _profiler() if profile else None
    cpu = _cpu_s()
    if profiler is not None:
        profiler.start()
    if "argv" in workload.extra:
        row = _run_process(workload.extra["argv"])
    elif workload.config is None:
        row = _run_replay()
    else:
        row = _run_engine(capped(workload.config, max_requests))
    if profiler is not None and profile is not None:
        profiler.stop()
        profile.write_text(profiler.output_text(unicode=False, color=False))
    row["cpu_s"] = row.pop("process_cpu_s", _cpu_s() - cpu)
    row["peak_rss_bytes"] = _peak_rss_bytes()
    print(json.dumps(row))


def _profiler() -> Profiler:
    """A pyinstrument profiler, once the simulator is imported (so that its imports are not
    in the report)."""
    from pyinstrument import Profiler

    for module in ("sim.instance.instance", "sim.replay"):
        importlib.import_module(module)
    return Profiler(interval=0.001)


CALLGRIND = ("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null")


HERE = Path(__file__).resolve().parents[1]  # this tree


def run_one(
    key: str,
    max_requests: int | None = None,
    instructions: bool = False,
    profile: Path | None = None,
) -> dict:
    """Run ``key`` in a fresh interpreter; its figures (``instructions``: under callgrind,
    with the instructions it executed, imports and the workload's build included;
    ``profile``: pyinstrument's report written to that file)."""
    return _finish(_start(key, max_requests, instructions, profile), instructions)


def run_pair(
    key: str, against: Path, max_requests: int | None = None, instructions: bool = False
) -> tuple[dict, dict]:
    """Run ``key`` in this tree and in the tree ``against`` at the same moment, one process
    each (on a shared machine, their ratio holds where each one's seconds do not)."""
    procs = [_start(key, max_requests, instructions, None, tree) for tree in (HERE, against)]
    mine, theirs = (_finish(proc, instructions) for proc in procs)
    return mine, theirs


def _start(
    key: str, max_requests: int | None, instructions: bool, profile: Path | None,
    tree: Path = HERE,
) -> subprocess.Popen:  # fmt: skip
    """The child process of ``key`` in ``tree`` (its own ``sim`` and ``benchmarks``)."""
    cap = ["--max-requests", str(max_requests)] if max_requests else []
    cap += ["--profile-out", str(profile.resolve())] if profile else []
    command = [sys.executable, "-m", "benchmarks.run", "--child", key, *cap]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.Popen(
        [*CALLGRIND, *command] if instructions else command,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tree, env=env,
    )  # fmt: skip


def _finish(proc: subprocess.Popen, instructions: bool) -> dict:
    """The figures a child printed (or its error)."""
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        said = [line for line in stderr.splitlines() if line and not line.startswith("==")]
        return {"error": said[-1] if said else f"exit status {proc.returncode}"}  # not valgrind's
    row = json.loads(stdout.strip().splitlines()[-1])
    if instructions:
        row["instructions"] = _collected(stderr)
    return row


def _collected(stderr: str) -> int:
    """The instruction count in callgrind's summary (``==pid== Collected : N``)."""
    for line in stderr.splitlines():
        if "Collected :" in line:
            return int(line.split(":")[-1])
    raise RuntimeError(f"no instruction count in valgrind's output: {stderr[-300:]!r}")


def _rates(row: dict) -> dict:
    wall = row["wall_s"]
    return {
        "sim_per_wall": row["sim_s"] / wall if row.get("sim_s") else None,
        "steps_per_s": row["steps"] / wall if row.get("steps") else None,
        "events_per_s": row["events"] / wall if row.get("events") else None,
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(results: dict[str, dict]) -> str:
    """The table the benchmark prints."""
    counted = any("instructions" in row for row in results.values())
    head = (
        f"{'#':<6} {'workload':<44} {'wall s':>8} {'CPU s':>8} {'RSS MiB':>8} {'sim s/wall s':>12} "
        f"{'steps/s':>9} {'events/s':>10}" + (f" {'G instr':>8}" if counted else "") + "  target"
    )
    lines = [head, "-" * len(head)]
    for key, row in results.items():
        w = BY_KEY[key]
        if "error" in row:
            lines.append(f"{key:<6} {w.title:<44} error: {row['error']}")
            continue
        rss = row["peak_rss_bytes"] / 2**20
        lines.append(
            f"{key:<6} {w.title:<44} {row['wall_s']:>8.2f} {row['cpu_s']:>8.2f} {rss:>8.0f} "
            f"{_fmt(row['sim_per_wall'], '>12,.1f')} {_fmt(row['steps_per_s'], '>9,.0f')} "
            f"{_fmt(row['events_per_s'], '>10,.0f')}"
            + (f" {row['instructions'] / 1e9:>8.3f}" if counted else "")
            + f"  {w.target}"
        )
    return "\n".join(lines)


def scaling_note(results: dict[str, dict]) -> str | None:
    """Wall-time ratio of each doubling of workload 4 (linear: <= 2.2)."""
    keys = [k for k in ("4-10k", "4-20k", "4-40k", "4-80k") if "wall_s" in results.get(k, {})]
    walls = [(k, results[k]["wall_s"]) for k in keys]
    if len(walls) < 2:
        return None
    ratios = [f"{b[0]}/{a[0]} {b[1] / a[1]:.2f}x" for a, b in pairwise(walls)]
    return "scaling (2x requests, target <= 2.2x time): " + ", ".join(ratios)


def cluster_note(results: dict[str, dict]) -> str | None:
    """Wall time of the 8-instance cluster (7) over one instance on the same trace (2b)."""
    if "wall_s" not in results.get("7", {}) or "wall_s" not in results.get("2b", {}):
        return None
    ratio = results["7"]["wall_s"] / results["2b"]["wall_s"]
    return f"clusters (8 instances at 8x / 1 at 1x, target <= 2x time): {ratio:.2f}x"


def pair_table(pairs: dict[str, tuple[dict, dict]], against: Path) -> str:
    """Each pair's CPU seconds (and instructions, when counted) here and in ``against``."""
    lines = [f"{'#':<6} {'CPU s':>8} {'against':>8} {'ratio':>6}  (against {against})"]
    for key, (mine, theirs) in pairs.items():
        if "error" in mine or "error" in theirs:
            lines.append(f"{key:<6} error: {mine.get('error') or theirs.get('error')}")
            continue
        line = f"{key:<6} {mine['cpu_s']:>8.2f} {theirs['cpu_s']:>8.2f} "
        line += f"{mine['cpu_s'] / theirs['cpu_s']:>6.3f}"
        if "instructions" in mine and "instructions" in theirs:
            line += f"  instructions {mine['instructions'] / theirs['instructions']:.3f}x"
        lines.append(line)
    return "\n".join(lines)


def select(only: str | None, quick: bool) -> list[str]:
    """Workload keys to run: ``--only`` keys or prefixes, else quick or all (never scale)."""
    if only:
        keys = []
        for part in only.split(","):
            found = [w.key for w in WORKLOADS if w.key == part] or [
                w.key for w in WORKLOADS if w.key.startswith(part) and w.key[len(part)] in "-ab"
            ]
            if not found:
                raise SystemExit(f"--only {part!r}: no such workload; keys: {', '.join(BY_KEY)}")
            keys.extend(found)
        return keys
    return [w.key for w in WORKLOADS if w.key != "scale" and (w.quick or not quick)]


def main() -> None:
    """Run the selected workloads, print the table, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="workloads 3, 4-10k, 4-20k and 6")
    parser.add_argument("--only", metavar="KEY[,KEY]", help="e.g. 1, 4, 6-16k, scale")
    parser.add_argument("--json", type=Path, default=Path("runs/benchmark.json"))
    parser.add_argument("--repeat", type=int, default=1, help="keep the best of N runs")
    parser.add_argument(
        "--max-requests",
        type=int,
        help="cap the engine workloads at N requests (a trace's first N; the others draw N)",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="run under valgrind's callgrind and add the instructions executed (within 0.5%%: "
        "compare trees on a noisy machine; times are then callgrind's, ~50x slower)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="write pyinstrument's report of each workload to DIR/KEY.txt (times then include "
        "the profiler's overhead)",
    )
    parser.add_argument(
        "--against",
        type=Path,
        metavar="TREE",
        help="run each workload in this tree and in TREE (another checkout, e.g. a git "
        "worktree of the commit before) at the same moment, one process each, and print the "
        "ratio of their CPU seconds",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.max_requests, args.profile_out)
        return
    if args.profile and args.instructions:
        raise SystemExit("--profile and --instructions: give one (each slows the other's run)")
    if args.instructions and shutil.which("valgrind") is None:
        raise SystemExit("--instructions: valgrind is not installed (apt install valgrind)")
    if args.profile and importlib.util.find_spec("pyinstrument") is None:
        raise SystemExit("--profile: pyinstrument is not installed (pip install pyinstrument)")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    if args.against is not None and (args.profile or args.repeat != 1):
        raise SystemExit("--against: runs each pair once, without --profile or --repeat")
    if args.against is not None and not (args.against / "benchmarks" / "run.py").is_file():
        raise SystemExit(f"--against {args.against}: no benchmarks/run.py there")
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} cores; python {sys.version.split()[0]}")
    results: dict[str, dict] = {}
    pairs: dict[str, tuple[dict, dict]] = {}
    for key in select(args.only, args.quick):
        if args.against is not None:
            pairs[key] = run_pair(key, args.against.resolve(), args.max_requests, args.instructions)
            results[key] = row = pairs[key][0]
            if "error" not in row:
                row.update(_rates(row))
            print(pair_table({key: pairs[key]}, args.against).splitlines()[-1], flush=True)
            continue
        profile = args.profile / f"{key}.txt" if args.profile else None
        runs = [
            run_one(key, args.max_requests, args.instructions, profile) for _ in range(args.repeat)
        ]
        good = [r for r in runs if "error" not in r]
        row = min(good, key=lambda r: r["wall_s"]) if good else runs[0]
        if "error" not in row:
            row.update(_rates(row))
        results[key] = row
        print(format_table({key: row}).splitlines()[-1], flush=True)
    print()
    print(format_table(results))
    if pairs:
        print(pair_table(pairs, args.against))
    for note in (scaling_note(results), cluster_note(results)):
        if note:
            print(note)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "load_average": load,
        "cpu_count": os.cpu_count(),
        "max_requests": args.max_requests,
        "results": results,
    }
    if pairs:
        report["against"] = {
            "tree": str(args.against),
            "results": {k: p[1] for k, p in pairs.items()},
        }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
