#!/usr/bin/env bash
# The speedrun: fetch the 8 FineWeb shards if missing, then train on every GPU of this machine.
# Extra arguments pass through to train_gpt.py, e.g. ./run.sh --num_iterations=100
set -euo pipefail
cd "$(dirname "$0")"
python data/cached_fineweb10B.py 8
exec torchrun --standalone --nproc_per_node="${NPROC_PER_NODE:-8}" train_gpt.py "$@"
