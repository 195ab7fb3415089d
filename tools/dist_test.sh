#!/usr/bin/env bash
# Multi-GPU testing with torchrun: bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py options]
# GPUS processes on this host. Several hosts: run it on each with NNODES (hosts), NODE_RANK
# (0 .. NNODES-1) and MASTER_ADDR (host 0's address) set; PORT (default 29500) must be free
# there and the same on every host. Without a GPU the processes run on the CPU (gloo).
set -euo pipefail
if [ $# -lt 3 ]; then echo "usage: $0 CONFIG CHECKPOINT GPUS [tools/test.py options]" >&2; exit 2; fi
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
shift 3
PORT=${PORT:-29500}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
DIR=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python}
exec "$PYTHON" -m torch.distributed.run --nnodes="$NNODES" --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" --master_port="$PORT" --nproc_per_node="$GPUS" \
    "$DIR/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
