#!/usr/bin/env bash
# On the GPU machine, after benchmarks/device_run.sh installed the wheels and built the CUDA ops
# (same call): our ReDet vs mmrotate's (benchmarks/bench_detector_vs_mmrotate.py, options passed
# on), then the per-part profile of ours (benchmarks/profile_detector.py). JSON and logs go to $OUT.
# Usage: bash benchmarks/detector_vs_mmrotate.sh [bench_detector_vs_mmrotate.py options]
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
# the OpenMMLab wheels device_run.sh installed into /tmp/site (its shell's environment is gone)
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
start=$(date +%s)
python3 benchmarks/bench_detector_vs_mmrotate.py --out "$OUT/detector_vs_mmrotate.json" \
  --log-dir "$OUT/detector_vs_mmrotate" "$@" 2>&1 | tail -60
echo "bench: $(( $(date +%s) - start )) s"; start=$(date +%s)
# inference is profiled with the weights the bench's own run trained (an untrained head floods the NMS)
ckpt=$(ls work_dirs/detector_vs_mmrotate/ours/iter_*.pth 2>/dev/null | tail -1)
python3 benchmarks/profile_detector.py --out "$OUT/profile_detector.json" ${ckpt:+--checkpoint "$ckpt"} \
  > "$OUT/profile_detector.log" 2>&1; echo "profile rc=$? $(( $(date +%s) - start )) s"
tail -75 "$OUT/profile_detector.log"
