#!/usr/bin/env bash
# Multi-GPU testing on one machine: bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py options]
set -euo pipefail
if [ $# -lt 3 ]; then echo "usage: $0 CONFIG CHECKPOINT GPUS [tools/test.py options]" >&2; exit 2; fi
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
shift 3
PORT=${PORT:-29500}
DIR=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python}
exec "$PYTHON" -m torch.distributed.run --nnodes=1 --nproc_per_node="$GPUS" --master_port="$PORT" \
    "$DIR/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
