#!/usr/bin/env bash
# The measurements of this folder, on one GPU: `bash measure.sh PART OUT BEFORE` from the
# repository root, where BEFORE is a copy of the train_gpt.py the kernels are measured against
# (the GPU machine gets no .git: make it here with `git show main:train_gpt.py > before_train_gpt.py`,
# untracked and not ignored, so that it travels). Each part fits one command of 10 minutes:
#   1: versions; the kernel tests and the GPU tests; the smoke run.
#   2: each kernel against the compiled graph it replaces, its launch configuration swept; the
#      step (one 65,536-token micro-batch per step) of BEFORE and of this script, each with a
#      cold compile cache, then each again warm: the spread of each side; then, with this
#      script's cache, three variants of it: without the MLP kernel (the head kernel alone),
#      with the mask's two lookups of BEFORE, and with Muon applying each update of one process
#      in place.
#   3: the GPU tests of the kernels at the real shapes and of resume (part 1 had not reached
#      them); benchmarks/compare.py, BEFORE against this script, 2 runs each of 100 steps, and
#      their train losses.
# A machine goes back 30 s after a call: each part runs on a bare one too, if more slowly.
set -uo pipefail
part=$1 out=$2 before_file=$3
[ -s "$before_file" ] || { echo "$before_file: no such file, or empty"; exit 1; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=$(command -v python3 || command -v python)
synthetic=data/synthetic  # parts 2 and 3; part 1 trains on the Shakespeare sample
[ "$part" = 1 ] || [ -f $synthetic/synthetic_train_000001.bin ] ||
    $py data/synthetic_fineweb.py 1 --val-tokens 11000000 2>&1 | tail -1
data=(--train_files="$synthetic/synthetic_train_*.bin" --val_files="$synthetic/synthetic_val_*.bin")

variant() {  # NAME FILE [OLD NEW]...: a tree at /tmp/NAME, FILE its train_gpt.py, each OLD -> NEW
    mkdir -p /tmp/$1/benchmarks && cp benchmarks/*.py /tmp/$1/benchmarks/
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
variant before "$before_file"
variant head_only train_gpt.py "ReluSquareMLP.apply if x.is_cuda and" "ReluSquareMLP.apply if False and"
variant two_lookups train_gpt.py "return (doc_start[q_idx] <= kv_idx) & (kv_idx <= q_idx)" \
    "return (q_idx >= kv_idx) & (docs[q_idx] == docs[kv_idx])"  # the mask_mod of BEFORE
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
    echo "== bench_step $1"
    [[ $1 == *_cold ]] && rm -rf "$3"
    TORCHINDUCTOR_CACHE_DIR=$3 timeout 200 $py "$2/benchmarks/bench_step.py" "${data[@]}" \
        --batch_size=65536 --steps=50 --json="$out/bench_$1.json" | tail -12
}
if [ "$part" = 1 ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    $py -c "import torch, triton, numpy, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'numpy', numpy.__version__)"
    # SIGINT, not SIGTERM: pytest still reports the failures it has when the time is up; and a
    # kill 20 s later, since once it hung on its way out
    per_test=$($py -c "import pytest_timeout" 2>/dev/null && echo --timeout=240)
    timeout -k 20 -s INT 450 $py -m pytest -q -s $per_test --durations=15 tests/test_kernels.py \
        tests/test_gpu.py 2>&1 | tee "$out/test_gpu.txt" | tail -40
    rm -rf /tmp/smoke
    timeout 80 $py train_gpt.py --preset=smoke --log_dir=/tmp/smoke 2>&1 | tee "$out/smoke.txt" | grep -E "val_loss|peak"
fi
if [ "$part" = 2 ]; then
    timeout 120 $py benchmarks/bench_kernels.py --sweep --json="$out/bench_kernels.json"
    bench before_cold /tmp/before /tmp/cold_before
    bench after_cold . /tmp/cold_after
    bench before_warm /tmp/before /tmp/cold_before
    bench after_warm . /tmp/cold_after
    # the variants below differ from this script in one part: its cache compiles the rest
    bench head_only /tmp/head_only /tmp/cold_after
    bench two_lookups /tmp/two_lookups /tmp/cold_after
    bench muon_in_place /tmp/muon_in_place /tmp/cold_after
fi
if [ "$part" = 3 ]; then
    timeout -k 20 -s INT 200 $py -m pytest -q -x tests/test_gpu.py -k "fused or resume" 2>&1 |
        tee "$out/test_gpu_kernels.txt" | tail -15
    rm -rf /tmp/compare /tmp/cold_compare
    # 10 validation micro-batches, not 160: the final validation is no part of a step's time
    TORCHINDUCTOR_CACHE_DIR=/tmp/cold_compare timeout 450 $py benchmarks/compare.py \
        /tmp/before/train_gpt.py train_gpt.py --runs=2 --out=/tmp/compare -- "${data[@]}" \
        --batch_size=65536 --num_iterations=100 --val_every=0 --val_tokens=655360 2>&1 | tail -15
    cp /tmp/compare/compare.json "$out/compare.json"
    for log in $(ls /tmp/compare/*/*.txt | grep -v output.txt); do
        echo "$log: $(grep -oE '^step:(25|50|75|100)/100 .*train_loss:[0-9.]+' "$log" | tr '\n' ' ')"
    done
fi
