#!/usr/bin/env bash
# Issue 7's one GPU run (the device tool lends an H200 in some tasks): calibrate, then
# validate, with --device cuda; budget under 8 minutes. Run from the repository root:
#   bash benchmarks/gpu_validate.sh
# Writes hardware_profiles/calibrated/h200-measured.yaml, the raw measurements and the report
# under benchmarks/validation/. NOT YET RUN: no GPU was lent when it was written.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/validation
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$out/h200-nvidia-smi.txt"
timeout 330 kvsim calibrate --device cuda --base h200-sxm \
    --out hardware_profiles/calibrated/h200-measured.yaml --raw "$out/h200.measurements.csv"
timeout 120 kvsim validate --device cuda --profile hardware_profiles/calibrated/h200-measured.yaml \
    --baseline h200-sxm --out "$out/h200-report"
