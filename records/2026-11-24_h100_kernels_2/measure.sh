#!/usr/bin/env bash
# The second round of the kernels on one GPU: `bash measure.sh PART OUT BEFORE`, where BEFORE
# is a copy of main's train_gpt.py (the GPU machine gets no .git: make it in the repository root with
# `git show main:train_gpt.py > before_train_gpt.py`, untracked and not ignored, so that it
# travels). This script's tree is the branch: the head kernel without its loop over rows, at 4
# warps, and the MLP's products at 4 pipeline stages. Each part fits one command of 600 s,
# and a step that would start after 520 s is skipped, with a line that says so. They ran in the
# order 2, 1, 3, 4, 5: part 2 decides what is kept; 3 to 5 are what 30 minutes on the GPU left
# room for after 2 and 1.
#   1: versions; tests/test_gpu.py on its own (a traceback of every thread when a test passes
#      150 s): first the tests of the kernels at the real shapes and of resume, then the smoke
#      run, whose val losses must be the CPU's within 0.05, then the rest of the file until
#      585 s (on main before the kernels, those 11 took 242 s).
#   2: the kernels against the compiled graphs they replace, launch configurations swept; the
#      step (one 65,536-token micro-batch) of this script from a cold compile cache, then of
#      BEFORE, this script and BEFORE again on that cache (BEFORE differs only inside the custom
#      ops, which the compiler does not look into): two runs of each, their spread; then three
#      variants of this script, each different in one thing: the head kernel at 8 warps, the MLP
#      at 3 stages (both as on main), Muon applying one process's updates in place.
#   3: the resume test alone, given 290 s (in part 1's 170 s it had not finished).
#   4: benchmarks/compare.py, BEFORE against this script, one run each of 100 steps (no room for
#      two), and their train losses.
#   5: the kernel tests and then the Newton-Schulz GPU test in one process (after them it hung
#      once: a traceback of every thread at 100 s).
set -uo pipefail
part=${1:?usage: measure.sh 1|2|3|4|5 OUT BEFORE} out=${2:?no OUT} before_file=${3:?no BEFORE}
[[ $part =~ ^[1-5]$ ]] || { echo "PART is 1 to 5, not $part"; exit 1; }
[ -s "$before_file" ] || { echo "$before_file: no such file, or empty"; exit 1; }
mkdir -p "$out"
out=$(realpath "$out") before_file=$(realpath "$before_file")
cd "$(dirname "$0")/../.."  # the repository root
exec > >(tee -a "$out/part$part.txt") 2>&1
export PYTHONUNBUFFERED=1
py=$(command -v python3 || command -v python)
in_time() {  # NAME: whether a step may still start
    (( SECONDS <= 520 )) || { echo "== $1 skipped: ${SECONDS}s gone"; return 1; }
}
synthetic=data/synthetic  # parts 2 and 4; the others train on the Shakespeare sample
[[ $part =~ [135] ]] || [ -f $synthetic/synthetic_train_000001.bin ] ||
    $py data/synthetic_fineweb.py 1 --val-tokens 11000000 2>&1 | tail -1
data=(--train_files="$synthetic/synthetic_train_*.bin" --val_files="$synthetic/synthetic_val_*.bin")

