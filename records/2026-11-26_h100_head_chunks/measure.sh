#!/usr/bin/env bash
# The head in row chunks and the head kernel's race fix, the map of the step, and the q, k and v
# of the attention from one product, on one GPU:
#     bash records/2026-11-26_h100_head_chunks/measure.sh PART OUT
# from a checkout of main that holds this folder. The change waits here as head_chunks.patch,
# made against main (README.md): AFTER is main with it applied, in /tmp/after; BEFORE is main as
# it is. A patch that main holds already (it comes off main's files in reverse) is skipped, so
# after a landing AFTER is main too. Each part is one device call of at most 600 s on a fresh
# machine (a session has 15 minutes of device time in all, starts included: one part a session,
# part 1 first); each step's time limit ends by 585 s, and a step that would start after 540 s
# is skipped, with a line that says so; each step's header says when it started. The outputs:
# the part's log, the tests' logs, and the JSON of the benchmarks in one archive (a call brings
# back 8 files at most).
#   1: versions; tests/test_gpu.py as main has it, first, as every GPU session runs it (a
#      traceback of every thread for a test past 150 s), all but its resume test (165 s alone
#      on 2026-11-24: with it, the file takes about 400 s), which part 5 runs; AFTER's head
#      tests on the GPU (tiny shapes in tests/test_kernels.py and tests/test_copies.py, the
#      real ones in tests/test_gpu.py); one micro-batch a step by bench_step.py, AFTER then
#      BEFORE, each from a cold compile cache (each tree's ops are named from its path: no
#      graph is shared), then BEFORE again (the spread), if time is left.
#   2: AFTER on the whole batch (8 micro-batches: what one GPU alone needs), AFTER at 4,096
#      and at 16,384 rows a chunk (its own file edited in place, so its cache holds), the head
#      alone by bench_kernels.py in both trees and in FAST (AFTER with head_fast_math.patch, in
#      /tmp/fast: the head kernel's exp and reciprocal without the handling of denormal
#      numbers), after FAST's bit-for-bit GPU test; the MLP kernel's sweep of launch settings
#      (the same kernel in every tree), with settings that fit two programs on an SM.
#   3: the map and the attention's one product (qkv.patch, applied to main in /tmp/qkv; it
#      applies after head_chunks.patch too): first BEFORE's step under the profiler, the map
#      (a compile of its own, as a profiled run compiles with Inductor's byte counts in its
#      kernels); QKV's GPU tests (the compiled bf16 model against fp32, no recompiles) and its
#      CPU test of the product's width; then one micro-batch a step, BEFORE then QKV from cold
#      caches, then both again (the spread: BEFORE's two runs).
#   4: the MLP kernel as one program an SM (mlp_persistent.patch, applied to main in
#      /tmp/persist): its GPU tests (the real shapes against fp32, the kernels' tests on the GPU:
#      opcheck, one compiled graph, the builds for every target); its outputs against main's
#      kernel, bit for bit (mlp_same_bits.py); one micro-batch a step, BEFORE then PERSIST from
#      cold caches, then BEFORE again (the spread); one MLP by bench_kernels.py, BEFORE, PERSIST,
#      BEFORE.
#   5: what bounds the kernels, read by Nsight Compute (kernel_bounds.py: main's MLP and head
#      with the cuBLAS products around them, and PERSIST's MLP; hardware counters, which a
#      Firecracker machine reads and a gVisor one does not); main's resume test on the GPU
#      (part 1 leaves it out); then the sweep of PERSIST's MLP settings, flattened and not
#      (about 150 s).
#   6: the head kernel reading each logit once (head_one_pass.patch, after head_chunks.patch,
#      in /tmp/onepass): its head tests on the GPU (tiny shapes, and the real ones against
#      fp32, and the zero head, whose loss and targets' entries a race would spoil), and that
#      its steps never wait for the GPU (its scatter and gathers included); one
#      micro-batch a step, AFTER then ONE_PASS from cold caches, then AFTER again (the
#      spread); the head alone by bench_kernels.py, AFTER, ONE_PASS, AFTER.
#   7: at the end, once what was kept has landed: benchmarks/compare.py, main against BEFORE.py
#      (a file in the tree: main's train_gpt.py from before this work, e.g. `git show
#      7887952:train_gpt.py >before_train_gpt.py`, untracked, which the device call carries),
#      100 steps of one micro-batch, two runs each.
set -uo pipefail
part=${1:?usage: measure.sh 1|2|3|4|5|6|7 OUT [BEFORE.py]} out=${2:?no OUT}
[[ $part =~ ^[1-7]$ ]] || { echo "PART is 1 to 7, not $part"; exit 1; }
if [ "$part" = 7 ]; then
    [ -f "${3:-}" ] || { echo "part 7 times main against BEFORE.py, main's train_gpt.py from before \
this work: measure.sh 7 OUT BEFORE.py"; exit 1; }
    before=$(realpath "$3")
