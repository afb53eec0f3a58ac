#!/usr/bin/env bash
# The test suite and the kernels' builds under each PyTorch, on a CPU. From a clean clone:
#
#     bash records/2026-11-29_cpu_pytorch_versions/measure.sh OUT
#
# For 2.11.0 (the pin), 2.14.1 and 2.15.0 in turn: `TORCH=<it> bash .ci/run`, its output to
# OUT/suite_<it>.txt; then, in a fresh virtual environment of requirements.txt with that torch,
# tests/kernels_for_gpus.py from an empty kernel cache, to OUT/builds_<it>.txt (its table, then
# its JSON line) and Triton's warnings to OUT/builds_<it>.err. Where pip's configuration caps
# torch (a constraint file), run it as PIP_CONSTRAINT=/dev/null bash .../measure.sh OUT.
set -uo pipefail
out=$(realpath "${1:?name a folder for the outputs}")
cd "$(dirname "$0")/../.."
mkdir -p "$out"
for torch in 2.11.0 2.14.1 2.15.0; do
    TORCH=$torch bash .ci/run > "$out/suite_$torch.txt" 2>&1
    echo "torch $torch: the suite exits $?: $(tail -n 1 "$out/suite_$torch.txt")"
    scratch=$(mktemp -d)
    python3 -m venv "$scratch/venv"
    sed "s/^torch==.*/torch==$torch/" requirements.txt > "$scratch/requirements.txt"
    "$scratch/venv/bin/pip" install -q -r "$scratch/requirements.txt"
    TRITON_CACHE_DIR="$scratch/triton" "$scratch/venv/bin/python" tests/kernels_for_gpus.py \
        > "$out/builds_$torch.txt" 2> "$out/builds_$torch.err"
    echo "torch $torch: the builds exit $?"
    rm -rf "$scratch"
done
