"""Whether two trees' MLP kernels write the same bits, at the real shapes, on a GPU:
    python records/prepared/mlp_same_bits.py BEFORE_TREE AFTER_TREE

Loads each tree's train_gpt.py (each copy registers its own ops, named from its path), then runs
both trees' relu_square_matmul, each with the MLP setting its own use_kernels would take on this
device (first_fitting_setting), on the same bf16 inputs of one 65,536-token micro-batch: the
forward's product (x by w_fc^T, a view) and the backward's (the gradient by w_proj, with the
forward's `pre`). Prints each tree's setting and, for each output, how many elements differ and
the largest difference, and exits 1 if any does (2 if a tree has no MLP setting for this device).
"""
import sys
from pathlib import Path

import torch

# the repository's benchmarks/, from wherever in records/ this file is
ROOT = next(folder for folder in Path(__file__).resolve().parents
            if (folder / "benchmarks" / "training_script.py").is_file())
sys.path.insert(0, str(ROOT / "benchmarks"))
from training_script import load_script  # noqa: E402

TOKENS, DIM, HIDDEN = 65536, 768, 3072
DEVICE = "cuda"  # a CPU check of the script itself sets "cpu" (with TRITON_INTERPRET=1)


def main(before, after):
    trees = [load_script(Path(tree) / "train_gpt.py") for tree in (before, after)]
    settings = []
    for tree in trees:
        index = tree.first_fitting_setting("mlp", torch.device(DEVICE))
        if index is None or not tree.mlp_fits_tiles(TOKENS, DIM, HIDDEN, index):
            print(f"{tree.__file__}: no MLP setting of its list runs here")
            sys.exit(2)
        print(f"{tree.__file__}: setting {index}, {tree.KERNEL_SETTINGS['mlp'][index]}")
        settings.append(index)
    generator = torch.Generator(DEVICE).manual_seed(0)

    def randn(*shape, scale):
        return (torch.randn(*shape, device=DEVICE, generator=generator) * scale).bfloat16()

    x, grad = randn(TOKENS, DIM, scale=1.0), randn(TOKENS, DIM, scale=1.0)
    w_fc, w_proj = randn(HIDDEN, DIM, scale=DIM ** -0.5), randn(DIM, HIDDEN, scale=HIDDEN ** -0.5)
    pre = trees[0].relu_square_matmul(x, w_fc.T, None, settings[0])[0]
    differ = 0
    for name, args in [("forward", (x, w_fc.T, None)), ("backward", (grad, w_proj, pre))]:
        outputs = [tree.relu_square_matmul(*args, index) for tree, index in zip(trees, settings)]
        for label, one, other in zip(["product", "relu^2"], *outputs):
            count = (one != other).sum().item()
            largest = (one.float() - other.float()).abs().max().item()
            print(f"{name} {label}: {count} of {one.numel()} elements differ, by {largest:g} "
                  "at most")
            differ += count
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main(*sys.argv[1:3])
