#!/usr/bin/env bash
# Issue 7's one GPU run (the device tool lends an H200 in some tasks): calibrate, then validate
# every KV mode (hbm, offload, dram_centric), with --device cuda, in under 8 minutes.
#
#   bash benchmarks/gpu_validate.sh            # from the repository root; writes under $OUT
#
# Installs nothing: it needs a Python with torch (CUDA) and kvsim's dependencies, and stops
# at once, naming what is missing, if there is none. It does not need kvsim installed (the
# commands are called from the source tree). Everything goes under $OUT (default
# benchmarks/validation/h200):
#   h200-measured.yaml                 the calibrated profile (copy to hardware_profiles/calibrated/)
#   h200-measured.measurements.csv     raw measurements (also a cost_table for cost_model: table)
#   h200-measured.fit.json             the fits' residuals, machine-readable
#   h200-report/                       report.json, steps.csv, steps.png, summary.md
#   nvidia-smi.txt, versions.txt, timings.txt, *.log
# Budget: full calibration 270 s (if it runs out, a --quick calibration, 75 s, replaces it and
# timings.txt says so), validation 130 s, start-up and checks ~15 s: at most ~8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/validation/h200}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - <<'EOF' 2>&1 | tee "$OUT/versions.txt"
import importlib, sys
missing = [m for m in ("torch", "numpy", "pandas", "pydantic", "simpy", "yaml", "matplotlib",
                       "scipy") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_validate.sh: missing Python packages {missing}; this script installs nothing")
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_validate.sh: torch sees no CUDA device")
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
EOF
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv \
    | tee "$OUT/nvidia-smi.txt" || true

kvsim() {  # kvsim's calibrate and validate commands, straight from the source tree
    "$PY" -c 'import argparse, sys
from sim.errors import KvsimError
from validation.commands import add_calibrate_command, add_validate_command
parser = argparse.ArgumentParser(prog="kvsim")
sub = parser.add_subparsers(required=True)
add_calibrate_command(sub)
add_validate_command(sub)
args = parser.parse_args(sys.argv[1:])
try:
    sys.exit(args.func(args))
except KvsimError as exc:
    sys.exit(f"kvsim: {exc}")' "$@"
}

profile="$OUT/h200-measured.yaml"
raw="$OUT/h200-measured.measurements.csv"
start=$SECONDS
if timeout 270 bash -c "$(declare -f kvsim); PY='$PY' kvsim calibrate --device cuda \
        --base h200-sxm --out '$profile' --raw '$raw'" > "$OUT/calibrate.log" 2>&1; then
    echo "calibrate (full): $((SECONDS - start)) s" | tee "$OUT/timings.txt"
else
    echo "calibrate (full) did not finish in 270 s; quick calibration instead" \
        | tee "$OUT/timings.txt"
    start=$SECONDS
    timeout 75 bash -c "$(declare -f kvsim); PY='$PY' kvsim calibrate --device cuda --quick \
        --base h200-sxm --out '$profile' --raw '$raw'" > "$OUT/calibrate-quick.log" 2>&1
    echo "calibrate (quick): $((SECONDS - start)) s" | tee -a "$OUT/timings.txt"
fi
start=$SECONDS
timeout 130 bash -c "$(declare -f kvsim); PY='$PY' kvsim validate --device cuda \
    --profile '$profile' --baseline h200-sxm --modes hbm,offload,dram_centric \
    --out '$OUT/h200-report'" 2>&1 | tee "$OUT/validate.log"
echo "validate: $((SECONDS - start)) s" | tee -a "$OUT/timings.txt"
