"""What bounds each kernel of a tree's head and MLP, read by Nsight Compute at the real shapes:
    ncu --profile-from-start off --clock-control none [--section ...] \
        python records/prepared/head_chunks/kernel_bounds.py TREE [mlp] [head]

Loads TREE's train_gpt.py, runs each part once to build its kernels, then once more between
torch.cuda.profiler.start() and stop(), so that ncu profiles that one run's kernels alone:
- mlp: the cuBLAS product x w_fc^T by itself (the same product as the kernel's forward: what
  cuBLAS reaches on it), then ReluSquareMLP forward and backward (the kernel twice, beside the
  four cuBLAS products around it);
- head: HeadLoss forward and backward (its three cuBLAS products and the loss kernel).
One 65,536-token micro-batch of the reference model, in bf16.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from training_script import load_script  # noqa: E402

TOKENS, DIM, HIDDEN, VOCAB = 65536, 768, 3072, 50304
DEVICE = "cuda"  # a CPU check of the script itself sets "cpu" (with TRITON_INTERPRET=1)


def parts(script, generator):
    """Each part's function that runs it once, forward and backward, by the part's name."""
    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device=DEVICE, generator=generator) * scale).bfloat16()

    x = randn(TOKENS, DIM)
    w_fc, w_proj = randn(HIDDEN, DIM, scale=DIM ** -0.5), randn(DIM, HIDDEN, scale=HIDDEN ** -0.5)
    head = randn(VOCAB, DIM, scale=0.07)  # logits spread as a trained head's are
    targets = torch.randint(0, 50257, (TOKENS,), device=DEVICE, generator=generator)
    grad = randn(TOKENS, DIM, scale=TOKENS ** -1)

    def mlp():
        x @ w_fc.T
        leaves = [t.detach().requires_grad_() for t in (x, w_fc, w_proj)]
        script.ReluSquareMLP.apply(*leaves).backward(grad)

    def head_loss():
        leaves = [t.detach().requires_grad_() for t in (x, head)]
        script.HeadLoss.apply(*leaves, targets, script.Hyperparameters.softcap).backward()

    return dict(mlp=mlp, head=head_loss)


def main(tree, names):
    if not names or set(names) - {"mlp", "head"}:
        sys.exit("usage: kernel_bounds.py TREE PART..., each PART mlp or head")
    script = load_script(Path(tree) / "train_gpt.py")
    runs = parts(script, torch.Generator(DEVICE).manual_seed(0))
    for name in names:
        runs[name]()  # builds the kernels, outside the profiled range
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    for name in names:
        runs[name]()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print(f"profiled: {' '.join(names)} of {Path(tree).resolve() / 'train_gpt.py'}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
