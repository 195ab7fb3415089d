#!/usr/bin/env bash
# Installs everything the plugin needs into a virtual environment (default: ./.venv, or the
# active one when VIRTUAL_ENV is set), then builds the plugin in place. Re-running is quick.
#   bash scripts/install.sh          # CPU machine: torch 2.13.0 (CPU build), mmcv 2.1.0 with ops, ...
# Env: REDET_VENV=path  use another venv; MAX_JOBS=n  parallel compile jobs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VIRTUAL_ENV:-${REDET_VENV:-$ROOT/.venv}}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating virtual environment $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check -q)
# Pin torch so that no requirement can pull a (several GB) CUDA build on a CPU machine.
CONSTRAINTS="$VENV/redet-constraints.txt"
echo "torch==2.13.0" > "$CONSTRAINTS"
have() { "$PY" - "$@" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    if version(name).split("+")[0] != want:
        sys.exit(1)
PYEOF
}
if ! have torch==2.13.0 setuptools==81.0.0; then
  echo "[install] torch 2.13.0 (CPU) and build tools"
  "${PIP[@]}" -c "$CONSTRAINTS" torch==2.13.0 "setuptools==81.0.0" wheel ninja packaging
fi
if ! have mmcv==2.1.0; then
  WHEELS="$ROOT/../shared/wheels/cpu-cp311"
  if [ -d "$WHEELS" ] && ls "$WHEELS"/mmcv-2.1.0-*.whl >/dev/null 2>&1; then
    echo "[install] mmcv 2.1.0 from the shared wheel cache"
    "${PIP[@]}" -c "$CONSTRAINTS" --find-links "$WHEELS" mmcv==2.1.0
  else
    echo "[install] mmcv 2.1.0 from source with CPU ops (about 7 min on 2 cores)"
    MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS="${MAX_JOBS:-2}" CFLAGS="-O3 -DNDEBUG -fwrapv -g0" \
      "${PIP[@]}" -c "$CONSTRAINTS" --no-cache-dir --no-build-isolation mmcv==2.1.0
  fi
fi
if ! have mmengine==0.10.7 mmdet==3.3.0 e2cnn==0.2.3 isal==1.9.1 pytest==8.4.2 hypothesis==6.155.2; then
  echo "[install] mmengine, mmdet, e2cnn, isal, test tools"
  "${PIP[@]}" -c "$CONSTRAINTS" mmengine==0.10.7 mmdet==3.3.0 e2cnn==0.2.3 isal==1.9.1 \
    pytest==8.4.2 hypothesis==6.155.2 shapely opencv-python-headless matplotlib scipy tqdm
fi
# mmrotate (pure Python) for the interop tests; --no-deps: its requirements would pull torchvision
if ! have mmrotate-dev==1.0.1; then
  echo "[install] mmrotate-dev 1.0.1 (no dependencies)"
  "${PIP[@]}" -c "$CONSTRAINTS" --no-deps mmrotate-dev==1.0.1
fi
# Rebuild only when the plugin is not installed here or a source is newer than the built library.
SO=$(ls "$ROOT"/redet_plugin/_C*.so 2>/dev/null | head -1 || true)
INSTALLED=$(cd /tmp && "$PY" -c "import redet_plugin, os; print(os.path.dirname(os.path.dirname(redet_plugin.__file__)))" 2>/dev/null || true)
if [ -z "$SO" ] || [ "$INSTALLED" != "$ROOT" ] || [ -n "$(find "$ROOT/csrc" "$ROOT/setup.py" -newer "$SO" -print -quit)" ]; then
  echo "[install] building redet_plugin (C++ ops$( [ "${FORCE_CUDA:-0}" = 1 ] && echo ' + CUDA'))"
  MAX_JOBS="${MAX_JOBS:-2}" "${PIP[@]}" -c "$CONSTRAINTS" --no-build-isolation --use-pep517 --no-deps -e "$ROOT"
fi
"$PY" -c "import redet_plugin, torch; print('[install] ok: redet_plugin', redet_plugin.__version__, 'torch', torch.__version__)"
