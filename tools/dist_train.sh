#!/usr/bin/env bash
# Multi-GPU training with torchrun: bash tools/dist_train.sh CONFIG GPUS [train.py options]
# GPUS processes on this host. Several hosts: run it on each with NNODES (hosts), NODE_RANK
# (0 .. NNODES-1) and MASTER_ADDR (host 0's address) set; PORT (default 29500) must be free
# there and the same on every host. Without a GPU the processes run on the CPU (gloo).
set -euo pipefail
if [ $# -lt 2 ]; then echo "usage: $0 CONFIG GPUS [tools/train.py options]" >&2; exit 2; fi
CONFIG=$1
GPUS=$2
shift 2
PORT=${PORT:-29500}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
DIR=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python}
exec "$PYTHON" -m torch.distributed.run --nnodes="$NNODES" --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" --master_port="$PORT" --nproc_per_node="$GPUS" \
    "$DIR/train.py" "$CONFIG" --launcher pytorch "$@"
