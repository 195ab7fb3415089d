#!/usr/bin/env bash
# The detector on the GPU (issue 7): synthetic 1024^2 data, the R50 ReDet config trained for
# EPOCHS epochs (200 iterations each at batch 2) in fp32, with --amp, and, on a machine with 2+
# GPUs, with tools/dist_train.sh on 2 GPUs (batch 2 per GPU); each run evaluated with tools/test.py.
# Run after benchmarks/device_run.sh has built the CUDA ops (same machine, same call).
# Usage: bash benchmarks/detector_gpu_run.sh [EPOCHS] [MODES]; logs and JSON go to $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
EPOCHS="${1:-1}"; MODES="${2:-fp32 amp dist2}"
export PYTHON=python3
# the OpenMMLab wheels device_run.sh installed into /tmp/site (its environment is not ours)
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
CONFIG=configs/redet/redet_re50_refpn_synthetic1024.py
DATA=data/synthetic_dota_1024
[ -d "$DATA/train" ] || python3 tools/data/make_synthetic_dota.py "$DATA" --image-size 1024 \
  --num-train 400 --num-val 50 > "$OUT/detector_data.log" 2>&1 || { tail "$OUT/detector_data.log"; exit 1; }
GPUS=$(nvidia-smi -L | wc -l)
for mode in $MODES; do
  work=work_dirs/r50_$mode; train="python3 tools/train.py $CONFIG"
  [ $mode = dist2 ] && { [ "$GPUS" -ge 2 ] || { echo "dist2: only $GPUS GPU"; continue; }; train="bash tools/dist_train.sh $CONFIG 2"; }
  [ $mode = amp ] && train="$train --amp"
  start=$(date +%s)
  $train --work-dir $work --cfg-options train_cfg.max_epochs=$EPOCHS train_cfg.val_interval=$EPOCHS \
    train_dataloader.num_workers=6 > "$OUT/detector_train_$mode.log" 2>&1
  echo "train $mode rc=$? $(( $(date +%s) - start )) s"; grep -E "Error|error:" "$OUT/detector_train_$mode.log" | tail -3
  python3 benchmarks/summarize_training.py $work --batch-size $([ $mode = dist2 ] && echo 4 || echo 2) --out "$OUT/detector_train_$mode.json" | cut -c1-400
  python3 tools/test.py $CONFIG $work/epoch_$EPOCHS.pth --work-dir ${work}_test > "$OUT/detector_test_$mode.log" 2>&1
  echo "test $mode rc=$?"; grep -E "mAP|\| " "$OUT/detector_test_$mode.log" | tail -10
done
python3 tools/analysis/plot_curves.py work_dirs/r50_fp32 --out "$OUT/detector_curves.png" > /dev/null 2>&1
