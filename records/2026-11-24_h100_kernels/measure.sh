#!/usr/bin/env bash
# The measurements of this folder, on one GPU: `bash measure.sh PART OUT BEFORE_SHA` from the
# repository root, where BEFORE_SHA is the main the kernels are measured against. Each part
# fits one device call (under 10 minutes):
#   1: versions; the GPU tests and the kernel tests at the GPU's shapes; each kernel against the
#      compiled graph it replaces, with its launch configurations swept; the smoke run.
#   2: the step (one 65,536-token micro-batch) of BEFORE, of this script, and of this script
#      without the MLP kernel (the head kernel alone), each with a cold compile cache, then
#      BEFORE and this script again with a warm one: the spread of each side.
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
# the head kernel alone: the MLP as the compiled graph computes it
sed 's/fused = x.is_cuda and relu_square_matmul_fits/fused = False and relu_square_matmul_fits/' \
    train_gpt.py > /tmp/head_only.py
grep -q "fused = False and" /tmp/head_only.py || { echo "head_only.py: the MLP switch moved"; exit 1; }
mkdir -p /tmp/head_only/benchmarks && cp /tmp/head_only.py /tmp/head_only/train_gpt.py
cp benchmarks/*.py /tmp/head_only/benchmarks/

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
