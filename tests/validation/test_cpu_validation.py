"""Issue 7 on the CPU: microbenchmarks, calibrate, then validate against the mini-engine."""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")

from sim.cli import main  # noqa: E402
from sim.config.hardware import HardwareSpec  # noqa: E402
from sim.config.loader import read_yaml, validate  # noqa: E402
from sim.config.model import ModelSpec  # noqa: E402
from sim.cost.optables import LONG_COLUMNS  # noqa: E402
from tests.validation.bounds import E2E_ERROR_BOUND, STEP_MAPE_BOUND  # noqa: E402
from validation.microbench import (  # noqa: E402
    Bench,
    Plan,
    bench_attention,
    bench_block_copies,
    bench_copies,
    bench_gemms,
    bench_kernels,
)

TINY = ModelSpec(name="tiny", layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32,
                 intermediate=128, vocab=256, dtype="fp32")  # fmt: skip
PLAN = Plan(tokens=(1, 4, 16), copy_sizes=(4096, 65536, 2**20), block_counts=(1, 4),
            decode_batches=(1, 2), decode_contexts=(16, 64), prefill_lengths=(8, 32),
            repeats=3, budget_s=0.05)  # fmt: skip


@pytest.mark.torch
def test_microbenchmarks_write_the_long_table():
    bench = Bench(TINY, "cpu", PLAN, block_tokens=8)
    for fn in (bench_copies, bench_block_copies, bench_gemms, bench_kernels, bench_attention):
        fn(bench)
    table = bench.frame()
    assert set(LONG_COLUMNS) <= set(table.columns)
    assert {"device", "torch", "date", "dtype", "time_min_s", "time_p90_s"} <= set(table.columns)
    counts = table.kind.value_counts()
    assert counts["gemm"] == 5 * 3  # qkv, o, up, down, LM head x 3 token counts
    assert counts["copy"] == 3 and counts["copy_blocks"] == 2 * 2
    assert counts["attention_decode"] == 4 and counts["attention_prefill"] == 2
    assert (table.time_s > 0).all() and (table.time_min_s <= table.time_s).all()
    gemm = table[(table.kind == "gemm") & (table.op == "up")].iloc[0]
    assert (gemm.fan_in, gemm.fan_out) == (64, 256)  # gate and up stacked
    decode = table[table.kind == "attention_decode"].iloc[-1]
    assert decode.bytes == 2 * 65 * 2 * 32 * 4  # 2 sequences x 65 keys x K,V x 32 x 4 B


ATTEMPTS = 3  # a measurement on a shared machine: another pair while one misses the bounds
BOUNDS = {"e2e_error": E2E_ERROR_BOUND, "step_mape": STEP_MAPE_BOUND}  # calibrated CPU
# on every CPU: one whose few-row GEMMs re-read the weights per block of rows (MKL on AVX-512
# Xeons) is calibrated with efficiency.gemm_row_block (test_row_blocks.py, docs/validation.md)


def check_fit_summary(folder) -> dict:
    """``kvsim calibrate``'s ``OUT.fit.json``: what it measured and its fits' residuals."""
    summary = json.loads((folder / "cpu-calibrated.fit.json").read_text())
    raw = folder / "cpu-calibrated.measurements.csv"
    assert summary["device"] == "cpu" and summary["quick"] is True
    assert summary["measurements"] == str(raw)
    assert summary["points"] == len(raw.read_text().splitlines()) - 1  # the CSV's rows
    for name in ("gemm", "attention", "link", "step"):
        residual = summary["residuals"][name]
        assert residual["n"] > 0 and 0 <= residual["median_ape"] <= residual["p90_ape"], name
    header = (folder / "cpu-calibrated.yaml").read_text().split("name:")[0]
    assert f"p90 {100 * summary['residuals']['gemm']['p90_ape']:.1f}%" in header  # the same
    return summary


def calibrate_and_validate(folder) -> dict:
    """``kvsim calibrate --device cpu --quick`` then ``kvsim validate`` with that profile;
    the report, after checking what does not depend on timing."""
    profile = folder / "cpu-calibrated.yaml"
    assert main(["calibrate", "--device", "cpu", "--quick", "--out", str(profile)]) == 0
    spec = validate(HardwareSpec, read_yaml(profile), str(profile))
    assert spec.efficiency.kernels is not None and spec.efficiency.step_overhead > 0
    assert "Calibrated" in profile.read_text().split("name:")[0]
    check_fit_summary(folder)
    out = folder / "report"
    args = ["validate", "--device", "cpu", "--quick", "--profile", str(profile), "--out", str(out)]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["device"] == "cpu" and report["steps"] > 40
    assert all(mode["schedule_match"] for mode in report["modes"].values())
    assert {"prefill", "decode", "mixed", "with_transfers"} <= set(report["by_kind"])
    assert (out / "steps.png").read_bytes()[:4] == b"\x89PNG" and (out / "summary.md").is_file()
    return report


@pytest.mark.timing  # run alone (README test command): beside another worker, step MAPE doubles
def test_calibrated_cpu_profile_predicts_the_mini_engine(tmp_path, capsys):
    for attempt in range(ATTEMPTS):
        (folder := tmp_path / f"attempt{attempt}").mkdir()
        report = calibrate_and_validate(folder)
        if all(report[key] <= bound for key, bound in BOUNDS.items()):
            break
        warnings.warn(  # in the summary even when a later pair passes
            f"calibrate + validate pair {attempt + 1} missed: step MAPE "
            f"{report['step_mape']:.1%}, e2e error {report['e2e_error']:.1%}",
            stacklevel=1,
        )
    assert report["e2e_error"] <= BOUNDS["e2e_error"], report
    # calibration earns its keep: the placeholder profile is worse on the same steps
    assert report["baseline"]["step_mape"] > report["step_mape"]
    assert report["baseline"]["e2e_error"] > report["e2e_error"]
    assert report["step_mape"] <= BOUNDS["step_mape"], report


VALIDATE = "validate --device cpu --profile cpu-host --out r"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["calibrate", "--device", "cpu", "--from-table", "x", "--out", "p.yaml"], "not both"),
        (["calibrate", "--out", "p.yaml"], "give --from-table"),
        (["calibrate", "--device", "cpu", "--out", "p.txt"], "expected a .yaml file"),
        (f"{VALIDATE} --modes hbm,swap".split(), "unknown KV modes ['swap']"),
        (["validate", "--device", "cpu", "--profile", "nope", "--out", "r"], "neither a YAML file"),
        (f"{VALIDATE} --table t.csv".split(), "--table t.csv: no such file"),
    ],
)
def test_command_errors_are_one_line(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
