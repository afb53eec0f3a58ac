#!/usr/bin/env bash
# The measurements of this folder, on one GPU: `bash measure.sh PART OUT BEFORE` from the
# repository root, where BEFORE is a copy of the train_gpt.py the kernels are measured against
# (the device gets no .git: make it here with `git show main:train_gpt.py > before_train_gpt.py`,
# untracked and not ignored, so that it travels). Each part fits one device call (10 minutes):
#   1: versions; the GPU tests and the kernel tests on the GPU; the smoke run.
#   2: each kernel against the compiled graph it replaces, its launch configuration swept; the
#      step (one 65,536-token micro-batch per step) of BEFORE, of this script, and of this
#      script with the mask's two lookups, each with a cold compile cache; then BEFORE and this
#      script again, warm: the spread of each side; and, warm, this script with Muon applying
#      each update of one process in place (its optimizer time against the warm run before).
#   3: the step of this script without the MLP kernel (the head kernel alone), cold; then
#      benchmarks/compare.py, BEFORE against this script, 2 runs each of 100 steps, and their
#      train losses.
# A machine goes back 30 s after a call, so each part starts from a bare one.
set -uo pipefail
part=$1 out=$2 before_file=$3
[ -s "$before_file" ] || { echo "$before_file: no such file, or empty"; exit 1; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=$(command -v python3 || command -v python)
synthetic=data/synthetic
[ -f $synthetic/synthetic_train_000001.bin ] || $py data/synthetic_fineweb.py 1 --val-tokens 11000000 2>&1 | tail -1
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

bench() {  # NAME TREE CACHE: one micro-batch per step, 50 timed steps
    echo "== bench_step $1"
    TORCHINDUCTOR_CACHE_DIR=$3 timeout 200 $py "$2/benchmarks/bench_step.py" "${data[@]}" \
        --batch_size=65536 --steps=50 --json="$out/bench_$1.json" | tail -12
}
if [ "$part" = 1 ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    $py -c "import torch, triton, numpy, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'numpy', numpy.__version__)"
    timeout 450 $py -m pytest -q -s tests/test_gpu.py tests/test_kernels.py 2>&1 | tee "$out/test_gpu.txt" | tail -25
    timeout 80 $py train_gpt.py --preset=smoke --log_dir=/tmp/smoke 2>&1 | tee "$out/smoke.txt" | grep -E "val_loss|peak"
fi
if [ "$part" = 2 ]; then
    timeout 120 $py benchmarks/bench_kernels.py --sweep --json="$out/bench_kernels.json"
    bench before_cold /tmp/before /tmp/cold_before
    bench after_cold . /tmp/cold_after
    bench two_lookups_cold /tmp/two_lookups /tmp/cold_two_lookups
    bench before_warm /tmp/before /tmp/cold_before
    bench after_warm . /tmp/cold_after
    bench muon_in_place_warm /tmp/muon_in_place /tmp/cold_after  # only Muon differs from after
fi
if [ "$part" = 3 ]; then
    bench head_only_cold /tmp/head_only /tmp/cold_head_only
    rm -rf /tmp/compare
    timeout 400 $py benchmarks/compare.py /tmp/before/train_gpt.py train_gpt.py --runs=2 \
        --out=/tmp/compare -- "${data[@]}" --batch_size=65536 --num_iterations=100 \
        --val_every=0 2>&1 | tail -15
    cp /tmp/compare/compare.json "$out/compare.json"
    for log in $(ls /tmp/compare/*/*.txt | grep -v output.txt); do
        echo "$log: $(grep -oE '^step:(25|50|75|100)/100 .*train_loss:[0-9.]+' "$log" | tr '\n' ' ')"
    done
fi