fi
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" && out=$(realpath "$out")
cd "$here/../.."  # the repository root: BEFORE
exec > >(tee -a "$out/part$part.txt") 2>&1
export PYTHONUNBUFFERED=1
py=$(command -v python3 || command -v python)
in_time() {  # NAME: whether a step may still start; its header line if so
    (( SECONDS <= 540 )) || { echo "== $1 skipped: ${SECONDS}s gone"; return 1; }
    echo "== $1 (from ${SECONDS}s)"
}
limit() {  # SECONDS: that, or what is left before 585 s if less
    echo $(( $1 < 585 - SECONDS ? $1 : 585 - SECONDS ))
}
tests() {  # NAME LIMIT TREE ARGS...: pytest in TREE, its output in $out/NAME.txt, its end here
    in_time "$1" || return
    (cd "$3" && timeout -k 20 -s INT "$(limit "$2")" $py -m pytest -q -n 0 \
        -o faulthandler_timeout=150 "${@:4}" >"$out/$1.txt" 2>&1)
    tail -25 "$out/$1.txt"
}
mkdir -p /tmp/json
apply_patch() {  # TREE PATCH [reverse]: PATCH applied in TREE, by patch(1) or else git apply;
    # with "reverse", only whether it would come off: whether TREE holds it already
    if command -v patch >/dev/null; then
        (cd "$1" && patch -s -f -p1 ${3:+-R --dry-run} <"$2" >/dev/null)
    else
        (cd "$1" && git apply ${3:+-R --check} "$2")
    fi
}
patched() {  # TREE PATCH...: a copy of main with the patches applied, unless a warm machine
    [ -f "$1/train_gpt.py" ] && return  # kept it
    mkdir -p "$1" && cp -r train_gpt.py README.md tests benchmarks data pytest.ini \
        requirements.txt "$1/"
    for name in "${@:2}"; do
        if apply_patch "$1" "$here/$name" reverse 2>/dev/null; then
            echo "$name: landed on main already"
        elif ! apply_patch "$1" "$here/$name"; then
            echo "$name neither applies to main nor comes off it: make it again against main"
            rm -rf "$1"; exit 1
        fi
    done
}
patched /tmp/after head_chunks.patch
synthetic=$(pwd)/data/synthetic
[ -f "$synthetic/synthetic_train_000001.bin" ] ||
    $py data/synthetic_fineweb.py 1 --val-tokens 11000000 2>&1 | tail -1
data=(--train_files="$synthetic/synthetic_train_*.bin" --val_files="$synthetic/synthetic_val_*.bin")
bench() {  # NAME TREE [ARGS...]: 20 timed steps of one micro-batch; each tree its own cache
    in_time "bench_step $1" || return
    TORCHINDUCTOR_CACHE_DIR=/tmp/cache_$(basename "$2") timeout "$(limit 200)" \
        $py "$2/benchmarks/bench_step.py" "${data[@]}" --batch_size=65536 --steps=20 \
        --json="/tmp/json/bench_$1.json" "${@:3}" | tail -12
}
kernels() {  # NAME TREE LIMIT [ARGS...]: bench_kernels.py in TREE, its JSON as NAME
    in_time "bench_kernels $1" || return
    timeout "$(limit "$3")" $py "$2/benchmarks/bench_kernels.py" --json="/tmp/json/$1.json" \
        "${@:4}"
}
chunk_rows() {  # ROWS: AFTER's HEAD_CHUNK_ROWS
    sed -i -E "s/^HEAD_CHUNK_ROWS = [0-9]+/HEAD_CHUNK_ROWS = $1/" /tmp/after/train_gpt.py
    grep -q "^HEAD_CHUNK_ROWS = $1 " /tmp/after/train_gpt.py ||
        { echo "no HEAD_CHUNK_ROWS in AFTER"; exit 1; }
}

