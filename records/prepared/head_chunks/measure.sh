#!/usr/bin/env bash
# The head in row chunks and the head kernel's race fix, the map of the step, and the q, k and v
# of the attention from one product, on one GPU. First, here, in a checkout of main:
#     bash records/prepared/head_chunks/measure.sh trees
# makes trees/NAME in this folder (git ignores it): main's files with this folder's patches
# applied by patch(1), a tree a variant, as the GPU's machine may have neither git nor patch;
# a patch that the file `landed` here names is on main and skipped, and a variant whose patch
# does not apply exactly (no fuzz) is not made (the script says which). Then on the GPU,
# carrying that folder (a part stops at once if main's files are not the trees' main's):
#     bash records/prepared/head_chunks/measure.sh PART OUT
# BEFORE is main as it is; AFTER is main with head_chunks.patch, in trees/after (README.md).
# Each part is one device call of at most 600 s on a fresh machine (a session has 15 minutes
# of device time in all, starts included: one part a session, part 1 first); each step's time
# limit ends by 580 s, and a step that would start after 540 s, or whose tree was not made, is
# skipped, with a line that says so; each step's header says when it started. The outputs:
# the part's log, the tests' logs, and the JSON of the benchmarks in one archive (a call brings
# back 8 files at most). Each part first names the card and the versions: the lent card may be
# an H100 or an H200 (README.md, "On an H200"), and a part's figures compare within the part.
#   1: tests/test_gpu.py as main has it, first, as every GPU session runs it (a
#      traceback of every thread for a test past 150 s), all but its resume test (165 s alone
#      on 2026-11-24: with it, the file takes about 400 s), which part 5 runs; AFTER's head
#      tests on the GPU (tiny shapes in tests/test_kernels.py and tests/test_copies.py, the
#      real ones in tests/test_gpu.py); one micro-batch a step by bench_step.py, AFTER then
#      BEFORE, each from a cold compile cache (each tree's ops are named from its path: no
#      graph is shared), then BEFORE again (the spread), if time is left.
#   2: AFTER on the whole batch (8 micro-batches: what one GPU alone needs), AFTER at 8,192
#      (the file's), 4,096 and 16,384 rows a chunk (its own file edited in place, so its cache
#      holds), the head alone by bench_kernels.py in AFTER and in FAST (AFTER with
#      head_fast_math.patch, in trees/fast: the head kernel's exp and reciprocal without the
#      handling of denormal numbers), after FAST's bit-for-bit GPU test; the MLP kernel's sweep
#      of launch settings (the same kernel in every tree), with settings that fit two programs
#      on an SM.
#   3: the map and the attention's one product (qkv.patch, applied to main in trees/qkv; it
#      applies after head_chunks.patch too): first BEFORE's step under the profiler, the map
#      (a compile of its own, as a profiled run compiles with Inductor's byte counts in its
#      kernels); QKV's GPU tests (the compiled bf16 model against fp32, no recompiles) and its
#      CPU test of the product's width; then one micro-batch a step, BEFORE then QKV from cold
#      caches, then both again (the spread: BEFORE's two runs).
#   4: the MLP kernel as one program an SM (mlp_persistent.patch, applied to main in
#      trees/persist): its GPU tests (the real shapes against fp32, the kernels' tests on the GPU:
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
#      in trees/onepass): its head tests on the GPU (tiny shapes, and the real ones against
#      fp32, and the zero head, whose loss and targets' entries a race would spoil), and that
#      its steps never wait for the GPU (its scatter and gathers included); one
#      micro-batch a step, AFTER then ONE_PASS from cold caches, then AFTER again (the
#      spread); the head alone by bench_kernels.py, AFTER, ONE_PASS, AFTER.
#   7: at the end, once what was kept has landed: benchmarks/compare.py, main against
#      trees/before (main's train_gpt.py of 7887952, the last before this work), 100 steps of
#      one micro-batch, two runs each.
set -uo pipefail
part=${1:?usage: measure.sh trees, here; then measure.sh 1|2|3|4|5|6|7 OUT on the GPU}
here=$(cd "$(dirname "$0")" && pwd)
trees=$here/trees  # main's files with the patches applied, one folder each; git ignores them
cd "$here/../../.."  # the repository root: BEFORE
if [ "$part" = trees ]; then
    rm -rf "$trees" && mkdir -p "$trees"
    files() { git ls-files -z train_gpt.py README.md tests benchmarks data pytest.ini \
                  requirements.txt; }  # main's, which each tree copies
    make_tree() {  # NAME PATCH...: trees/NAME, but a patch that `landed` names is on main
        mkdir "$trees/$1"
        files | xargs -0 cp --parents -t "$trees/$1"
        for name in "${@:2}"; do
            if grep -qx "$name" "$here/landed" 2>/dev/null; then
                echo "$1: $name is on main"
            elif ! (cd "$trees/$1" &&
                    patch -s -f -p1 --fuzz=0 --no-backup-if-mismatch <"$here/$name"); then
                echo "$1: none, as $name does not apply to main: make it again against main, or"
                echo "    name it in $here/landed if main holds it"
                rm -rf "${trees:?}/$1"
                return
            fi
        done
        echo "$1: made"
    }
    make_tree after head_chunks.patch
    make_tree fast head_chunks.patch head_fast_math.patch
    make_tree onepass head_chunks.patch head_one_pass.patch
    make_tree qkv qkv.patch
    make_tree persist mlp_persistent.patch
    # part 7's BEFORE: main's train_gpt.py before this work
    mkdir "$trees/before" && git show 7887952:train_gpt.py >"$trees/before/train_gpt.py"
    files | xargs -0 sha256sum >"$trees/main.sha256"  # the main they were made from
    du -sh "$trees"
    exit
