#!/usr/bin/env bash
# The GPU run of this folder, one command of at most 600 s on a fresh machine. From the
# repository root, first (no GPU needed):
#
#     bash records/prepared/measure.sh trees    # trees/NAME: main's files with patches applied
#
# then, on the GPU machine, in the work tree with records/prepared/trees copied into it, with a
# 600 s limit:
#
#     bash records/prepared/measure.sh run2
#
# run2: the head read once (onepass: head_chunks.patch, then head_one_pass.patch) against the
# head in chunks alone (after) and main, then q, k and v from one product (qkv). Each step's
# whole output goes to its own file, and all of them into $OUT/outputs.tar.gz after each step
# (the device brings back at most 8 files), so a call cut short still brings back the steps
# before; the steps stop themselves by 570 s, the ones that matter most first. Printed: the
# card, then one line per step with its exit code, and for each benchmark which code ran the
# head and the MLPs, its forward+backward and its peak.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
FILES="train_gpt.py README.md pytest.ini tests benchmarks data/shakespeare data/synthetic_fineweb.py"
# each tree: the patches it takes, in order
declare -A TREES=([after]="head_chunks.patch" [onepass]="head_chunks.patch head_one_pass.patch"
                  [qkv]="qkv.patch")

case "${1:-}" in
trees)
    rm -rf "$here/trees" && mkdir -p "$here/trees"
    for tree in "${!TREES[@]}"; do
        mkdir "$here/trees/$tree"
        # shellcheck disable=SC2086  # FILES is a list of paths
        cp -r --parents $FILES "$here/trees/$tree/"
        for patch in ${TREES[$tree]}; do
            git apply --directory="records/prepared/trees/$tree" "$here/$patch" \
                || { echo "$patch does not apply to main in trees/$tree: remake it" >&2; exit 1; }
        done
    done
    # shellcheck disable=SC2046,SC2086
    sha256sum $(git ls-files $FILES) > "$here/trees/main.sha256"
    echo "made ${!TREES[*]} in $here/trees ($(du -sh "$here/trees" | cut -f1))"
    ;;
run2)
    out=${OUT:-/tmp/measure_out} && mkdir -p "$out"
    work=/tmp/measure_work && rm -rf "$work" && mkdir -p "$work"  # archived into $out
    started=$SECONDS
    for tree in "${!TREES[@]}"; do
        [ -d "$here/trees/$tree" ] || { echo "no trees/$tree: run 'measure.sh trees' here first" >&2; exit 1; }
    done
    sha256sum --quiet -c "$here/trees/main.sha256" \
        || { echo "main differs from the trees' main: make the trees again" >&2; exit 1; }
    export PYTHONUNBUFFERED=1
    archive() {  # replaced whole, so that a kill while it writes keeps the last one
        tar -czf "$out/.outputs.tmp" -C "$work" . && mv -f "$out/.outputs.tmp" "$out/outputs.tar.gz"
    }
    { timeout 60 nvidia-smi; timeout 60 python3 -c "import torch, triton; print(torch.__version__, triton.__version__,
torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))"; } > "$work/card.txt" 2>&1
    grep -E "NVIDIA|_CudaDeviceProperties" "$work/card.txt" || tail -3 "$work/card.txt"
    archive

    step() {  # NAME LIMIT DIR COMMAND...: its output to NAME.txt, then archived; none past 570 s
        local name=$1 limit=$2 dir=$3 left=$((570 - (SECONDS - started))) rc
        shift 3
        [ "$left" -lt 30 ] && { echo "$name: skipped, $left s left"; return 1; }
        [ "$limit" -gt "$left" ] && limit=$left
        (cd "$dir" && timeout -k 10 "$limit" "$@") > "$work/$name.txt" 2>&1
        rc=$?
        archive
        echo "$name: rc $rc at $((SECONDS - started)) s; $(tail -1 "$work/$name.txt")"
        return $rc
    }
    bench() {  # NAME DIR NEED: one micro-batch a step; all share one compile cache, cold for
        # the first; it starts only with the NEED seconds it is predicted to take, and 10 more:
        # a compile cut short measures nothing
        local left=$((570 - (SECONDS - started)))
        [ "$left" -lt $(($3 + 10)) ] && { echo "bench_$1: skipped, $left s left"; return 1; }
        TORCHINDUCTOR_CACHE_DIR=/tmp/cache_bench TRITON_CACHE_DIR=/tmp/triton_bench \
            step "bench_$1" 150 "$2" "${bench[@]}" --json="$work/bench_$1.json" \
            && grep -E "^(runs|ms_forward|peak_memory|compile)" "$work/bench_$1.txt"
    }
    # the tests compile in caches of their own, so that main's benchmark starts cold
    export TORCHINDUCTOR_CACHE_DIR=/tmp/cache_tests TRITON_CACHE_DIR=/tmp/triton_tests
    pytest=(python3 -m pytest -q -s -rs -o addopts= -p no:cacheprovider --durations=5)
    timeout 120 python3 data/synthetic_fineweb.py 1 --tokens 4000000 --val-tokens 200000 \
        --dir /tmp/shards > "$work/shards.txt" 2>&1
    archive
    ls /tmp/shards/synthetic_train_*.bin > /dev/null || echo "no shards: see shards.txt"
    bench=(python3 benchmarks/bench_step.py --batch_size=65536 --steps=10
           "--train_files=/tmp/shards/synthetic_train_*.bin")

    # 1. the head read once: the kernel tests on CUDA at small shapes (the builds for every
    #    target are the CPU's), the head kernel at the largest cap it takes, the head at the
    #    real shapes [40 s]
    step onepass_tests 120 "$here/trees/onepass" "${pytest[@]}" \
        tests/test_kernels.py tests/test_gpu.py tests/test_copies.py \
        -k "(test_kernels and not every_gpu and not without_triton) or largest_cap or fused_head or zero_head"
    onepass_ok=$?
    # 2. main from a cold cache, the head read once (if its tests pass), the head in chunks
    #    alone (its tests passed in run 1), main again for the spread
    bench main "$root" 100
    [ $onepass_ok -eq 0 ] && bench onepass "$here/trees/onepass" 90
    bench after "$here/trees/after" 90
    bench main_2 "$root" 40
    # 3. q, k and v from one product: the compiled model against fp32, then its benchmark
    step qkv_tests 120 "$here/trees/qkv" "${pytest[@]}" tests/test_gpu.py -k compiled_bf16 \
        && bench qkv "$here/trees/qkv" 90
    echo "done at $((SECONDS - started)) s"
    ;;
*)
    echo "usage: bash records/prepared/measure.sh trees|run2" >&2
    exit 2
    ;;
esac
