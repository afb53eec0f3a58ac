#!/usr/bin/env bash
# The next GPU runs: each one command of at most 600 s on a fresh machine with one GPU. From the
# repository root, right before it (no GPU needed; a commit after it stops the run):
#
#     bash records/prepared/measure.sh trees    # trees/NAME: main's files with patches applied,
#                                               # trees/baseline_3217f85: the script of 11-24
#
# then, on the GPU machine, in the work tree with the ignored records/prepared/trees copied
# into it, with a 600 s limit:
#
#     bash records/prepared/measure.sh a        # or b, the run after it
#
# a: main's GPU tests (its kernels section was rearranged on the CPU's evidence); the MLP
# kernel that keeps only relu(pre)^2 (keep_h: mlp_keep_h.patch) and, on top of it, one program
# an SM (persist: mlp_persistent.patch): their tests and their bits against main's kernel; then
# one micro-batch a step (bench_step.py): main from a cold cache, keep_h, main again, persist,
# the head 12,288 rows at a time, keep_h and those chunks together; last one MLP alone
# (bench_kernels.py).
# b: main, whole, against the train_gpt.py of 2026-11-24 (compare.py, twice each); three whole
# steps held to a 24 GB card's memory; the resume test.
# Each step's whole output goes to its own file, and all of them into $OUT/outputs.tar.gz
# (/tmp/measure_out without OUT) after each step; a step starts only with the time it needs
# left of BUDGET (570 s), the ones that matter most first. Printed: the card, then one line per
# step with its exit code, and for each benchmark which code ran the head and the MLPs (loudly
# where it is the torch code), its forward+backward and its peak.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
FILES="train_gpt.py README.md pytest.ini requirements.txt tests benchmarks data/shakespeare
       data/synthetic_fineweb.py"
BASELINE=3217f85  # main's train_gpt.py of 2026-11-24, the one compare.py runs against
# each tree: the patches it takes, in order
declare -A TREES=([keep_h]="mlp_keep_h.patch" [persist]="mlp_keep_h.patch mlp_persistent.patch"
                  [chunk12288]="head_chunk_12288.patch"
                  [both]="mlp_keep_h.patch head_chunk_12288.patch")

start_run() {  # the outputs' folders, the budget's clock, the card, the shards and step()
    out=${OUT:-/tmp/measure_out} && mkdir -p "$out"
    work=/tmp/measure_work && rm -rf "$work" && mkdir -p "$work"  # archived into $out
    started=$SECONDS budget=${BUDGET:-570}
    export PYTHONUNBUFFERED=1
    { timeout 60 nvidia-smi; timeout 60 python3 -c "import numpy, pytest, torch, triton
print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__,
      'pytest', pytest.__version__, 'cuda', torch.version.cuda)
print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))"; } > "$work/card.txt" 2>&1
    grep -E "NVIDIA|_CudaDeviceProperties|^torch" "$work/card.txt" || tail -3 "$work/card.txt"
    # the tests compile in caches of their own, so that a benchmark starts cold
    export TORCHINDUCTOR_CACHE_DIR=/tmp/cache_tests TRITON_CACHE_DIR=/tmp/triton_tests
    pytest=(python3 -m pytest -q -s -rs -o addopts= -p no:cacheprovider --durations=12
            -o faulthandler_timeout=150)
    timeout 120 python3 data/synthetic_fineweb.py 1 --tokens 8000000 --val-tokens 1048576 \
        --dir /tmp/shards > "$work/shards.txt" 2>&1
    archive
    ls /tmp/shards/synthetic_train_*.bin > /dev/null || echo "no shards: see shards.txt"
    shards=("--train_files=/tmp/shards/synthetic_train_*.bin"
            "--val_files=/tmp/shards/synthetic_val_*.bin" --val_tokens=1048576)
}
archive() {  # replaced whole, so that a kill while it writes keeps the last one
    tar -czf "$out/.outputs.tmp" -C "$work" . && mv -f "$out/.outputs.tmp" "$out/outputs.tar.gz"
}
step() {  # NAME NEED DIR COMMAND...: its output to NAME.txt, then archived; it starts only with
    # NEED seconds left of the budget, and is stopped (SIGINT first, so that pytest prints its
    # summary) at twice NEED or the budget's end
    local name=$1 need=$2 dir=$3 left=$((budget - (SECONDS - started))) limit rc
    shift 3
    [ "$left" -lt "$need" ] && { echo "$name: skipped, $left s left of $need needed"; return 1; }
    limit=$((2 * need < left ? 2 * need : left))
    (cd "$dir" && timeout -s INT -k 15 "$limit" "$@") > "$work/$name.txt" 2>&1
    rc=$?
    archive
    echo "$name: rc $rc at $((SECONDS - started)) s; $(tail -1 "$work/$name.txt")"
    return $rc
}

