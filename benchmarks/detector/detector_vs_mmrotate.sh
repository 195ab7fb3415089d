#!/usr/bin/env bash
# On the GPU machine, after benchmarks/device_run.sh installed the wheels and built the CUDA ops
# (same call): our ReDet vs mmrotate's (benchmarks/detector/bench_detector_vs_mmrotate.py; options
# are passed on), then the per-part profile of ours (benchmarks/profiling/profile_detector.py).
# Usage (repo root): export CALL_START=$(date +%s); bash benchmarks/device_run.sh "" "" "" &&
#   bash benchmarks/detector/detector_vs_mmrotate.sh [bench options]
# Environment: OUT (default /tmp/out); CALL_START (epoch seconds the call began, default now) and
# DEADLINE_S (default 585): everything ends by CALL_START + DEADLINE_S, the profile keeping
# PROFILE_S (default 100) of it; PROFILE_ARGS (e.g. --captured) go to the profile. Under $OUT:
# detector_vs_mmrotate.json, profile_detector.json, detector_summary.txt and
# detector_logs.tar.gz (training/test logs, the derived configs).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; LOGS="$OUT/detector_logs"; mkdir -p "$LOGS"
CALL_START="${CALL_START:-$(date +%s)}"; DEADLINE_S="${DEADLINE_S:-585}"; PROFILE_S="${PROFILE_S:-100}"
source "$(dirname "${BASH_SOURCE[0]}")/../_deadline.sh"  # left, limit
say() { echo "$*" | tee -a "$OUT/detector_summary.txt"; }
finish() { tar -czf "$OUT/detector_logs.tar.gz" -C "$OUT" detector_logs && rm -rf "$LOGS"; }
trap finish EXIT
# the OpenMMLab wheels device_run.sh installed into /tmp/site (its shell's environment is gone)
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
start=$(date +%s)
python3 -m benchmarks.detector.bench_detector_vs_mmrotate --out "$OUT/detector_vs_mmrotate.json" \
  --log-dir "$LOGS" --budget-s $(( $(left) - PROFILE_S )) "$@" > "$LOGS/bench.log" 2>&1
say "bench rc=$? $(( $(date +%s) - start )) s"; tail -45 "$LOGS/bench.log" | tee -a "$OUT/detector_summary.txt"
# The profile takes the bench's data and image size, and for inference the weights its `ours` run
# (else another of ours, fp32 first) trained (an untrained head floods the NMS with boxes).
read -r DATA RESIZE CKPT < <(python3 -c "
import json, os
r = json.load(open('$OUT/detector_vs_mmrotate.json'))
s = r['settings']
ours = sorted((n for n in r['runs'] if n.startswith('ours')), key=lambda n: (n != 'ours', 'amp' in n))
ckpts = [os.path.join(r['runs'][n].get('train', {}).get('work_dir', ''), 'iter_%d.pth' % s['iters'])
         for n in ours]
print(s['data_root'], s['resize'], next((c for c in ckpts if os.path.isfile(c)), ''))" 2>/dev/null)
start=$(date +%s)
timeout $(( $(left) > 10 ? $(left) - 5 : 5 )) python3 -m benchmarks.profiling.profile_detector \
  --out "$OUT/profile_detector.json" ${DATA:+--data-root "$DATA" --resize "$RESIZE"} \
  ${CKPT:+--checkpoint "$CKPT"} ${PROFILE_ARGS:-} > "$LOGS/profile.log" 2>&1
say "profile rc=$? $(( $(date +%s) - start )) s"; tail -75 "$LOGS/profile.log" | tee -a "$OUT/detector_summary.txt"
