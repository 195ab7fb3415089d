#!/usr/bin/env bash
# On the GPU machine, after benchmarks/device_run.sh "" "" "" (same call): trains mmrotate's ReDet
# with its own tools on synthetic 1024² DOTA data (bench_detector_vs_mmrotate --runs mmrotate,
# which also tests it with mmrotate's tools/test.py), tests that checkpoint with our tools/test.py
# and the mmrotate-compatible config, then compares the two test forwards stage by stage
# (mmrotate_parity.py), and one huge image by patches against mmrotate's (bench_huge_image.py).
# Under $OUT: mmrotate_run.json, same_checkpoint_test.json (the two tools/test.py runs' times and
# mAPs), parity.json, huge_image.json, and the logs.
# Options: ITERS (200), NUM_TRAIN (200), NUM_VAL (60), IMAGES (20), HUGE (1; 0 skips the huge image).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
ITERS="${ITERS:-200}"; NUM_TRAIN="${NUM_TRAIN:-200}"; NUM_VAL="${NUM_VAL:-60}"; IMAGES="${IMAGES:-20}"
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
DATA="$PWD/data/synthetic_dota_1024"; WORK="$PWD/work_dirs/parity"
python3 -m benchmarks.detector.bench_detector_vs_mmrotate --runs mmrotate --iters "$ITERS" \
  --skip 20 --num-train "$NUM_TRAIN" --num-val "$NUM_VAL" --data-root "$DATA" \
  --work-root "$WORK" --out "$OUT/mmrotate_run.json" --log-dir "$OUT/bench_logs" > "$OUT/bench.log" 2>&1
echo "mmrotate run rc=$?"; tail -5 "$OUT/bench.log"
CKPT="$WORK/mmrotate/iter_$ITERS.pth"; THEIR_CONFIG="$OUT/bench_logs/configs/mmrotate.py"
cat > "$OUT/ours_test.py" <<EOF
_base_ = ['$PWD/configs/redet/redet-le90_re50_refpn_mmrotate-compat_1x_dota.py']
test_dataloader = dict(dataset=dict(data_root='$DATA/', ann_file='val/labelTxt/',
    data_prefix=dict(img_path='val/images/'), pipeline=_base_.val_pipeline))
test_evaluator = dict(_base_.val_evaluator, _delete_=True)  # the base's writes Task1 files only
# logged as mmrotate's test is (bench_detector_vs_mmrotate's configs): windows of 10 images
default_hooks = dict(logger=dict(interval=10))
log_processor = dict(window_size=10)
EOF
rm -rf "$WORK/ours_test"  # (a test log of an earlier call would be read as this one's)
python3 tools/test.py "$OUT/ours_test.py" "$CKPT" --work-dir "$WORK/ours_test" > "$OUT/ours_test.log" 2>&1
echo "our test rc=$?"; grep -E "mAP|dota/" "$OUT/ours_test.log" | tail -3
grep -E "mAP" "$OUT/bench_logs/test_mmrotate.log" | tail -2
# tools/test.py end to end, both on this checkpoint and these images
python3 -m benchmarks.detector.same_checkpoint_test --ours "$WORK/ours_test" \
  --mmrotate "$WORK/mmrotate_test" --checkpoint "$CKPT" --out "$OUT/same_checkpoint_test.json"
tar -czf "$OUT/parity_logs.tar.gz" -C "$OUT" bench_logs ours_test.log bench.log 2>/dev/null
python3 -m benchmarks.detector.mmrotate_parity --mmrotate-config "$THEIR_CONFIG" --checkpoint "$CKPT" \
  --our-config "$OUT/ours_test.py" --images "$IMAGES" --out "$OUT/parity.json" "$@" 2>&1 | tee "$OUT/parity.log" | grep -v Warning
# one 5120² mosaic of 25 of those images, by patches: ours against mmrotate's
# inference_detector_by_patches (HUGE=0 skips it)
if [ "${HUGE:-1}" != 0 ]; then
  python3 -m benchmarks.detector.bench_huge_image --checkpoint "$CKPT" --mmrotate-config "$THEIR_CONFIG" \
    --our-config "$OUT/ours_test.py" --data-root "$DATA/" --tiles 5 --out "$OUT/huge_image.json" \
    > "$OUT/huge_image.log" 2>&1
  echo "huge image rc=$?"; tail -30 "$OUT/huge_image.log" | grep -v Warning
fi
rm -rf "$OUT/bench_logs"  # (packed above; parity.py and the huge image read its mmrotate config)
