"""Build train_gpt.py's Triton kernels for every GPU target from the A100 on, with Triton's own
compiler and ptxas, on any machine, and print what each target would run as one JSON line.

For each target: its GPUs, its shared memory per block (max_shared: the opt-in maximum that
torch reports on such a GPU), and
- takes: what train_gpt.use_kernels gives a model of the reference widths there, "kernel" or
  "recipe" for the head and the MLP, with the GPU's properties stood in for;
- builds: the launch setting each kernel takes there, each variant a run launches: the shared
  memory of the build beside the need that train_gpt.mlp_shared_memory works out for the MLP's
  (None for the head's, which holds a few bytes a warp), whether the
  matrix product runs on Hopper's tensor-core instruction (wgmma), the stages of its pipeline of
  copies, the bytes of local memory (spills and stack) that ptxas reports, and the order of its
  global loads (L), stores (S) and barriers between the warps (B) in the PTX, repeats merged:
  what orders one warp's memory against another's; and how many of those loads and stores
  inside its loops run without a predicate, the form that a Triton mask takes.
The JSON line comes last, after the same as a Markdown table.
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
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train_gpt  # noqa: E402
from test_kernels import StandInGPU, runs_as  # noqa: E402

# compute capability: (its GPUs, its shared memory per block in bytes: the opt-in maximum)
TARGETS = {80: ("A100", 166_912), 86: ("RTX 3090, A10, A40, RTX A6000", 101_376),
           89: ("RTX 4090, L4, L40S, RTX 6000 Ada", 101_376), 90: ("H100, H200", 232_448),
           100: ("B200", 232_448), 120: ("RTX 5090, RTX PRO 6000", 101_376)}
# How a run launches each kernel at the reference shapes: the types of its arguments (pointers
# 16-byte aligned, ":16" integers multiples of 16) and the constants of each variant.
LAUNCHES = dict(
    head=(train_gpt.softcapped_cross_entropy_kernel,
          dict(logits_ptr="*bf16", targets_ptr="*i64", losses_ptr="*fp32",
               row_scales_ptr="*fp32", target_shares_ptr="*fp32", scale="fp32",
               num_columns="i32", softcap="fp32", GRADIENTS="i1", BLOCK="i32"),
          dict(training=dict(num_columns=50304, softcap=15.0, GRADIENTS=True),
               evaluation=dict(num_columns=50304, softcap=15.0, GRADIENTS=False))),
    mlp=(train_gpt.relu_square_matmul_kernel,
         dict(a_ptr="*bf16", b_ptr="*bf16", pre_ptr="*bf16", out_ptr="*bf16", h_ptr="*bf16",
              M="i32:16", N="i32", K="i32", stride_bk="i32:16", stride_bn="i32:16",
              BACKWARD="i1", OPERAND="i32", BLOCK_M="i32", BLOCK_N="i32", BLOCK_K="i32",
              GROUP_M="i32"),
         dict(forward=dict(N=3072, K=768, BACKWARD=False, OPERAND=tl.bfloat16, stride_bk=1),
              backward=dict(N=3072, K=768, BACKWARD=True, OPERAND=tl.bfloat16, stride_bn=1))))


def build(kernel, setting, variant, target):
    """Triton's build of `kernel` with a launch `setting` for `target`, as a run launches it."""
    fn, types_, variants = LAUNCHES[kernel]
    assert list(types_) == fn.arg_names, f"LAUNCHES[{kernel!r}] is not {fn.__name__}'s signature"
    options = {name: setting[name] for name in ("num_warps", "num_stages") if name in setting}
    constants = variants[variant] | {k: v for k, v in setting.items() if k not in options}
    source = ASTSource(fn=fn, constexprs=constants, signature={
        name: "constexpr" if name in constants else kind.removesuffix(":16")
        for name, kind in types_.items()}, attrs={
        (i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(types_.items())
        if name not in constants and (kind.startswith("*") or kind.endswith(":16"))})
    return triton.compile(source, target=target, options=options)


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


def memory_order(ptx):
    """The PTX's global loads, stores and barriers in their order, as L, S and B, repeats
    merged: "LBLSBS" is loads, a barrier, loads and stores, a barrier, stores."""
    kinds = re.findall(r"\b(ld\.global|st\.global|(?:bar|barrier)(?:\.cta)?\.sync)", ptx)
    order = "".join(dict(ld="L", st="S", bar="B", barrier="B")[kind.split(".")[0]]
                    for kind in kinds)
    return re.sub(r"(.)\1+", r"\1", order)


def unmasked_in_loops(ptx):
    """How many of the PTX's global loads and stores (ld.global, st.global; not the MLP's
    asynchronous copies) inside its loops, from a label to a branch back to it, no predicate
    guards. Triton makes a load's or a store's mask its predicate: a kernel whose blocks reach
    past the end of its rows must have none."""
    lines = ptx.splitlines()
    labels = {match[1]: i for i, line in enumerate(lines)
              if (match := re.match(r"(\$\w+):", line))}
    inside = set()
    for i, line in enumerate(lines):
        branch = re.search(r"\bbra(?:\.uni)?\s+(\$\w+);", line)
        if branch and labels.get(branch[1], i) < i:
            inside.update(range(labels[branch[1]], i))
    return sum(bool(re.match(r"\s*(?:ld|st)\.global", lines[i])) for i in inside)


def takes(model, capability, max_shared):
    """What use_kernels gives `model` on a GPU of `capability`: ({kernel: "kernel" or "recipe"},
    {kernel: its launch setting, where it takes the kernel})."""
    model.head_loss = train_gpt.head_loss
    for block in model.blocks:
        block.mlp.relu_square_mlp = train_gpt.relu_square_mlp
    torch.cuda.get_device_properties = lambda device: StandInGPU(capability // 10, max_shared)
    train_gpt.use_kernels(model, torch.device("cuda", 0))
    took = dict(zip(("head", "mlp"), runs_as(model)))
    settings = dict(head=dict(train_gpt.HEAD_KERNEL_SETTING))
    if took["mlp"] == "kernel":
        stages = model.blocks[0].mlp.relu_square_mlp.keywords["num_stages"]
        settings["mlp"] = dict(train_gpt.MLP_TILES, num_stages=stages)
    return took, {kernel: setting for kernel, setting in settings.items()
                  if took[kernel] == "kernel"}


def main():
    # the reference widths and head, one layer, its embeddings in bf16 as on a GPU
    model = train_gpt.GPT(50257, num_layers=1, num_heads=6, model_dim=768, max_seq_len=128,
                          embed_dtype=torch.bfloat16)
    results = {}
    for capability, (gpus, max_shared) in TARGETS.items():
        target = GPUTarget("cuda", capability, 32)
        took, settings = takes(model, capability, max_shared)
        builds = []
        for kernel, setting in settings.items():
            for variant in LAUNCHES[kernel][2]:
                compiled = build(kernel, setting, variant, target)
                ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
                buffers = re.findall(r"!ttg.memdesc<(\d+)x\d+x\d+xbf16", ttgir)
                builds.append(dict(
                    kernel=kernel, setting=setting, variant=variant,
                    shared_bytes=compiled.metadata.shared,
                    need=(train_gpt.mlp_shared_memory(setting["num_stages"], capability // 10)
                          if kernel == "mlp" else None),
                    wgmma="wgmma" in ptx, stages=max(map(int, buffers), default=1),
                    local_bytes=local_memory(ptx, capability), memory_order=memory_order(ptx),
                    unmasked_in_loops=unmasked_in_loops(ptx)))
        results[capability] = dict(gpus=gpus, max_shared=max_shared, takes=took, builds=builds)
    print(table(results))
    print(json.dumps(results))


def table(results):
    """The builds of `results` as a Markdown table: what each target takes, and what each build
    holds."""
    rows = [f"Triton {triton.__version__}, PyTorch {torch.__version__}:", "",
            "| target | kernel | variant | stages | shared bytes (of the target's) | local bytes "
            "| wgmma |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for capability, target in results.items():
        for build in target["builds"]:
            rows.append(f"| sm_{capability} | {build['kernel']} | {build['variant']} | "
                        f"{build['setting'].get('num_stages', '')} | {build['shared_bytes']:,} "
                        f"({target['max_shared']:,}) | {build['local_bytes']} | "
                        f"{'yes' if build['wgmma'] else 'no'} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