if [ "$part" = 1 ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    tests test_gpu_main 270 . --durations=10 tests/test_gpu.py -k "not resume"
    tests test_after_head 90 /tmp/after tests/test_kernels.py tests/test_copies.py \
        tests/test_gpu.py -k "head or softcapped or chunk or evaluation or registered or zero \
        or trained or largest_cap or two_copies or soft_cap"
    rm -rf /tmp/cache_after "/tmp/cache_$(basename "$(pwd)")"
    bench after_cold /tmp/after
    bench before_cold "$(pwd)"
    bench before_warm "$(pwd)"  # the spread: BEFORE's two runs
fi
if [ "$part" = 2 ]; then
    in_time "bench_step after_whole_batch" && TORCHINDUCTOR_CACHE_DIR=/tmp/cache_after \
        timeout "$(limit 200)" $py /tmp/after/benchmarks/bench_step.py "${data[@]}" --steps=3 \
        --json=/tmp/json/bench_after_whole_batch.json | tail -12
    for rows in 4096 16384; do
        chunk_rows $rows && bench "chunks_$rows" /tmp/after
    done
    chunk_rows 8192
    patched /tmp/fast head_chunks.patch head_fast_math.patch
    tests test_fast 60 /tmp/fast tests/test_gpu.py -k fast_exp
    for name in before after fast; do
        kernels "bench_kernels_$name" "$([ $name = before ] && pwd || echo /tmp/$name)" 120
    done
    kernels bench_kernels_mlp_sweep "$(pwd)" 150 --sweep --part=mlp
fi
if [ "$part" = 3 ]; then
    patched /tmp/qkv qkv.patch
    rm -rf /tmp/cache_qkv "/tmp/cache_$(basename "$(pwd)")"
    # the map, first: 3 steps, whose trace (about 2 MB a step) comes back in the archive
    bench before_profiled "$(pwd)" --profile=3
    tests test_qkv 180 /tmp/qkv tests/test_gpu.py tests/test_model.py -k \
        "compiled_bf16_model_matches_fp32_eager or no_recompile or one_product"
    bench before_cold "$(pwd)"
    bench qkv_cold /tmp/qkv
    bench before_warm "$(pwd)"
    bench qkv_warm /tmp/qkv
fi
if [[ $part =~ ^[45]$ ]]; then
    patched /tmp/persist mlp_persistent.patch
fi
if [ "$part" = 4 ]; then
    rm -rf /tmp/cache_persist "/tmp/cache_$(basename "$(pwd)")"
    tests test_persist 130 /tmp/persist tests/test_gpu.py tests/test_kernels.py -k \
        "relu or mlp or every_gpu or an_h100_launches or registered or one_graph"
    in_time "same bits" &&
        timeout "$(limit 60)" $py "$here/mlp_same_bits.py" . /tmp/persist
    bench before_cold "$(pwd)"
    bench persist_cold /tmp/persist
    bench before_warm "$(pwd)"
    for name in before persist before_again; do
        kernels "mlp_$name" "$([ $name = persist ] && echo /tmp/persist || pwd)" 60 --part=mlp
    done
fi
if [ "$part" = 5 ]; then
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
    # one run each, the MLPs first: ncu prints nothing of a run cut short
    for run in "main mlp" "persist mlp" "main head"; do
        set -- $run
        tree=$([ "$1" = main ] && pwd || echo /tmp/persist)
        in_time "ncu $run" && timeout "$(limit 120)" "${ncu:-ncu}" \
            --profile-from-start off --clock-control none --section SpeedOfLight \
            --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
            --section WarpStateStats --section LaunchStats --section Occupancy \
            $py "$here/kernel_bounds.py" "$tree" "$2" >"$out/ncu_$1_$2.txt" 2>&1
        grep -E "^  [a-z_0-9]+.*\(|Duration|Throughput|Registers Per|profiled:|ERR" \
            "$out/ncu_$1_$2.txt" | head -60
    done
    tests test_gpu_resume 250 . -o faulthandler_timeout=280 --durations=3 tests/test_gpu.py \
        -k resume
    kernels mlp_persist_sweep /tmp/persist 300 --sweep --part=mlp
fi
if [ "$part" = 6 ]; then
    patched /tmp/onepass head_chunks.patch head_one_pass.patch
    rm -rf /tmp/cache_after /tmp/cache_onepass
    tests test_onepass 150 /tmp/onepass tests/test_kernels.py tests/test_copies.py \
        tests/test_gpu.py -k "head or softcapped or chunk or evaluation or zero or trained \
        or largest_cap or two_copies or soft_cap or never_wait"
    bench after_cold /tmp/after
    bench onepass_cold /tmp/onepass
    bench after_warm /tmp/after
    for name in after onepass after_again; do
        kernels "head_$name" "/tmp/$([ $name = onepass ] && echo onepass || echo after)" 90 \
            --part=head
    done
fi
if [ "$part" = 7 ]; then
    rm -rf /tmp/compare
    # 10 validation micro-batches, not 160: the final validation is no part of a step's time
    in_time compare && timeout "$(limit 585)" $py benchmarks/compare.py "$before" train_gpt.py \
        --runs=2 --out=/tmp/compare -- "${data[@]}" --batch_size=65536 --num_iterations=100 \
        --val_every=0 --val_tokens=655360 >"$out/compare.txt" 2>&1
    tail -15 "$out/compare.txt"
    cp /tmp/compare/*.json /tmp/json/ 2>/dev/null
fi
echo "== done (${SECONDS}s)"
tar czf "$out/json_part$part.tgz" -C /tmp/json .
