#!/usr/bin/env bash
# One call on the GPU machine does it all: install the carried wheels (.devwheels, when there), build the ops
# with CUDA (and, when .peers/dain holds DAIN's DepthFlowProjection sources, DAIN's kernels beside
# it), run the benchmarks first on the idle GPU, then the whole test suite with compute-sanitizer
# (memcheck and racecheck) over the benchmarks/sanitize/sanitize_*.py drivers in parallel.
# Usage (repo root, on the device):
#   bash benchmarks/device_run.sh ["TESTS"] ["BENCHES"] ["SANITIZE SCRIPTS"]
# Each argument left out takes its default: TESTS `tests` (the whole suite; "" runs none),
# BENCHES the five op benchmarks, SANITIZE every benchmarks/sanitize/sanitize_*.py ("" runs none).
# Benchmarks and sanitizer drivers are given as paths (benchmarks/ops/bench_x.py) and run as
# modules.
# Environment: OUT (default /tmp/out), PYTEST_WORKERS (default 8), COMPILE_BYTECODE (1: compile the
# environment's bytecode first, as pip does at install), REDET_TEST_GPUS (spread the
# test workers over that many GPUs: tests/conftest.py), DAIN_SRC (default .peers/dain), DEADLINE_S (default 570:
# every step's time limit is cut so that the call ends by then; keep it under the call's limit).
# What comes back under $OUT (at most 8 files): the benchmarks' JSON (<name>.json), summary.txt
# and logs.tar.gz (every log: setup, build, DAIN build, benchmarks, tests, sanitizers).
set -uo pipefail
T0=$(date +%s)
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; LOGS="$OUT/logs"; mkdir -p "$LOGS"
DEFAULT_BENCHES="benchmarks/ops/bench_riroi_align_rotated.py benchmarks/ops/bench_roi_pool.py benchmarks/ops/bench_depth_flow_projection.py benchmarks/ops/bench_rotated_extractor.py benchmarks/ops/bench_horizontal_extractor.py"
TESTS="${1-tests}"; BENCHES="${2-$DEFAULT_BENCHES}"; SANITIZE="${3-$(ls benchmarks/sanitize/sanitize_*.py)}"
DAIN_SRC="${DAIN_SRC:-.peers/dain}"; DAIN_BUILD=/tmp/dain_build; DEADLINE_S="${DEADLINE_S:-570}"
export PYTHONUNBUFFERED=1
CALL_START=$T0; source "$(dirname "${BASH_SOURCE[0]}")/_deadline.sh"   # left, limit
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
finish() {
  tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
  say "done in $(( $(date +%s) - T0 )) s; under \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
}
trap finish EXIT
module() { local m="${1%.py}"; echo "${m//\//.}"; }           # benchmarks/ops/x.py -> benchmarks.ops.x

# A machine that reaches no package registry brings the OpenMMLab wheels in .devwheels/; elsewhere
# the stack is installed already.
if [ -d .devwheels ]; then
  source .devwheels/install_wheels.sh .devwheels > "$LOGS/setup.log" 2>&1 || { cat "$LOGS/setup.log"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv >> "$LOGS/setup.log"
# COMPILE_BYTECODE=1: the environment's bytecode compiled, as pip leaves an install. The GPU
# machine's python ships none and runs with PYTHONDONTWRITEBYTECODE=1, so without this every
# process compiles torch, sympy and the rest from source (seconds of each tool's start-up:
# benchmarks/profiling/startup_phases.py). About 20 s on 16 cores.
if [ "${COMPILE_BYTECODE:-0}" = 1 ]; then
  start=$(date +%s)
  timeout "$(limit 120)" python3 -m compileall -q -j 16 \
    "$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")" \
    $(echo "${PYTHONPATH:-}" | tr ":" " ") redet_plugin tools > "$LOGS/compileall.log" 2>&1
  say "bytecode compiled: $(( $(date +%s) - start )) s"
