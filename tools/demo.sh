#!/usr/bin/env bash
# README command 1: installs what is missing, then runs the project's main job on the CPU.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/install.sh"
VENV="${VIRTUAL_ENV:-${REDET_VENV:-$ROOT/.venv}}"
cd "$ROOT"
"$VENV/bin/python" tools/demo_ops.py
