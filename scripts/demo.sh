#!/usr/bin/env bash
# README command 1: installs what is missing, then runs the demo on the CPU:
# the ops demo, then synthetic DOTA data -> train the tiny ReDet -> evaluate (mAP, pictures).
# Extra arguments go to scripts/demo_main.py (e.g. --quick, which works in work_dirs/demo_quick and
# data/synthetic_dota_quick, or --work-dir DIR).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install.sh"
VENV="${VIRTUAL_ENV:-${REDET_VENV:-$ROOT/.venv}}"
cd "$ROOT"
"$VENV/bin/python" scripts/demo_ops.py
# One OpenMP thread: on a 2-core machine shared with anything else, two threads per process
# slowed training iterations from 0.4 s to several seconds.
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$VENV/bin/python" scripts/demo_main.py "$@"