fi
out=${2:?no OUT}
[[ $part =~ ^[1-7]$ ]] || { echo "PART is trees or 1 to 7, not $part"; exit 1; }
[ -d "$trees" ] || { echo "no $trees: make it here (measure.sh trees) and name it in carry"
                     exit 1; }
sha256sum --quiet -c "$trees/main.sha256" ||
    { echo "the trees were made from another main (the files above differ): make them again"
      exit 1; }
mkdir -p "$out" && out=$(realpath "$out")
exec > >(tee -a "$out/part$part.txt") 2>&1
export PYTHONUNBUFFERED=1
py=$(command -v python3 || command -v python)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
$py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
in_time() {  # NAME [TREE]: whether a step may still start, and TREE is there; its header if so
    (( SECONDS <= 540 )) || { echo "== $1 skipped: ${SECONDS}s gone"; return 1; }
    [ -f "${2:-.}/train_gpt.py" ] || { echo "== $1 skipped: no tree $2"; return 1; }
    echo "== $1 (from ${SECONDS}s)"
}
limit() {  # SECONDS: that, or what is left before 580 s if less
    echo $(( $1 < 580 - SECONDS ? $1 : 580 - SECONDS ))
}
tests() {  # NAME LIMIT TREE ARGS...: pytest in TREE, its output in $out/NAME.txt, its end here
    in_time "$1" "$3" || return
    (cd "$3" && timeout -k 10 -s INT "$(limit "$2")" $py -m pytest -q -n 0 \
        -o faulthandler_timeout=150 "${@:4}" >"$out/$1.txt" 2>&1)
    tail -25 "$out/$1.txt"
}
mkdir -p /tmp/json
synthetic=$(pwd)/data/synthetic  # for bench_step and compare.py: not in part 5
[ -f "$synthetic/synthetic_train_000001.bin" ] || [ "$part" = 5 ] ||
    $py data/synthetic_fineweb.py 1 --val-tokens 11000000 2>&1 | tail -1
data=(--train_files="$synthetic/synthetic_train_*.bin" --val_files="$synthetic/synthetic_val_*.bin")
bench() {  # NAME TREE [ARGS...]: 20 timed steps of one micro-batch, unless ARGS say otherwise
    # (a later --name=value wins); each tree its own cache
    in_time "bench_step $1" "$2" || return
    TORCHINDUCTOR_CACHE_DIR=/tmp/cache_$(basename "$2") timeout "$(limit 200)" \
        $py "$2/benchmarks/bench_step.py" "${data[@]}" --batch_size=65536 --steps=20 \
        --json="/tmp/json/bench_$1.json" "${@:3}" | tail -12
}
kernels() {  # NAME TREE LIMIT [ARGS...]: bench_kernels.py in TREE, its JSON as NAME
    in_time "bench_kernels $1" "$2" || return
    timeout "$(limit "$3")" $py "$2/benchmarks/bench_kernels.py" --json="/tmp/json/$1.json" \
        "${@:4}"
}
a_b_a() {  # A TREE_A B TREE_B PART LIMIT: one micro-batch a step, A then B from cold caches,
    # then A again (the spread); then PART alone by bench_kernels.py, A, B, A again
    bench "$1_cold" "$2"
    bench "$3_cold" "$4"
    bench "$1_warm" "$2"
    kernels "$5_$1" "$2" "$6" --part="$5"
    kernels "$5_$3" "$4" "$6" --part="$5"
    kernels "$5_$1_again" "$2" "$6" --part="$5"
}
after=$trees/after
head_tests() {  # NAME LIMIT TREE EXTRA: the head's tests in TREE, tiny shapes and real, and EXTRA
    tests "$1" "$2" "$3" tests/test_kernels.py tests/test_copies.py tests/test_gpu.py -k \
        "head or softcapped or chunk or evaluation or zero or trained or largest_cap or two_copies \
        or soft_cap or $4"
}
chunk_rows() {  # ROWS: AFTER's HEAD_CHUNK_ROWS
    sed -i -E "s/^HEAD_CHUNK_ROWS = [0-9]+/HEAD_CHUNK_ROWS = $1/" "$after/train_gpt.py"
    grep -q "^HEAD_CHUNK_ROWS = $1 " "$after/train_gpt.py" ||
        { echo "== chunks_$1 skipped: AFTER sets no HEAD_CHUNK_ROWS"; return 1; }
}

