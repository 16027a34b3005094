"""``kvsim calibrate`` and ``kvsim validate`` (registered by entry point; torch loads lazily)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.errors import KvsimError


def calibrate_command(args: argparse.Namespace) -> int:
    """Calibrate from measured tables (``--from-table``) or by running microbenchmarks."""
    if args.from_table and args.device:
        raise KvsimError("give --from-table DIR or --device DEVICE, not both")
    if args.from_table:
        if args.gpu is None:
            raise KvsimError("--from-table needs --gpu (h100, a100 or a40): which tables to fit")
        return _calibrate_from_table(args)
    if args.device:
        return _calibrate_device(args)
    raise KvsimError("give --from-table DIR --gpu GPU (fit tables) or --device cpu|cuda (measure)")


def _check_device(device: str) -> None:
    """Refuse a device torch cannot use here."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise KvsimError("--device cuda: torch sees no CUDA device here; use --device cpu")


def _calibrate_device(args: argparse.Namespace) -> int:
    from validation.devicecal import calibrate_device

    _check_device(args.device)
    if args.out.suffix not in (".yaml", ".yml"):
        raise KvsimError(f"--out {args.out}: expected a .yaml file for the calibrated profile")
    print(f"calibrating {args.device}{' (quick)' if args.quick else ''}:")
    _, fit = calibrate_device(args.device, args.out, args.quick, args.raw, args.base)
    g, att = fit.ops.gemm, fit.attention
    print(f"  peaks: {fit.peak_flops / 1e9:.3g} GFLOP/s, {fit.peak_bandwidth / 1e9:.3g} GB/s")
    passes = "one pass" if g.row_block is None else f"a pass per {g.row_block} rows"
    limit = "" if g.max_passes is None else f", at most {g.max_passes}"
    print(
        f"  GEMM: efficiency {g.efficiency:.3f}, memory {g.memory:.3f}, latency {g.latency_s:.2e} s"
        f"; weights read {passes}{limit}"
    )
    print(f"  attention latency {att.latency_s:.2e} s; step overhead {fit.step_overhead_s:.2e} s")
    print(f"wrote {args.out} (fit residuals: {args.out.with_suffix('.fit.json')})")
    return 0


def _calibrate_from_table(args: argparse.Namespace) -> int:
    from validation.calibrate import calibrate_from_table, lomo_markdown, lomo_summary
    from validation.plots import plot_held_out

    result = calibrate_from_table(
        args.from_table, args.gpu, args.out, args.base, args.tp_degrees, args.comm
    )
    print(lomo_markdown(result.errors, args.gpu))
    print(f"\nleave-one-model-out: {lomo_summary(result.errors)}")
    if result.tp_errors is not None and len(result.tp_errors):
        print(f"leave-one-model-out, tp > 1 rows: {lomo_summary(result.tp_errors)}")
    if result.comm is not None:
        p, errs = result.comm.params, result.comm.errors
        worst = ", ".join(f"{r.workers} GPUs {100 * r.median_ape:.1f}%" for r in errs.itertuples())
        print(
            f"interconnect: latency {p.latency_s * 1e6:.3g} us, efficiency {p.efficiency:.3f}, "
            f"half {p.half_efficiency_bytes / 2**20:.3g} MiB, exponent {p.workers_exponent:.3f}"
            f" (median APE >= 1 MiB: {worst})"
        )
    if args.plot:
        models = args.plot_models.split(",") if args.plot_models else list(result.fit.models[:2])
        unknown = sorted(set(models) - set(result.fit.models))
        if unknown:
            raise KvsimError(
                f"--plot-models: no tables for {unknown}; known: {list(result.fit.models)}"
            )
        title = f"{args.gpu}: per-layer time of held-out models (fit on the other models)"
        print(f"wrote {plot_held_out(result.layers, models, title, args.plot)}")
    print(f"wrote {result.path}")
    return 0


