"""Why a warm-cache compile takes longer with the kernels: AOTAutograd's cache and a Function.

    python records/2026-11-24_h100_kernels/cache_probe.py

On a CPU, through Triton's interpreter, each case compiles the head's loss of a tiny problem in
a fresh process, twice over one TORCHINDUCTOR_CACHE_DIR, and prints AOTAutograd's cache counters
and the gradient of x against `head_loss`'s:
- `function`: train_gpt's HeadLoss, an autograd.Function. AOTAutograd bypasses its cache on both
  runs, so each traces and partitions the graph anew (Inductor's own cache still hits).
- `registered`: the same op with its backward given by `register_autograd`. The second run hits
  the cache; but there the backward has been edited to double the gradient of x, and the
  gradient comes out as before the edit: the cache served the old backward. A third run, with
  the edited backward on an empty cache, shows the doubled gradient.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASE = r"""
import json, sys
import torch
import train_gpt
from torch._dynamo.utils import counters

kind, factor = sys.argv[1], float(sys.argv[2])
if kind == "function":
    loss_fn = train_gpt.HeadLoss.apply
else:
    @torch.library.custom_op("probe::head_loss", mutates_args=())
    def op(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
        return train_gpt.softcapped_cross_entropy(x, weight, targets)

    op.register_fake(lambda x, weight, targets: (x.new_empty(()),
                                                 x.new_empty(x.size(0), weight.size(0))))

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1], output[1])

    def backward(ctx, grad_loss, _):
        x, weight, grad_logits = ctx.saved_tensors
        return factor * (grad_logits @ weight) * grad_loss, (grad_logits.T @ x) * grad_loss, None

    op.register_autograd(backward, setup_context=setup_context)
    loss_fn = lambda x, weight, targets: op(x, weight, targets)[0]

generator = torch.Generator().manual_seed(0)
x = torch.randn(128, 64, generator=generator, requires_grad=True)
weight = torch.randn(96, 64, generator=generator, requires_grad=True)
targets = torch.randint(0, 96, (128,), generator=generator)
torch.compile(loss_fn)(x, weight, targets).backward()
reference = x.detach().requires_grad_()
train_gpt.head_loss(reference, weight.detach(), targets).backward()
ratio = float((x.grad.norm() / reference.grad.norm()))
print(json.dumps(dict(counters["aot_autograd"], grad_x_against_head_loss=round(ratio, 4))))
"""


def run(kind, factor, cache):
    env = dict(os.environ, TRITON_INTERPRET="1", TORCHINDUCTOR_CACHE_DIR=cache,
               PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", CASE, kind, str(factor)], env=env,
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def main():
    for kind in ("function", "registered"):
        with tempfile.TemporaryDirectory() as cache:
            print(f"{kind}: first run {run(kind, 1, cache)}")
            if kind == "function":
                print(f"{kind}: second run {run(kind, 1, cache)}")
            else:
                print(f"{kind}: second run, its backward now doubling d/dx {run(kind, 2, cache)}")
        if kind == "registered":
            with tempfile.TemporaryDirectory() as cache:
                print(f"{kind}: the edited backward, empty cache {run(kind, 2, cache)}")


if __name__ == "__main__":
    main()
