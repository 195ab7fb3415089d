#!/usr/bin/env bash
# Multi-GPU training on one machine: bash tools/dist_train.sh CONFIG GPUS [train.py options]
set -euo pipefail
if [ $# -lt 2 ]; then echo "usage: $0 CONFIG GPUS [tools/train.py options]" >&2; exit 2; fi
CONFIG=$1
GPUS=$2
shift 2
PORT=${PORT:-29500}
DIR=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python}
exec "$PYTHON" -m torch.distributed.run --nnodes=1 --nproc_per_node="$GPUS" --master_port="$PORT" \
    "$DIR/train.py" "$CONFIG" --launcher pytorch "$@"
