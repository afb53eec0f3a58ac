#!/usr/bin/env bash
# The measurements of this folder, on one GPU: `bash measure.sh PART OUT` from the repository root.
# PART 1: versions, the GPU tests, the smoke run, the 1-micro-batch benchmark (cold compile) and
# its profile. PART 2: the first steps of the reference model under TORCH_LOGS, the real batch.
# After Newton-Schulz became a CUDA graph, against BEFORE, the train_gpt.py of a8f2330
# (`git show a8f2330:train_gpt.py > BEFORE`): PART 3 BEFORE: Muon steps, twice each; one
# micro-batch per step, cold compile each; the smoke run. PART 4: the GPU tests, the first steps
# under TORCH_LOGS. PART 5 BEFORE: the real batch; the smoke run again, then BEFORE's.
set -uo pipefail
part=$1 out=$2
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=$(command -v python3 || command -v python)
synthetic=data/synthetic
[ -f $synthetic/synthetic_train_000001.bin ] || $py data/synthetic_fineweb.py 1 --val-tokens 11000000 2>&1 | tail -1
data=(--train_files="$synthetic/synthetic_train_*.bin" --val_files="$synthetic/synthetic_val_*.bin")
if [ "$part" = 1 ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    $py -c "import torch, triton, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
    timeout 300 $py -m pytest -q tests/test_gpu.py 2>&1 | tee "$out/test_gpu.txt" | tail -15
    # a cold compile cache, as on a fresh machine
    TORCHINDUCTOR_CACHE_DIR=/tmp/cold_inductor timeout 240 $py benchmarks/bench_step.py \
        "${data[@]}" --batch_size=65536 --steps=50 --profile=5 --json="$out/bench_1micro.json"
fi
if [ "$part" = 2 ] || [ "$part" = 4 ]; then
    [ "$part" = 4 ] && timeout 300 $py -m pytest -q tests/test_gpu.py 2>&1 | tee "$out/test_gpu.txt" | tail -15
    [ "$part" = 2 ] && timeout 150 $py train_gpt.py --preset=smoke --log_dir="$out/smoke" | grep -E "val_loss|peak"
    TORCH_LOGS=graph_breaks,recompiles timeout 200 $py train_gpt.py "${data[@]}" --batch_size=65536 \
        --num_iterations=40 --val_every=10 --warmup_steps=3 --log_dir="$out/first_steps" \
        2> "$out/torch_logs.txt" | grep -E "val_loss|peak|step:(1|2|3|39|40)/"
    echo "TORCH_LOGS lines: $(grep -c . "$out/torch_logs.txt")"; head -c 3000 "$out/torch_logs.txt"
    [ "$part" = 2 ] && timeout 240 $py benchmarks/bench_step.py "${data[@]}" --steps=100 --profile=3 \
        --json="$out/bench_8micro.json"
fi
if [ "$part" = 3 ]; then
    before=/tmp/before
    mkdir -p $before/benchmarks && cp benchmarks/*.py $before/benchmarks/ && cp "$3" $before/train_gpt.py
    for round in 1 2; do
        for tree in $before .; do echo "$tree: $(timeout 120 $py $tree/benchmarks/time_muon.py --steps=20)"; done
    done
    for tree in $before .; do
        name=$([ $tree = . ] && echo after || echo before) profile=$([ $tree = . ] && echo 5 || echo 0)
        TORCHINDUCTOR_CACHE_DIR=/tmp/cold_$name timeout 200 $py $tree/benchmarks/bench_step.py "${data[@]}" \
            --batch_size=65536 --steps=50 --profile=$profile --json="$out/bench_1micro_$name.json"
    done
    timeout 150 $py train_gpt.py --preset=smoke --log_dir="$out/smoke" | grep -E "val_loss|peak"
fi
if [ "$part" = 5 ]; then
    timeout 200 $py benchmarks/bench_step.py "${data[@]}" --steps=100 --json="$out/bench_8micro_after.json"
    for script in train_gpt.py "$3"; do
        echo "smoke again: $script"
        timeout 100 $py "$script" --preset=smoke --log_dir=/tmp/smoke_again | grep -E "val_loss"
    done
fi
