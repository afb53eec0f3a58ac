#!/usr/bin/env bash
# The GPU runs of this folder, each one command of at most 600 s on a fresh machine. From the
# repository root, first (no GPU needed):
#
#     bash records/prepared/measure.sh trees    # trees/NAME: main's files with patches applied
#
# then, on the GPU machine, in the work tree with records/prepared/trees copied into it, with a
# 600 s limit:
#
#     bash records/prepared/measure.sh run1
#
# run1: main's GPU path checked, and the head in chunks (after: head_chunks.patch) and read once
# (onepass: head_one_pass.patch after it). Each step's whole output goes to its own file under
# $OUT as it runs, so a call cut short still brings back the steps before; the steps stop
# themselves by 570 s, the ones that matter most first. Printed: the card, then one line per
# step with its exit code, and for each benchmark which code ran the head and the MLPs.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
FILES="train_gpt.py README.md pytest.ini tests benchmarks data/shakespeare data/synthetic_fineweb.py"
# each tree: the patches it takes, in order
declare -A TREES=([after]="head_chunks.patch" [onepass]="head_chunks.patch head_one_pass.patch")

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
run1)
    out=${OUT:-/tmp/measure_out} && mkdir -p "$out"
    started=$SECONDS
    for tree in "${!TREES[@]}"; do
        [ -d "$here/trees/$tree" ] || { echo "no trees/$tree: run 'measure.sh trees' here first" >&2; exit 1; }
    done
    sha256sum --quiet -c "$here/trees/main.sha256" \
        || { echo "main differs from the trees' main: make the trees again" >&2; exit 1; }
    export PYTHONUNBUFFERED=1
    { nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__,
torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))"; } > "$out/card.txt" 2>&1
    grep -E "NVIDIA|_CudaDeviceProperties" "$out/card.txt" || tail -3 "$out/card.txt"

    step() {  # NAME LIMIT DIR COMMAND...: its output to $OUT/NAME.txt; skipped past 570 s
        local name=$1 limit=$2 dir=$3 left=$((570 - (SECONDS - started))) rc
        shift 3
        [ "$left" -lt 30 ] && { echo "$name: skipped, $left s left"; return 1; }
        [ "$limit" -gt "$left" ] && limit=$left
        (cd "$dir" && timeout -k 10 "$limit" "$@") > "$out/$name.txt" 2>&1
        rc=$?
        echo "$name: rc $rc at $((SECONDS - started)) s; $(tail -1 "$out/$name.txt")"
        return $rc
    }
    bench() {  # NAME DIR: one micro-batch a step; all share one compile cache, cold for the first
        local left=$((570 - (SECONDS - started)))  # a compile cut short measures nothing
        [ "$left" -lt 75 ] && { echo "bench_$1: skipped, $left s left"; return 1; }
        TORCHINDUCTOR_CACHE_DIR=/tmp/cache_bench TRITON_CACHE_DIR=/tmp/triton_bench \
            step "bench_$1" 150 "$2" "${bench[@]}" --json="$out/bench_$1.json" \
            && grep -E "^(runs|ms_forward|peak_memory|compile)" "$out/bench_$1.txt"
    }
    # the tests compile in caches of their own, so that main's benchmark starts cold
    export TORCHINDUCTOR_CACHE_DIR=/tmp/cache_tests TRITON_CACHE_DIR=/tmp/triton_tests
    pytest=(python3 -m pytest -q -s -rs -o addopts= -p no:cacheprovider --durations=5)
    tests=(tests/test_kernels.py tests/test_gpu.py tests/test_copies.py)
    # the kernel tests on CUDA at small shapes (the builds for every target are the CPU's), and
    # the head kernel at the largest cap it takes
    small="(test_kernels and not every_gpu and not without_triton) or largest_cap"
    python3 data/synthetic_fineweb.py 1 --tokens 4000000 --val-tokens 200000 --dir /tmp/shards \
        > "$out/shards.txt" 2>&1
    ls /tmp/shards/synthetic_train_*.bin > /dev/null || echo "no shards: see shards.txt"
    bench=(python3 benchmarks/bench_step.py --batch_size=65536 --steps=10
           "--train_files=/tmp/shards/synthetic_train_*.bin")

    # 1. main: which kernels run (the log and the H100's settings), the kernels at the real
    #    shapes against fp32 (the two smaller MLP settings forced), the compiled model
    step main_tests 240 "$root" "${pytest[@]}" tests/test_gpu.py \
        -k "steady or h100 or fused or zero_head or compiled_bf16"
    # 2. the head in chunks: its tests on CUDA (opcheck reaches torch.addmm with out_dtype) and
    #    at the real shapes
    step after_tests 120 "$here/trees/after" "${pytest[@]}" "${tests[@]}" \
        -k "$small or fused_head or zero_head"
    after_ok=$?
    # 3. main from a cold cache, the head in chunks, main again for the spread
    bench main "$root"
    [ $after_ok -eq 0 ] && bench after "$here/trees/after"
    bench main_2 "$root"
    # 4. the head read once, if time is left: its tests and benchmark, then the steps' order
    #    and no recompile, which its keeping does not wait for
    step onepass_tests 120 "$here/trees/onepass" "${pytest[@]}" "${tests[@]}" \
        -k "$small or fused_head or zero_head"
    onepass_ok=$?
    [ $onepass_ok -eq 0 ] && bench onepass "$here/trees/onepass"
    step onepass_steps 120 "$here/trees/onepass" "${pytest[@]}" tests/test_gpu.py \
        -k "steady or recompile"
    echo "done at $((SECONDS - started)) s"
    ;;
*)
    echo "usage: bash records/prepared/measure.sh trees|run1" >&2
    exit 2
    ;;
esac