case "${1:-}" in
trees)
    rm -rf "$here/trees" && mkdir -p "$here/trees/baseline_$BASELINE"
    git show "$BASELINE:train_gpt.py" > "$here/trees/baseline_$BASELINE/train_gpt.py" || exit 1
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
    echo "made baseline_$BASELINE ${!TREES[*]} in $here/trees ($(du -sh "$here/trees" | cut -f1))"
    ;;
a)
    for tree in "${!TREES[@]}"; do
        [ -d "$here/trees/$tree" ] || { echo "no trees/$tree: run 'measure.sh trees' here first" >&2; exit 1; }
    done
    sha256sum --quiet -c "$here/trees/main.sha256" \
        || { echo "main differs from the trees' main: make the trees again" >&2; exit 1; }
    start_run
    bench() {  # NAME DIR NEED: one micro-batch a step; all share one compile cache, cold for
        # the first
        TORCHINDUCTOR_CACHE_DIR=/tmp/cache_bench TRITON_CACHE_DIR=/tmp/triton_bench \
            step "bench_$1" "$3" "$2" "${bench[@]}" --json="$work/bench_$1.json" || return 1
        grep -E "^(runs|ms_forward|peak_memory|compile)" "$work/bench_$1.txt"
        grep -q "torch code" "$work/bench_$1.txt" \
            && echo "!!! bench_$1 ran the torch code, not a kernel: its times are not the kernels'"
        return 0
    }
    bench=(python3 benchmarks/bench_step.py --batch_size=65536 --steps=10 "${shards[0]}")
    keep=$here/trees/keep_h persist=$here/trees/persist

    # 1. main's kernel tests on the GPU, first: the kernels and their dispatch at the real shapes,
    #    the compiled bf16 model against fp32 eager [100 s; run 1 and run 2: 63 s the model]
    kernel_tests="compiled_bf16 or head_kernel or zero_head or h100 or mlp_kernel"
    step main_tests 100 "$root" "${pytest[@]}" tests/test_gpu.py -k "$kernel_tests"
    # 2. keep_h, then persist: the MLP kernel's tests on CUDA, its op's schema and graph, the MLP
    #    at the real shape [30 s]; its output and gradients bit for bit [40 s], keep_h's against
    #    main's kernel, persist's against keep_h's. The bits stand for the compiled model
    #    against fp32, which main's tests run [60 s saved each]
    mlp_tests="(test_kernels and (relu_square or program or tile or registered_schema"
    mlp_tests+=" or one_graph) and not every_gpu) or mlp_kernel or h100"
    step keep_h_tests 30 "$keep" "${pytest[@]}" tests/test_kernels.py tests/test_gpu.py \
        -k "$mlp_tests"
    keep_ok=$?
    step keep_h_bits 40 "$root" python3 records/prepared/mlp_same_bits.py . "$keep"
    step persist_tests 30 "$persist" "${pytest[@]}" tests/test_kernels.py tests/test_gpu.py \
        -k "$mlp_tests"
    persist_ok=$?
    step persist_bits 40 "$root" python3 records/prepared/mlp_same_bits.py "$keep" "$persist"
    # 3. one micro-batch a step, each tree only if its tests passed (run 2: 83 s cold, 44 s
    #    warm, 64 to 82 s a tree of its own ops): main cold [100 s], keep_h [75 s], main again
    #    for the spread [50 s], persist [75 s], the head's chunks of 12,288 rows [70 s], keep_h
    #    with them [70 s]
    bench main "$root" 100
    [ $keep_ok -eq 0 ] && bench keep_h "$keep" 75
    bench main_2 "$root" 50
    [ $persist_ok -eq 0 ] && bench persist "$persist" 75
    bench chunk12288 "$here/trees/chunk12288" 70
    [ $keep_ok -eq 0 ] && bench both "$here/trees/both" 70
    # 4. one MLP alone, forward and backward: main, keep_h, persist, main [30 s each]
    declare -A dirs=([main]=$root [keep_h]=$keep [persist]=$persist [main_2]=$root)
    declare -A passed=([main]=0 [keep_h]=$keep_ok [persist]=$persist_ok [main_2]=0)
    for run in main keep_h persist main_2; do
        [ "${passed[$run]}" -eq 0 ] || continue
        step "mlp_$run" 30 "${dirs[$run]}" python3 benchmarks/bench_kernels.py --part=mlp \
            --json="$work/mlp_$run.json" && grep "the file's" "$work/mlp_$run.txt"
    done
    # 5. main's other GPU tests but the resume test and the peak's (run b's), if time is left:
    #    the loop's (renamed since run 2 on the CPU's evidence), Muon's, FlexAttention's [120 s]
    step main_other_tests 120 "$root" "${pytest[@]}" tests/test_gpu.py \
        -k "not resume and not compile_steps_leave and not ($kernel_tests)"
    echo "done at $((SECONDS - started)) s"
    ;;
