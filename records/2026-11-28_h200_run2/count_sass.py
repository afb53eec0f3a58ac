"""What the head kernel of a tree's train_gpt.py costs per logit on an H100, from its build:
    python records/2026-11-28_h200_run2/count_sass.py TREE

Builds the kernel's first variant (the one that writes the gradients) for sm_90 with the tree's
own launch setting, by the tree's tests/kernels_for_gpus.py (Triton's compiler and ptxas, no GPU
needed), disassembles it with the nvdisasm that Triton ships, and for
each loop (a branch back to an earlier label) prints the warp-instructions of its body per logit
it handles, those of the special-function unit (MUFU), and the most frequent opcodes.
"""
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+ )?([A-Z0-9]+)\S*\s*([^;]*);")


def loops(sass):
    """(first address, branch address, opcodes) of each loop in nvdisasm's output."""
    instructions = [(int(a, 16), op, args) for a, op, args in INSTRUCTION.findall(sass)]
    labels = {m[1]: int(m[2], 16) for m in re.finditer(
        r"^(\.L_x_\d+):\s*\n\s*/\*([0-9a-f]{4,})\*/", sass, re.MULTILINE)}
    found = []
    for address, op, args in instructions:
        target = re.search(r"\.L_x_\d+", args)
        if op == "BRA" and target and labels.get(target[0], address) < address:
            start = labels[target[0]]
            found.append((start, address, [o for a, o, _ in instructions if start <= a <= address]))
    return found


def main(tree):
    sys.path.insert(0, str(Path(tree).resolve() / "tests"))
    import kernels_for_gpus
    setting = kernels_for_gpus.train_gpt.KERNEL_SETTINGS["head"][0]
    variant = next(iter(kernels_for_gpus.LAUNCHES["head"][2]))
    compiled = kernels_for_gpus.build("head", setting, variant, GPUTarget("cuda", 90, 32))
    nvdisasm = Path(get_ptxas(90).path).with_name("nvdisasm")
    with tempfile.TemporaryDirectory() as folder:
        cubin = Path(folder) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    per_warp = setting["BLOCK"] // setting["num_warps"]  # logits a warp handles per iteration
    for start, end, opcodes in loops(sass):
        counts = collections.Counter(opcodes)
        print(f"loop {start:#06x}-{end:#06x}: {len(opcodes) / per_warp:.3f} warp-instructions "
              f"a logit, MUFU {counts['MUFU'] / per_warp:.3f}; {dict(counts.most_common(6))}")


if __name__ == "__main__":
    main(sys.argv[1])
