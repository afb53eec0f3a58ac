#!/usr/bin/env bash
# The next GPU session's call: main's GPU path checked, and the kernels' check of
# recipe_check.patch run where it would land. From the repository root, here (no GPU needed):
#
#     bash records/prepared/measure.sh trees    # trees/check: main's files with the patch applied
#
# then one device call (about 8 minutes; the steps stop themselves by 570 s):
#
#     run(command="bash records/prepared/measure.sh gpu", carry=["records/prepared/trees"],
#         timeout_s=600)
#
# Each step's whole output goes to its own file under $OUT as it runs, so a call cut short still
# brings back the steps before. Print order: the card, then one line per step with its exit code.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
FILES="train_gpt.py README.md pytest.ini tests benchmarks data/shakespeare data/synthetic_fineweb.py"

case "${1:-}" in
trees)
    rm -rf "$here/trees" && mkdir -p "$here/trees/check"
    # shellcheck disable=SC2086  # FILES is a list of paths
    cp -r --parents $FILES "$here/trees/check/"
    git apply --directory="records/prepared/trees/check" "$here/recipe_check.patch" \
        || { echo "recipe_check.patch does not apply to main: remake it" >&2; exit 1; }
    sha256sum $(git ls-files $FILES) > "$here/trees/main.sha256"
    echo "made $here/trees/check ($(du -sh "$here/trees" | cut -f1))"
    ;;
gpu)
    out=${OUT:-/tmp/measure_out} && mkdir -p "$out"
    started=$SECONDS
    [ -d "$here/trees/check" ] || { echo "no trees: run 'measure.sh trees' here first" >&2; exit 1; }
    sha256sum --quiet -c "$here/trees/main.sha256" \
        || { echo "main differs from the trees' main: make the trees again" >&2; exit 1; }
    export PYTHONUNBUFFERED=1
    { nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__,
torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))"; } > "$out/card.txt" 2>&1
    head -12 "$out/card.txt" | grep -E "NVIDIA|torch|shared" || tail -3 "$out/card.txt"

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
    pytest=(python3 -m pytest -q -s -rs -o addopts= -p no:cacheprovider)
    check="$here/trees/check"

    # 1. main's GPU tests (not the resume test, 165 s alone): which kernels run, the kernels at
    #    the real shapes against fp32, the compiled model, the smaller MLP settings forced
    step gpu_tests_main 300 "$root" "${pytest[@]}" tests/test_gpu.py -k "not resume"
    # 2. the check at the reference widths, in the patched tree; the tests that build a model
    #    with the kernels, which now checks them as it is built
    step gpu_tests_check 150 "$check" "${pytest[@]}" tests/test_gpu.py \
        -k "check or compiled_bf16 or steady or recompile"
    # 3. one micro-batch a step from cold compile caches: main, then the patched tree (the time
    #    the check adds to start-up, and that the step is the same)
    python3 data/synthetic_fineweb.py 1 --tokens 4000000 --val-tokens 200000 --dir /tmp/shards \
        > /dev/null 2>&1
    bench=(python3 benchmarks/bench_step.py --batch_size=65536 --steps=10
           "--train_files=/tmp/shards/synthetic_train_*.bin")
    TORCHINDUCTOR_CACHE_DIR=/tmp/cache_main TRITON_CACHE_DIR=/tmp/triton_main \
        step bench_main 150 "$root" "${bench[@]}" --json="$out/bench_main.json"
    TORCHINDUCTOR_CACHE_DIR=/tmp/cache_check TRITON_CACHE_DIR=/tmp/triton_check \
        step bench_check 150 "$check" "${bench[@]}" --json="$out/bench_check.json"
    echo "done at $((SECONDS - started)) s"
    ;;
*)
    echo "usage: bash records/prepared/measure.sh trees|gpu" >&2
    exit 2
    ;;
esac
