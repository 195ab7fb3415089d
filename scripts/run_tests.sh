#!/usr/bin/env bash
# The test command (README): installs what is missing (scripts/install.sh), then runs the test suite
# on the CPU; CUDA tests skip without a GPU. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install.sh"
VENV="${VIRTUAL_ENV:-${REDET_VENV:-$ROOT/.venv}}"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
