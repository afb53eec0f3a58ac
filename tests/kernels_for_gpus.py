"""Build train_gpt.py's Triton kernels for every GPU target from the A100 on, with Triton's own
compiler and ptxas, on any machine, and print what each target would run as one JSON line.

For each target: its GPUs, its shared memory per block (max_shared: the opt-in maximum that
Triton's driver reports on such a GPU), and for each kernel:
- takes: what the script's dispatch (kernel_for) hands the model at the reference shapes, the
  kernel or the recipe's torch function, with the GPU's driver stood in for by the target;
- setting: the index of the launch setting that the script chose (None where none fits);
- builds: for that setting, each variant a run launches: its shared memory, whether the matrix
  product runs on Hopper's tensor-core instruction (wgmma), the stages of its pipeline of
  copies, and the bytes of local memory (spills and stack) that ptxas reports.
The interpreter runs a kernel's Python; only the compiler shows what a GPU build holds. Run
without TRITON_INTERPRET, which would make the kernels the interpreter's.
"""
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train_gpt  # noqa: E402

# compute capability: (its GPUs, its shared memory per block in bytes: the opt-in maximum)
TARGETS = {80: ("A100", 166_912), 86: ("RTX 3090, A10, A40, RTX A6000", 101_376),
           89: ("RTX 4090, L4, L40S, RTX 6000 Ada", 101_376), 90: ("H100, H200", 232_448),
           100: ("B200", 232_448), 120: ("RTX 5090, RTX PRO 6000", 101_376)}
TOKENS, DIM, VOCAB = 65536, 768, 50304  # one micro-batch of the reference model


def local_memory(ptx, capability):
    """Bytes of local memory (the stack frame and spill stores) in ptxas's build of `ptx`."""
    arch = re.search(r"^\.target (\S+)", ptx, re.MULTILINE)[1]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.ptx"
        path.write_text(ptx)
        report = subprocess.run([get_ptxas(capability).path, "-v", f"--gpu-name={arch}",
                                 str(path), "-o", str(Path(folder) / "kernel.cubin")],
                                capture_output=True, text=True, check=True).stderr
    stack, spills = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", report).groups()
    return int(stack) + int(spills)


def dispatch(target, max_shared):
    """What kernel_for hands a GPU of `target` at the reference shapes, per kernel: "kernel" or
    "recipe"."""
    train_gpt.gpu_target = lambda device: (target, max_shared)
    train_gpt.LAUNCH_SETTINGS.clear()
    with FakeTensorMode():  # CUDA tensors with shapes and no memory, on a machine without a GPU
        x, w_fc, w_proj, head = (torch.empty(*shape, device="cuda", dtype=torch.bfloat16)
                                 for shape in [(TOKENS, DIM), (4 * DIM, DIM), (DIM, 4 * DIM),
                                               (VOCAB, DIM)])
        targets = torch.empty(TOKENS, device="cuda", dtype=torch.int64)
        chosen = dict(head=train_gpt.kernel_for(train_gpt.head_loss, x, head, targets, 15.0),
                      mlp=train_gpt.kernel_for(train_gpt.relu_square_mlp, x, w_fc, w_proj))
    recipes = dict(head=train_gpt.head_loss, mlp=train_gpt.relu_square_mlp)
    return {kernel: "recipe" if fn is recipes[kernel] else "kernel"
            for kernel, fn in chosen.items()}


def main():
    results = {}
    for capability, (gpus, max_shared) in TARGETS.items():
        target = GPUTarget("cuda", capability, 32)
        takes = dispatch(target, max_shared)
        results[capability] = dict(gpus=gpus, max_shared=max_shared, kernels={})
        for kernel, (_, _, variants) in train_gpt.KERNEL_LAUNCHES.items():
            index = train_gpt.LAUNCH_SETTINGS[kernel, torch.device("cuda", 0)]
            builds = []
            for variant in [] if index is None else variants:
                setting = train_gpt.KERNEL_SETTINGS[kernel][index]
                compiled = train_gpt.compile_for(kernel, setting, variant, target)
                ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
                buffers = re.findall(r"!ttg.memdesc<(\d+)x\d+x\d+xbf16", ttgir)
                builds.append(dict(shared_bytes=compiled.metadata.shared, wgmma="wgmma" in ptx,
                                   stages=max(map(int, buffers), default=1),
                                   local_bytes=local_memory(ptx, capability)))
            results[capability]["kernels"][kernel] = dict(
                takes=takes[kernel], setting=index, builds=builds)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
