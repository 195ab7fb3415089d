#!/usr/bin/env bash
# One call on the GPU machine: install the carried wheels, build with CUDA, run the benchmarks,
# then the tests with compute-sanitizer (memcheck, racecheck) over the sanitize_*.py drivers in
# parallel; logs and JSON go to $OUT.
# Usage (repo root, on the device): bash benchmarks/device_run.sh "TESTS" "BENCHES" "SANITIZE SCRIPTS"
# (an empty TESTS runs no tests; left out, tests/test_ops).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
TESTS="${1-tests/test_ops}"; BENCHES="${2:-}"; SANITIZE="${3:-}"
export PYTHONUNBUFFERED=1
source .devwheels/install_wheels.sh .devwheels > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv >> "$OUT/setup.log"
# The image's default CXX (/opt/gcc/bin/g++ wrapper) links no shared libstdc++: C++ errors then crash.
[ -x /usr/bin/g++ ] && export CXX_OVERRIDE="${CXX_OVERRIDE:-/usr/bin/g++}"
start=$(date +%s)
CXX="${CXX_OVERRIDE:-${CXX:-c++}}" FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
python3 -c "import redet_plugin, torch; from redet_plugin import _ext; print('with_cuda', _ext.with_cuda(), torch.cuda.get_device_name())"
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
# Benchmarks first, on an otherwise idle GPU.
for b in $BENCHES; do
  name=$(basename "$b" .py); timeout "${BENCH_TIMEOUT:-200}" python3 "$b" --out "$OUT/${name#bench_}.json" > "$OUT/${name}.log" 2>&1; echo "bench $b rc=$?"
done
# compute-sanitizer runs (slow, one process each) go in the background while the tests run.
sanitize() {
  local log="$OUT/sanitize_$(basename $1 .py)_$2.log"
  timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool $2 --error-exitcode 9 python3 "$1" > "$log" 2>&1
  echo "sanitize $1 $2 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)" > "$log.summary"
}
for s in $SANITIZE; do for tool in memcheck racecheck; do sanitize "$s" $tool & done; done
[ -n "$TESTS" ] && timeout 900 python3 -m pytest -q -n 8 -p no:cacheprovider $TESTS > "$OUT/tests.log" 2>&1; echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -30
wait; cat "$OUT"/*.summary 2>/dev/null; rm -f "$OUT"/*.summary
