"""Compile train_gpt.py's Triton kernels for an H100 (sm_90) with Triton's own compiler and
ptxas, on any machine, and print what the compiled code holds as one JSON line.

The interpreter runs a kernel's Python; only the compiler checks what a GPU build rejects (a
variable whose type changes in a loop, say) and shows whether the matrix product uses Hopper's
tensor-core instruction (wgmma) behind a multi-stage pipeline of copies. The arguments are
specialised as Triton specialises them at a launch with the reference shapes: pointers aligned
to 16 bytes, integers that are multiples of 16 marked so, a stride of 1 made a constant. Run
without TRITON_INTERPRET, which would make the kernels the interpreter's.
"""
import json
import re
import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train_gpt  # noqa: E402

H100 = GPUTarget("cuda", 90, 32)


def compile_for_h100(kernel, types, constants, launch):
    """Compile with `types` ({argument: Triton type}, in order) and `constants`; the integer
    arguments listed in types as "i32:16" are multiples of 16, every pointer 16-byte aligned."""
    signature = {name: ("constexpr" if name in constants else kind.split(":")[0])
                 for name, kind in types.items()}
    aligned = [(i,) for i, kind in enumerate(types.values()) if kind[0] == "*" or ":16" in kind]
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants,
                       attrs={index: [["tt.divisibility", 16]] for index in aligned})
    compiled = triton.compile(source, target=H100, options=launch)
    ttgir = compiled.asm["ttgir"]
    buffers = re.findall(r"!ttg.memdesc<(\d+)x\d+x\d+xbf16", ttgir)  # stages x tile, in shared
    return dict(shared_bytes=compiled.metadata.shared, wgmma="wgmma" in compiled.asm["ptx"],
                stages=max(map(int, buffers), default=1))


def main():
    head = train_gpt.HEAD_LOSS_CONFIG
    results = dict(head=compile_for_h100(
        train_gpt.softcapped_cross_entropy_kernel,
        dict(logits_ptr="*bf16", targets_ptr="*i64", losses_ptr="*fp32", scale="fp32",
             num_columns="i32", softcap="fp32", BLOCK="i32"),
        dict(num_columns=50304, softcap=train_gpt.Hyperparameters.softcap, BLOCK=head["BLOCK"]),
        dict(num_warps=head["num_warps"])))
    mlp = dict(train_gpt.RELU_SQUARE_CONFIG)
    launch = dict(num_warps=mlp.pop("num_warps"), num_stages=mlp.pop("num_stages"))
    types = dict(a_ptr="*bf16", b_ptr="*bf16", pre_ptr="*bf16", out_ptr="*bf16", h_ptr="*bf16",
                 M="i32:16", N="i32", K="i32", stride_bk="i32:16", stride_bn="i32:16",
                 BACKWARD="i1", OPERAND="i32", **{name: "i32" for name in mlp})
    for backward, strides in [(False, dict(stride_bk=1)), (True, dict(stride_bn=1))]:
        results[f"mlp_{'backward' if backward else 'forward'}"] = compile_for_h100(
            train_gpt.relu_square_matmul_kernel, types,
            dict(N=3072, K=768, BACKWARD=backward, OPERAND=tl.bfloat16, **strides, **mlp),
            launch)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
