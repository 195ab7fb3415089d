#!/usr/bin/env bash
# On the GPU machine, after benchmarks/device_run.sh "" "" "" (same call): what a user gets from
# the R50 config as shipped, each step's JSON written under $OUT as soon as it ends (a call cut
# short keeps what ran):
#   1. detector_vs_mmrotate.json: ours as shipped (fp32 and --amp) against mmrotate's ReDet,
#      each through its own tools/train.py and tools/test.py (bench_detector_vs_mmrotate.py)
#   2. compiled_package.json: the exported program and AOTInductor package against the model as
#      tools/test.py runs it, on the checkpoint step 1 trained, and against mmrotate's test.py on
#      mmrotate's checkpoint from step 1 (bench_compiled_package.py)
#   3. test_data_loading.json: the test-time loader (batch 1, the config's workers) by worker count
#   4. startup.json: tools/train.py and tools/test.py from their start to their first steps
#   5. hrsc_vs_mmrotate.json: the HRSC2016 configs of both projects on generated HRSC2016-layout
#      data, ours tested every 40 iterations during training (its mAP curve)
# Usage (repo root): export CALL_START=$(date +%s); bash benchmarks/device_run.sh "" "" "" &&
#   bash benchmarks/measure_shipped_configs.sh
# Environment: OUT (default /tmp/out), CALL_START (default now), DEADLINE_S (default 585),
# ITERS (training iterations per run, default 120), STEPS (which steps run, default "1 2 3 4 5").
set -uo pipefail
OUT="${OUT:-/tmp/out}"; LOGS="$OUT/measure_logs"; mkdir -p "$LOGS"
CALL_START="${CALL_START:-$(date +%s)}"; DEADLINE_S="${DEADLINE_S:-585}"; ITERS="${ITERS:-120}"
STEPS="${STEPS:-1 2 3 4 5}"
source "$(dirname "${BASH_SOURCE[0]}")/_deadline.sh"  # left, limit
say() { echo "$*" | tee -a "$OUT/measure_summary.txt"; }
finish() { tar -czf "$OUT/measure_logs.tar.gz" -C "$OUT" measure_logs && rm -rf "$LOGS"; }
trap finish EXIT
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
source "$(dirname "${BASH_SOURCE[0]}")/_build_cxx.sh"  # CXX
DATA="$PWD/data/synthetic_dota_1024"; WORK="$PWD/work_dirs/shipped"
has() { [[ " $STEPS " == *" $1 "* ]]; }
# the data set of every step (step 1's bench adds the peer's labels)
if [ ! -d "$DATA/train/labelTxt" ]; then
  python3 tools/dataset_converters/make_synthetic_dota.py "$DATA" --image-size 1024 --num-train 16 \
    --num-val 30 > "$LOGS/make_data.log" 2>&1 || { say "making $DATA failed"; tail -5 "$LOGS/make_data.log"; exit 1; }
fi

if has 1; then
  start=$(date +%s)
  python3 -m benchmarks.detector.bench_detector_vs_mmrotate --runs mmrotate ours ours_amp \
    --iters "$ITERS" --num-train 16 --num-val 30 --data-root "$DATA" --work-root "$WORK" \
    --out "$OUT/detector_vs_mmrotate.json" --log-dir "$LOGS/detector" \
    --budget-s "$(limit 330 120)" > "$LOGS/detector.log" 2>&1
  say "detector vs mmrotate rc=$? $(( $(date +%s) - start )) s"; tail -25 "$LOGS/detector.log" | tee -a "$OUT/measure_summary.txt"
fi
if has 2; then
  CKPT="$WORK/ours/iter_$ITERS.pth"; [ -f "$CKPT" ] || CKPT=""
  PEER_CKPT="$WORK/mmrotate/iter_$ITERS.pth"; [ -f "$PEER_CKPT" ] || PEER_CKPT=""
  start=$(date +%s)
  timeout "$(limit 480 15)" python3 -m benchmarks.deploy.bench_compiled_package \
    --out "$OUT/compiled_package.json" --data-root "$DATA" --work-dir "$WORK/packages" \
    ${CKPT:+--checkpoint "$CKPT"} ${PEER_CKPT:+--mmrotate-checkpoint "$PEER_CKPT"} \
    > "$LOGS/compiled_package.log" 2>&1
  say "compiled package rc=$? $(( $(date +%s) - start )) s"; grep -E "ms / image|failed" "$LOGS/compiled_package.log" | tee -a "$OUT/measure_summary.txt"
fi
if has 3; then
  start=$(date +%s)
  timeout "$(limit 90 30)" python3 -m benchmarks.detector.bench_data_loading --loader val_dataloader \
    --data-root "$DATA" --workers 2 8 14 --out "$OUT/test_data_loading.json" > "$LOGS/data_loading.log" 2>&1
  say "data loading rc=$? $(( $(date +%s) - start )) s"; grep workers "$LOGS/data_loading.log" | tee -a "$OUT/measure_summary.txt"
fi
if has 4; then
  start=$(date +%s)
  timeout "$(limit 240 5)" python3 -m benchmarks.profiling.startup_phases --data-root "$DATA/" \
    --out "$OUT/startup.json" > "$LOGS/startup.log" 2>&1
  say "startup rc=$? $(( $(date +%s) - start )) s"; tail -5 "$LOGS/startup.log" | tee -a "$OUT/measure_summary.txt"
fi
if has 5; then
  start=$(date +%s)
  # the bench's budget ends its runs; the outer limit, later (the bench's imports come before its
  # budget starts), only catches a hang
  timeout "$(limit 360 30)" python3 -m benchmarks.detector.bench_detector_vs_mmrotate --dataset hrsc \
    --runs ours mmrotate --iters 200 --val-interval 40 --min-iters-for-map 200 --num-train 60 --num-val 20 \
    --work-root "$PWD/work_dirs/hrsc" --out "$OUT/hrsc_vs_mmrotate.json" --log-dir "$LOGS/hrsc" \
    --budget-s "$(limit 330 60)" > "$LOGS/hrsc.log" 2>&1
  say "hrsc vs mmrotate rc=$? $(( $(date +%s) - start )) s"; grep -E "s/iter|rc=" "$LOGS/hrsc.log" | tee -a "$OUT/measure_summary.txt"
fi
