#!/usr/bin/env bash
# The speedrun. On a machine with NVIDIA GPUs: fetch the FineWeb shards the run reads if missing
# (the reference run's 8; none for data elsewhere), then train on every GPU (NPROC_PER_NODE to
# use fewer). Without a usable GPU: the CPU smoke run instead.
# Extra arguments pass through to train_gpt.py, e.g. ./run.sh --num_iterations=100
set -euo pipefail
cd "$(dirname "$0")"
gpus=$(python -c "import torch; print(torch.cuda.device_count())")

# What every process of train_gpt.py "$@" would refuse on $1 processes, said once, before any starts
refuse_launch() {
    python -c 'import sys, train_gpt; sys.exit(train_gpt.launch_refusal(int(sys.argv[1]), sys.argv[2:]))' "$@"
}
if [ "$gpus" = 0 ]; then
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        echo "error: nvidia-smi sees a GPU but PyTorch does not (a CPU-only torch build, or a" \
             "driver/CUDA mismatch); fix that before training: python -c 'import torch; print(torch.version.cuda)'" >&2
        exit 1
    fi
    echo "No CUDA GPU here: running the CPU smoke run (python train_gpt.py --preset=smoke)." \
         "The real run, on a GPU machine: ./run.sh"
    if [ -n "${NPROC_PER_NODE:-}" ]; then
        several="torchrun --standalone --nproc_per_node=$NPROC_PER_NODE train_gpt.py --preset=smoke"
        if [[ ! $NPROC_PER_NODE =~ ^[0-9]+$ ]] ||  # torchrun's own words: auto, cpu
               refusal=$(refuse_launch "$NPROC_PER_NODE" --preset=smoke "$@" 2>&1); then
            echo "NPROC_PER_NODE counts GPUs; the smoke run is one process (several on a CPU: $several)"
        else
            echo "NPROC_PER_NODE counts GPUs; the smoke run is one process, and several on a CPU" \
                 "($several) would stop: ${refusal#error: }"
        fi
    fi
    # Keep freed memory in the process: fresh pages for every step's tensors cost more than the math.
    export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184
    exec python train_gpt.py --preset=smoke "$@"
fi
nproc="${NPROC_PER_NODE:-$gpus}"
if [[ $nproc =~ ^[0-9]+$ ]]; then  # not torchrun's own words (auto, gpu), which it resolves
    refuse_launch "$nproc" "$@"
fi
python data/cached_fineweb10B.py --for_run "$@"  # the shards this run reads, if missing
exec torchrun --standalone --nproc_per_node="$nproc" train_gpt.py "$@"