def add_calibrate_command(sub: argparse._SubParsersAction) -> None:
    """Register ``kvsim calibrate``."""
    parser = sub.add_parser(
        "calibrate",
        help="fit the cost model to measured operator times; write a calibrated profile",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--from-table",
        type=Path,
        metavar="DIR",
        help="measured tables (Vidur mlp.csv or long format)",
    )
    parser.add_argument("--gpu", choices=("h100", "a100", "a40"), help="which GPU's tables to fit")
    parser.add_argument(
        "--tp-degrees",
        choices=("1", "all"),
        default="all",
        help="fit rows of tensor-parallel degree 1 only, or of all degrees (per-GPU shapes; "
        "default); the bundled profiles were fitted with 1",
    )
    parser.add_argument(
        "--comm",
        type=Path,
        metavar="DIR",
        help="NCCL all-reduce tables for the interconnect fit (default: measured-comm beside "
        "--from-table, where it exists)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), help="measure this device instead")
    parser.add_argument("--quick", action="store_true", help="with --device: a short run (CI)")
    parser.add_argument(
        "--raw",
        type=Path,
        help="with --device: raw measurements CSV (default: OUT.measurements.csv)",
    )
    parser.add_argument("--base", help="profile whose peaks and other sections the output keeps")
    parser.add_argument(
        "--out", type=Path, required=True, help="calibrated profile to write (.yaml)"
    )
    parser.add_argument(
        "--plot", type=Path, help="also draw held-out models' measured vs predicted"
    )
    parser.add_argument(
        "--plot-models", help="comma-separated models for --plot (default: first two)"
    )
    parser.set_defaults(func=calibrate_command)


def validate_command(args: argparse.Namespace) -> int:
    """Run the mini-engine and the simulator side by side; write the report."""
    from sim.config.loader import load_hardware
    from validation.calibrate import load_base
    from validation.devicecal import DEFAULT_BASE
    from validation.report import run_validation, table_line, write_report
    from validation.scenario import MODES

    _check_device(args.device)
    modes = tuple(args.modes.split(","))
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        expected = ", ".join(MODES)
        raise KvsimError(f"--modes: unknown KV modes {unknown}; expected some of {expected}")
    if args.repeats < 1:
        raise KvsimError(f"--repeats {args.repeats}: expected at least 1")
    hw, _ = load_base(args.profile)
    baseline = load_hardware(args.baseline or DEFAULT_BASE[args.device])
    report, steps = run_validation(
        hw, args.profile, baseline, args.device, args.quick, args.repeats, modes,
        raw_measurements(args.profile, args.table),
    )  # fmt: skip
    for path in write_report(report, steps, args.out):
        print(f"wrote {path}")
    print(
        f"step MAPE {100 * report['step_mape']:.1f}%, e2e error {100 * report['e2e_error']:.1f}% "
        f"(baseline {baseline.name}: {100 * report['baseline']['step_mape']:.1f}%, "
        f"{100 * report['baseline']['e2e_error']:.1f}%)"
    )
    print(table_line(report))
    return 0


def raw_measurements(profile: str, table: Path | None) -> Path | None:
    """``--table``, else the calibration's ``OUT.measurements.csv`` beside a profile file
    ``OUT.yaml`` (None where there is none)."""
    if table is not None:
        if not table.is_file():
            raise KvsimError(f"--table {table}: no such file (expected raw measurements, CSV)")
        return table
    beside = Path(profile).with_suffix(".measurements.csv")
    return beside if Path(profile).suffix in (".yaml", ".yml") and beside.is_file() else None


def add_validate_command(sub: argparse._SubParsersAction) -> None:
    """Register ``kvsim validate``."""
    parser = sub.add_parser(
        "validate",
        help="run a real torch mini-engine and the simulator side by side; report the error",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument(
        "--profile", required=True, help="hardware profile: bundled name or YAML path"
    )
    parser.add_argument("--out", type=Path, required=True, help="report directory")
    parser.add_argument("--quick", action="store_true", help="a small workload (CI)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per mode (per step: GPU median, CPU min)"
    )
    parser.add_argument(
        "--modes", default="hbm,offload,dram_centric", help="KV modes to run (comma-separated)"
    )
    parser.add_argument(
        "--baseline",
        help="uncalibrated profile to compare with (default: cpu-host; cuda: h200-sxm)",
    )
    parser.add_argument(
        "--table",
        type=Path,
        help="raw measurements for the measured-table cost model reported beside the fitted "
        "one (default: PROFILE.measurements.csv beside a profile file, where it exists)",
    )
    parser.set_defaults(func=validate_command)