fi
source "$(dirname "${BASH_SOURCE[0]}")/_build_cxx.sh"  # CXX
export PYTHONPATH="$PWD:${PYTHONPATH:-}" TORCH_CUDA_ARCH_LIST=9.0
# DAIN's kernels (two files) build beside ours; the flow benchmark then loads them without compiling.
if [ -d "$DAIN_SRC" ]; then
  ( timeout "$(limit 300)" python3 -m benchmarks.ops._peer_build "$DAIN_SRC" --name dain_depthflowprojection_cuda \
      --build-dir "$DAIN_BUILD" > "$LOGS/dain_build.log" 2>&1; echo "dain build rc=$?" > "$LOGS/dain_build.rc" ) &
  DAIN_PID=$!
else
  say "no $DAIN_SRC: the flow benchmark times ours alone"
fi
start=$(date +%s)
FORCE_CUDA=1 MAX_JOBS=16 timeout "$(limit 400)" python3 setup.py build_ext --inplace > "$LOGS/build.log" 2>&1 \
  || { say "build failed"; tail -40 "$LOGS/build.log"; exit 1; }
say "build: $(( $(date +%s) - start )) s"
python3 -c "import torch, redet_plugin.ops; from redet_plugin import _ext; print('with_cuda', _ext.with_cuda(), torch.cuda.get_device_name())" | tee -a "$OUT/summary.txt"
if [ -n "${DAIN_PID:-}" ]; then
  wait "$DAIN_PID"; say "$(cat "$LOGS/dain_build.rc") ($(tail -1 "$LOGS/dain_build.log" | cut -c1-300))"
  rm -f "$DAIN_BUILD/lock"  # left by a build cut by its timeout, it would make the benchmark's load wait forever
fi

# Benchmarks first, on an otherwise idle GPU.
for b in $BENCHES; do
  name=$(basename "$b" .py); extra=""
  [ "$name" = bench_depth_flow_projection ] && [ -d "$DAIN_SRC" ] && extra="--dain-src $DAIN_SRC --dain-build-dir $DAIN_BUILD"
  # a reserve of 200 s is kept for the tests and sanitizers
  timeout "$(limit "${BENCH_TIMEOUT:-200}" 200)" python3 -m "$(module "$b")" \
    --out "$OUT/${name#bench_}.json" $extra > "$LOGS/${name}.log" 2>&1
  rc=$?; say "bench $b rc=$rc ($(( $(date +%s) - T0 )) s)"; [ $rc -ne 0 ] && tail -8 "$LOGS/${name}.log"
done
# compute-sanitizer runs (slow, one process each) go in the background while the tests run.
sanitize() {
  local log="$LOGS/$(basename "$1" .py)_$2.log"
  timeout "$(limit "${SANITIZE_TIMEOUT:-300}" 15)" compute-sanitizer --tool "$2" --error-exitcode 9 python3 -m "$(module "$1")" > "$log" 2>&1
  echo "sanitize $1 $2 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)" > "$log.summary"
}
for s in $SANITIZE; do for tool in memcheck racecheck; do sanitize "$s" $tool & done; done
if [ -n "$TESTS" ]; then
  # SIGINT: pytest still prints its summary when the time limit cuts it
  # (a test worker stuck after its last test writes its stacks to $LOGS: tests/conftest.py)
  REDET_TEST_HANG_DIR="$LOGS" timeout -s INT "$(limit 900 15)" python3 -m pytest -q -rfE --durations=40 -n "${PYTEST_WORKERS:-8}" -p no:cacheprovider $TESTS > "$LOGS/tests.log" 2>&1
  say "tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$LOGS/tests.log" | tail -30 | tee -a "$OUT/summary.txt"
fi
wait; cat "$LOGS"/*.summary 2>/dev/null | tee -a "$OUT/summary.txt"; rm -f "$LOGS"/*.summary
