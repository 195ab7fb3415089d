#!/usr/bin/env bash
# Compiles every CUDA kernel (csrc/**/cuda/*.cu) to an object file for sm_90 without linking.
# Works on a CPU-only machine with nvcc and a CPU build of torch (its headers include ATen/cuda):
# catches compile errors before a GPU machine is used. Usage: bash scripts/check_cuda_compile.sh [files]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VIRTUAL_ENV:-${REDET_VENV:-$ROOT/.venv}}"  # the environment scripts/run_tests.sh uses
PY="${PYTHON:-$( [ -x "$VENV/bin/python" ] && echo "$VENV/bin/python" || echo python3)}"
TORCH_INC=$("$PY" -c "import torch.utils.cpp_extension as e; print(' '.join('-I'+p for p in e.include_paths()))")
PY_INC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
OUT=$(mktemp -d)
# The CPU wheel of torch lacks this one generated CUDA header; an equivalent shim is enough to compile.
mkdir -p "$OUT/shim/c10/cuda/impl"
printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$OUT/shim/c10/cuda/impl/cuda_cmake_macros.h"
FILES=("$@"); [ ${#FILES[@]} -eq 0 ] && mapfile -t FILES < <(cd "$ROOT" && ls csrc/*/cuda/*.cu)
for f in "${FILES[@]}"; do
  echo "[nvcc] $f"
  nvcc -c "$ROOT/$f" -o "$OUT/$(echo "$f" | tr / _).o" -std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr \
    -DREDET_WITH_CUDA=1 -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H \
    -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ \
    -U__CUDA_NO_BFLOAT16_OPERATORS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__ \
    -I"$ROOT/csrc" $TORCH_INC -I"$OUT/shim" -I"$PY_INC" -Xptxas -v 2>&1 | grep -v "^ptxas info    : Function properties\|bytes stack frame" || { echo "FAILED: $f"; exit 1; }
done
rm -rf "$OUT"
