#!/usr/bin/env bash
# Each line a fresh process: without run.sh's allocator setting (freed pages go back), then with it.
set -euo pipefail
cd "$(dirname "$0")"
keep_freed="glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184"
for tunables in "" "$keep_freed"; do
    echo "GLIBC_TUNABLES=${tunables:-(unset)}"
    for model in "" "--no_attention_layers=0,1,2,3,4,5,6,7,8,9,10,11" "--no_attention_layers=" \
                 "--num_layers=1 --model_dim=64 --num_heads=1"; do
        # shellcheck disable=SC2086
        GLIBC_TUNABLES="$tunables" CUDA_VISIBLE_DEVICES= python measure.py 4096 $model
    done
done
