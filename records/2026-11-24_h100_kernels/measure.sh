#!/usr/bin/env bash
# The measurements of this folder, on one GPU: `bash measure.sh PART OUT BEFORE_SHA` from the
# repository root, where BEFORE_SHA is the main the kernels are measured against. Each part
# fits one device call (under 10 minutes):
#   1: versions; the GPU tests and the kernel tests at the GPU's shapes; each kernel against the
#      compiled graph it replaces, with its launch configurations swept; the smoke run.
#   2: the step (one 65,536-token micro-batch) of BEFORE, of this script, of this script
#      without the MLP kernel (the head kernel alone) and with the mask's two lookups, each with
#      a cold compile cache, then BEFORE and this script again with a warm one: the spread of
#      each side.
#   3: benchmarks/compare.py, BEFORE against this script, 2 runs each of 100 steps; the train
#      losses of those runs at steps 25, 50, 75 and 100.
set -uo pipefail
part=$1 out=$2 before_sha=$3
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=$(command -v python3 || command -v python)
here=$(dirname "$0")
synthetic=data/synthetic
[ -f $synthetic/synthetic_train_000001.bin ] || $py data/synthetic_fineweb.py 1 --val-tokens 11000000 2>&1 | tail -1
data=(--train_files="$synthetic/synthetic_train_*.bin" --val_files="$synthetic/synthetic_val_*.bin")
before=/tmp/before
mkdir -p $before/benchmarks
git show "$before_sha:train_gpt.py" > $before/train_gpt.py
cp benchmarks/*.py $before/benchmarks/  # today's benchmarks, timing BEFORE's script
# variants of this script, each without one lever, to time that lever alone
variant() {  # NAME OLD NEW: train_gpt.py with the text OLD replaced by NEW, as NAME/train_gpt.py
    mkdir -p /tmp/$1/benchmarks && cp benchmarks/*.py /tmp/$1/benchmarks/
    $py - "$2" "$3" "/tmp/$1/train_gpt.py" <<'PY' || exit 1
import sys
old, new, path = sys.argv[1:]
source = open("train_gpt.py").read()
if source.count(old) != 1:
    sys.exit(f"{path}: the text to replace is not in train_gpt.py once: {old!r}")
open(path, "w").write(source.replace(old, new))
PY
}
variant head_only "ReluSquareMLP.apply if x.is_cuda and" "ReluSquareMLP.apply if False and"
variant two_lookups "return (doc_start[q_idx] <= kv_idx) & (kv_idx <= q_idx)" \
    "return (q_idx >= kv_idx) & (docs[q_idx] == docs[kv_idx])"  # the mask_mod of BEFORE
bench() {  # NAME TREE CACHE: one micro-batch per step, 50 timed steps
    TORCHINDUCTOR_CACHE_DIR=$3 timeout 240 $py "$2/benchmarks/bench_step.py" "${data[@]}" \
        --batch_size=65536 --steps=50 --json="$out/bench_$1.json" | tail -12
}
if [ "$part" = 1 ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    $py -c "import torch, triton, numpy, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'numpy', numpy.__version__)"
    timeout 360 $py -m pytest -q -s tests/test_gpu.py tests/test_kernels.py 2>&1 | tee "$out/test_gpu.txt" | tail -25
    timeout 150 $py benchmarks/bench_kernels.py --sweep --json="$out/bench_kernels.json"
    timeout 100 $py train_gpt.py --preset=smoke --log_dir=/tmp/smoke | grep -E "val_loss|peak"
fi
if [ "$part" = 2 ]; then
    bench before_cold $before /tmp/cold_before
    bench after_cold . /tmp/cold_after
    bench head_only_cold /tmp/head_only /tmp/cold_head_only
    bench two_lookups_cold /tmp/two_lookups /tmp/cold_two_lookups
    bench before_warm $before /tmp/cold_before
    bench after_warm . /tmp/cold_after
fi
if [ "$part" = 3 ]; then
    timeout 560 $py benchmarks/compare.py $before/train_gpt.py train_gpt.py --runs=2 --out=/tmp/compare \
        -- "${data[@]}" --batch_size=65536 --num_iterations=100 --val_every=0 2>&1 | tail -15
    cp /tmp/compare/compare.json "$out/compare.json"
    for log in $(ls /tmp/compare/*/*.txt | grep -v output.txt); do
        echo "$log: $(grep -oE '^step:(25|50|75|100)/100 .*train_loss:[0-9.]+' "$log" | tr '\n' ' ')"
    done
fi
