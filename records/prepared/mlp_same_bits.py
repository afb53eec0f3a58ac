"""Whether two trees' MLP kernels give the same bits, on a GPU at the real shapes:
    python records/prepared/mlp_same_bits.py BEFORE_TREE AFTER_TREE [TOKENS DIM HIDDEN]

Loads each tree's train_gpt.py (each copy registers its own ops, named from its path) and runs
its MLP through the kernel, triton_relu_square_mlp, with the pipeline its own use_kernels takes
on this device, forward and backward on the same bf16 inputs of one 65,536-token micro-batch.
Prints, for the output and the gradients of x, w_fc and w_proj, how many elements differ and by
how many bf16 steps at most (a zero's sign is no difference), and exits 1 if any does. On a CPU
(TRITON_INTERPRET=1, small shapes) it checks itself: the interpreter rounds differently.
"""
import sys
from pathlib import Path

import torch

# the repository's benchmarks/, from wherever in records/ this file is
ROOT = next(folder for folder in Path(__file__).resolve().parents
            if (folder / "benchmarks" / "training_script.py").is_file())
sys.path.insert(0, str(ROOT / "benchmarks"))
from training_script import load_script  # noqa: E402


def bf16_steps(a, b):
    """How many bf16 values lie between each element of a and of b (0 for -0 against +0)."""
    line = []
    for t in (a, b):
        bits = t.contiguous().view(torch.int16).int()
        line.append(torch.where(bits < 0, -(bits & 0x7FFF), bits))
    return (line[0] - line[1]).abs()


def main(before, after, tokens=65536, dim=768, hidden=3072):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    generator = torch.Generator(device).manual_seed(0)

    def randn(*shape, scale):
        return (torch.randn(*shape, device=device, generator=generator) * scale).bfloat16()

    inputs = [randn(tokens, dim, scale=1.0), randn(hidden, dim, scale=dim ** -0.5),
              randn(dim, hidden, scale=hidden ** -0.5)]
    grad_out = randn(tokens, dim, scale=tokens ** -0.5)
    results = []
    for path in (before, after):
        tree = load_script(Path(path) / "train_gpt.py")
        if hasattr(tree, "mlp_pipeline"):  # num_stages and flatten
            pipeline = tree.mlp_pipeline(device)
        else:
            stages = tree.mlp_pipeline_stages(device)
            pipeline = stages and dict(num_stages=stages)
        if pipeline is None or not tree.mlp_fits_tiles(tokens, dim, hidden):
            sys.exit(f"{tree.__file__}: its MLP kernel does not run here")
        print(f"{tree.__file__}: {pipeline}, {tree.MLP_TILES}")
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = tree.triton_relu_square_mlp(*leaves, **pipeline)
        out.backward(grad_out)
        results.append([out.detach()] + [t.grad for t in leaves])
    differ = 0
    for name, one, other in zip(["output", "grad x", "grad w_fc", "grad w_proj"], *results):
        steps = bf16_steps(one, other)
        count = int((steps > 0).sum())
        same_sign = (one.float() * other.float() >= 0)
        largest = (one.float() - other.float()).abs().max() / one.float().abs().max()
        print(f"{name}: {count} of {one.numel()} elements differ, by "
              f"{int(steps[same_sign].max())} bf16 steps at most where their signs agree "
              f"({int((~same_sign).sum())} do not); largest difference {float(largest):.2e} "
              f"of the largest element")
        differ += count
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main(*sys.argv[1:3], *map(int, sys.argv[3:6]))