if [ "$part" = 1 ]; then
    tests test_gpu_main 270 . --durations=10 tests/test_gpu.py -k "not resume"
    head_tests test_after_head 90 "$after" registered
    rm -rf /tmp/cache_after "/tmp/cache_$(basename "$(pwd)")"
    bench after_cold "$after"
    bench before_cold "$(pwd)"
    bench before_warm "$(pwd)"  # the spread: BEFORE's two runs
fi
if [ "$part" = 2 ]; then
    bench after_whole_batch "$after" --batch_size=524288 --steps=3  # the file's whole batch
    for rows in 8192 4096 16384; do  # 8192, the file's, on this machine too
        chunk_rows $rows && bench "chunks_$rows" "$after"
    done
    chunk_rows 8192
    tests test_fast 60 "$trees/fast" tests/test_gpu.py -k fast_exp
    for name in after fast; do  # main's head alone: 30.33 ms on 2026-11-24
        kernels "bench_kernels_$name" "$trees/$name" 120
    done
    kernels bench_kernels_mlp_sweep "$(pwd)" 150 --sweep --part=mlp
fi
if [ "$part" = 3 ]; then
    rm -rf /tmp/cache_qkv "/tmp/cache_$(basename "$(pwd)")"
    # the map, first: 3 steps, whose trace (about 2 MB a step) comes back in the archive
    bench before_profiled "$(pwd)" --profile=3
    rm -rf "/tmp/cache_$(basename "$(pwd)")"  # BEFORE's next run is cold again
    tests test_qkv 180 "$trees/qkv" tests/test_gpu.py tests/test_model.py -k \
        "compiled_bf16_model_matches_fp32_eager or no_recompile or one_product"
    bench before_cold "$(pwd)"
    bench qkv_cold "$trees/qkv"
    bench before_warm "$(pwd)"
    bench qkv_warm "$trees/qkv"
fi
if [ "$part" = 4 ]; then
    rm -rf /tmp/cache_persist "/tmp/cache_$(basename "$(pwd)")"
    tests test_persist 130 "$trees/persist" tests/test_gpu.py tests/test_kernels.py -k \
        "relu or mlp or every_gpu or an_h100_launches or registered or one_graph"
    in_time "same bits" "$trees/persist" &&
        timeout "$(limit 60)" $py "$here/mlp_same_bits.py" . "$trees/persist"
    a_b_a before "$(pwd)" persist "$trees/persist" mlp 60
fi
if [ "$part" = 5 ]; then
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
    # one run each, the MLPs first: ncu prints nothing of a run cut short
    for run in "main mlp" "persist mlp" "main head"; do
        set -- $run
        tree=$([ "$1" = main ] && pwd || echo "$trees/persist")
        in_time "ncu $run" "$tree" && timeout "$(limit 120)" "${ncu:-ncu}" \
            --profile-from-start off --clock-control none --section SpeedOfLight \
            --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
            --section WarpStateStats --section LaunchStats --section Occupancy \
            $py "$here/kernel_bounds.py" "$tree" "$2" >"$out/ncu_$1_$2.txt" 2>&1
        grep -E "^  [a-z_0-9]+.*\(|Duration|Throughput|Registers Per|profiled:|ERR" \
            "$out/ncu_$1_$2.txt" | head -60
    done
    tests test_gpu_resume 250 . -o faulthandler_timeout=280 --durations=3 tests/test_gpu.py \
        -k resume
    kernels mlp_persist_sweep "$trees/persist" 300 --sweep --part=mlp
fi
if [ "$part" = 6 ]; then
    rm -rf /tmp/cache_after /tmp/cache_onepass
    head_tests test_onepass 150 "$trees/onepass" never_wait
    a_b_a after "$after" onepass "$trees/onepass" head 90
fi
if [ "$part" = 7 ]; then
    rm -rf /tmp/compare
    # 10 validation micro-batches, not 160: the final validation is no part of a step's time
    in_time compare "$trees/before" && timeout "$(limit 580)" $py benchmarks/compare.py \
        "$trees/before/train_gpt.py" train_gpt.py \
        --runs=2 --out=/tmp/compare -- "${data[@]}" --batch_size=65536 --num_iterations=100 \
        --val_every=0 --val_tokens=655360 >"$out/compare.txt" 2>&1
    tail -15 "$out/compare.txt"
    cp /tmp/compare/*.json /tmp/json/ 2>/dev/null
fi
echo "== done (${SECONDS}s)"
tar czf "$out/json_part$part.tgz" -C /tmp/json .