b)
    baseline=$here/trees/baseline_$BASELINE/train_gpt.py
    [ -f "$baseline" ] || { echo "no $baseline: run 'measure.sh trees' here first" >&2; exit 1; }
    start_run
    # one compile cache for the whole run: cold for the comparison, then warm
    export TORCHINDUCTOR_CACHE_DIR=/tmp/cache_compare TRITON_CACHE_DIR=/tmp/triton_compare
    # 1. main against the baseline, whole, as users run them: 100 steps of one micro-batch, val
    #    at the end, A B A B, from the cold cache [330 s]
    step compare 330 "$root" python3 benchmarks/compare.py "$baseline" train_gpt.py \
        --runs=2 --out="$work/compare" -- --batch_size=65536 --num_iterations=100 \
        --val_every=0 "${shards[@]}"
    # 2. three whole steps of 524,288 tokens (8 micro-batches) with the process's allocator held
    #    to 22,500 MiB, a 24 GB card's budget beside its CUDA context; its log says the peak
    #    [90 s, the compile cache warm from main's runs]
    fit_24gb='import runpy, sys, torch
torch.cuda.set_per_process_memory_fraction(
    22500 * 2**20 / torch.cuda.get_device_properties(0).total_memory)
sys.argv[0] = "train_gpt.py"
runpy.run_path("train_gpt.py", run_name="__main__")'
    PYTORCH_ALLOC_CONF=expandable_segments:True step fit_24gb 90 "$root" python3 -c "$fit_24gb" \
        --num_iterations=3 --val_every=0 "${shards[@]}" --log_dir="$work/fit_24gb"
    grep -h "^peak memory consumption" "$work"/fit_24gb/*.txt
    # 3. the resume test: a run stopped at step 10 and resumed, against one that never stopped
    #    [180 s on an H100]
    step resume 180 "$root" "${pytest[@]}" tests/test_gpu.py -k resume
    echo "done at $((SECONDS - started)) s"
    ;;
*)
    echo "usage: bash records/prepared/measure.sh trees|a|b" >&2
    exit 2
    ;;
esac
