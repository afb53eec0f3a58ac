"""Whether fp_fusion_explicit.patch changes any build: each kernel's PTX for every target, built
as a run launches it with the patch's KERNEL_OPTIONS and without them, compared as text.

    python records/prepared/same_ptx.py     # in trees/fp_fusion, without TRITON_INTERPRET
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import kernels_for_gpus  # noqa: E402
import train_gpt  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

model = train_gpt.GPT(50257, num_layers=1, num_heads=6, model_dim=768, max_seq_len=128,
                      embed_dtype=train_gpt.torch.bfloat16)
options, same, builds = dict(train_gpt.KERNEL_OPTIONS), 0, 0
for capability, (_, max_shared) in kernels_for_gpus.TARGETS.items():
    _, settings = kernels_for_gpus.takes(model, capability, max_shared)
    for kernel, setting in settings.items():
        for variant in kernels_for_gpus.LAUNCHES[kernel][2]:
            ptx = []
            for given in (options, {}):
                train_gpt.KERNEL_OPTIONS.clear()
                train_gpt.KERNEL_OPTIONS.update(given)
                target = GPUTarget("cuda", capability, 32)
                ptx.append(kernels_for_gpus.build(kernel, setting, variant, target).asm["ptx"])
            builds += 1
            same += ptx[0] == ptx[1]
            print(f"sm_{capability} {kernel} {variant}: {'same' if ptx[0] == ptx[1] else 'DIFFERS'}")
print(f"Triton {triton.__version__}: {same} of {builds} builds the same with {options} as without")