variant() {  # NAME FILE [OLD NEW]...: a tree at /tmp/NAME, FILE its train_gpt.py, each OLD -> NEW
    mkdir -p /tmp/$1/benchmarks && cp benchmarks/*.py /tmp/$1/benchmarks/
    cp -r tests pytest.ini /tmp/$1/
    $py - "$2" "/tmp/$1/train_gpt.py" "${@:3}" <<'PY' || exit 1
import sys
source, path, *changes = sys.argv[1:]
text = open(source).read()
for old, new in zip(changes[::2], changes[1::2]):
    if text.count(old) != 1:
        sys.exit(f"{path}: the text to replace is not in {source} once: {old!r}")
    text = text.replace(old, new)
open(path, "w").write(text)
PY
}
head_config="HEAD_LOSS_CONFIG = dict(BLOCK=2048, num_warps=4)"
variant before "$before_file"
variant head_8_warps train_gpt.py "$head_config" "${head_config/num_warps=4/num_warps=8}"
variant mlp_3_stages train_gpt.py "num_stages=4)  # tile" "num_stages=3)  # tile"
variant muon_in_place train_gpt.py "def apply(handle, chunk):" "def apply(handle, chunk, updates):" \
    "zip(chunk, rows):" "zip(chunk, updates):" \
    "                if self.world_size == 1:
                    rows[0].copy_(update)
                    pending = (None, chunk)
                else:
                    pending = (dist.all_gather_into_tensor(buffer, update, async_op=True), chunk)" \
    "                pending = ((None, chunk, [update]) if self.world_size == 1 else
                           (dist.all_gather_into_tensor(buffer, update, async_op=True), chunk, rows))"

bench() {  # NAME TREE CACHE: one micro-batch per step, 50 timed steps; NAME *_cold: CACHE emptied
    in_time "bench_step $1" || return
    echo "== bench_step $1"
    [[ $1 == *_cold ]] && rm -rf "$3"
    TORCHINDUCTOR_CACHE_DIR=$3 timeout 200 $py "$2/benchmarks/bench_step.py" "${data[@]}" \
        --batch_size=65536 --steps=50 --json="$out/bench_$1.json" | tail -12
}
# SIGINT, not SIGTERM: pytest still reports what it has when the time is up; a kill 20 s later.
# Into a file, not a pipe, which a process the tests left behind could hold open.
tests() {  # NAME LIMIT ARGS...: pytest's output in $out/NAME.txt, its end here
    in_time "$1" || return
    echo "== $1"
    timeout -k 20 -s INT "$2" $py -m pytest -q "${@:3}" >"$out/$1.txt" 2>&1
    tail -30 "$out/$1.txt"
}
if [ "$part" = 1 ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    $py -c "import torch, triton, numpy, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'numpy', numpy.__version__)"
    tests test_gpu_kernels_and_resume 170 -o faulthandler_timeout=150 --durations=5 \
        tests/test_gpu.py -k "fused or resume"
    if in_time smoke; then
        rm -rf /tmp/smoke
        timeout 90 $py train_gpt.py --preset=smoke --log_dir=/tmp/smoke >"$out/smoke.txt" 2>&1
        grep -E "val_loss|peak" "$out/smoke.txt"
    fi
    tests test_gpu_rest $(( 585 - SECONDS )) -o faulthandler_timeout=150 --durations=15 \
        tests/test_gpu.py -k "not fused and not resume"
fi
if [ "$part" = 2 ]; then
    in_time bench_kernels && timeout 120 $py benchmarks/bench_kernels.py --sweep \
        --json="$out/bench_kernels.json"
    bench after_cold . /tmp/cache
    bench before_1 /tmp/before /tmp/cache
    bench after_warm . /tmp/cache
    bench before_2 /tmp/before /tmp/cache
    bench head_8_warps /tmp/head_8_warps /tmp/cache
    bench mlp_3_stages /tmp/mlp_3_stages /tmp/cache
    bench muon_in_place /tmp/muon_in_place /tmp/cache
fi
if [ "$part" = 3 ]; then
    tests test_gpu_resume 290 -o faulthandler_timeout=280 --durations=3 -s tests/test_gpu.py \
        -k resume
fi
if [ "$part" = 4 ]; then
    rm -rf /tmp/compare /tmp/cache2
    # 10 validation micro-batches, not 160: the final validation is no part of a step's time.
    TORCHINDUCTOR_CACHE_DIR=/tmp/cache2 timeout 330 $py benchmarks/compare.py \
        /tmp/before/train_gpt.py train_gpt.py --runs=1 --out=/tmp/compare -- "${data[@]}" \
        --batch_size=65536 --num_iterations=100 --val_every=0 --val_tokens=655360 \
        >"$out/part4_compare.txt" 2>&1
    tail -15 "$out/part4_compare.txt"
    mkdir -p "$out/compare" && cp -r /tmp/compare/. "$out/compare/"
    for log in $(ls /tmp/compare/*/*.txt | grep -v output.txt); do
        echo "$log: $(grep -oE '^step:(25|50|75|100)/100 .*train_loss:[0-9.]+' "$log" | tr '\n' ' ')"
    done
fi
if [ "$part" = 5 ]; then
    tests test_kernels_then_newton_schulz 150 -o faulthandler_timeout=100 --durations=5 \
        tests/test_kernels.py tests/test_gpu.py -k "test_kernels or newton_schulz_on_the_gpu"
fi
