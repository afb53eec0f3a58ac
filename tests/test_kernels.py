"""GPU kernels section: each Triton kernel against the pure-torch computation it replaces.

Tiny shapes, on the GPU when there is one; without one, on the CPU through Triton's interpreter
(conftest.py turns it on). References are computed in fp64 from the same bf16 inputs, and a
kernel's bf16 output must lie within one bf16 ulp of them: the interpreter rounds fp32 to bf16
toward zero (up to one ulp off), a GPU to the nearest (half an ulp). The real shapes, under
torch.compile, are in test_gpu.py.
"""
import functools
import json
import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import train_gpt
from train_gpt import (GPT, HeadLoss, Hyperparameters, ReluSquareMLP, head_loss,
                       head_loss_and_gradients, mlp_fits_tiles, norm, relu_square_matmul,
                       relu_square_mlp, softcapped_cross_entropy_rows, triton_head_loss,
                       triton_relu_square_mlp, use_kernels, what_runs)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROOT = Path(__file__).resolve().parent.parent
GPU_BUILDS = ROOT / "tests" / "kernels_for_gpus.py"
SOFTCAP = Hyperparameters.softcap
STAGES = train_gpt.MLP_STAGES[0]  # the MLP kernel's pipeline: the interpreter runs any alike
# Without Triton (PyTorch's CPU-only builds, macOS) the script runs the recipe's torch code, and
# only the tests that launch a kernel, on a GPU or in the interpreter, have nothing to test.
needs_triton = pytest.mark.skipif(train_gpt.triton is None, reason=(
    "needs Triton, which comes with PyTorch's CUDA builds; without it the kernels never run"))


def randn(*shape, scale=1.0, seed):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator) * scale).bfloat16().to(DEVICE)


def within_one_ulp(got, expected, slack=0):
    """Whether each element of bf16 `got` is within one bf16 spacing of `expected`, taken at
    the larger of the two magnitudes, plus `slack` (the fp32 arithmetic's own error)."""
    magnitude = torch.maximum(got.double().abs(), expected.double().abs()).clamp(min=1e-30)
    ulp = torch.exp2(torch.floor(torch.log2(magnitude)) - 7)
    error = (got.double() - expected.double()).abs()
    return bool((error <= ulp + slack).all())


def fp32_sum_error(a, b):
    """A bound on fp32's rounding of the sums of the product a b, over a few hundred terms."""
    return 2.0 ** -20 * (a.double().abs() @ b.double().abs())


def relative_error(got, expected):
    return ((got.double() - expected.double()).norm() / expected.double().norm()).item()


def head_inputs(rows=24, vocab=5000, dim=32):
    """Logits beyond the cap's knee (their spread is about 17), a vocabulary that is not a whole
    number of the kernel's column blocks, and targets at both ends, in the last block, and at
    their rows' largest logits, where the target's gradient is not just tanh' times -1."""
    x, weight = randn(rows, dim, seed=0), randn(vocab, dim, scale=3.0, seed=1)
    targets = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(2))
    targets[:3] = torch.tensor([0, vocab - 1, vocab - 5])
    targets[3:6] = (x[3:6].float() @ weight.float().T).argmax(1).cpu()
    return x, weight, targets.to(DEVICE)


def softcapped_cross_entropy_in_fp64(x, weight, targets, softcap=SOFTCAP):
    """The op's (mean loss, its gradient over the logits), from torch's autograd in fp64, on
    the op's own bf16 logits."""
    logits = (x @ weight.T).double().requires_grad_()
    loss = F.cross_entropy(softcap * torch.tanh(logits / softcap), targets)
    loss.backward()
    return loss.detach(), logits.grad, logits.detach()


def kernel_on_all_rows(x, weight, targets, softcap=SOFTCAP):
    """The head kernel on all the logits x weight^T at once, as the op runs it on each chunk of
    rows: (mean loss, what it wrote over the logits, the rows' scales, the targets' shares)."""
    logits = x @ weight.T
    losses = torch.empty(len(x), dtype=torch.float32, device=x.device)
    row_scales, target_shares = softcapped_cross_entropy_rows(logits, targets, losses,
                                                              1 / len(x), softcap, True)
    return losses.mean(), logits, row_scales, target_shares


def loss_and_grad_logits(x, weight, targets, softcap=SOFTCAP):
    """(mean loss, its gradient over the logits in fp32): the kernel's three parts put together."""
    loss, written, row_scales, target_shares = kernel_on_all_rows(x, weight, targets, softcap)
    grad_logits = row_scales[:, None] * written.float()
    grad_logits[torch.arange(len(x)), targets] = row_scales * target_shares
    return loss, grad_logits


def kernel_gives_the_gradient(written, row_scales, target_shares, targets, expected_grad):
    """Whether the kernel's parts, each share times its row's scale, are the gradient
    `expected_grad`: the targets' shares, in fp32, to 1e-5 relative, with 0 written over them;
    the rest, written in bf16, within one bf16 spacing of what was written (its one rounding)
    plus 1e-5 relative (exp and log in fp32 are exact to about 1e-6, over the row's range)."""
    rows = torch.arange(len(targets))
    expected = expected_grad / row_scales.double()[:, None]
    at_targets = expected[rows, targets].clone()
    expected[rows, targets] = 0
    return (bool((written[rows, targets] == 0).all())
            and bool(((target_shares.double() - at_targets).abs()
                      <= 1e-5 * at_targets.abs()).all())
            and within_one_ulp(written, expected, slack=1e-5 * expected.abs()))


@needs_triton
def test_the_head_kernel_gives_the_loss_and_each_logits_gradient():
    x, weight, targets = head_inputs()
    loss, written, row_scales, target_shares = kernel_on_all_rows(x, weight, targets)
    expected, expected_grad, logits = softcapped_cross_entropy_in_fp64(x, weight, targets)
    assert logits.abs().max() > 45  # some well into the cap, where tanh' is below 0.01
    # targets at their rows' largest logits: their shares of the softmax (0.3% to 0.8%, among
    # many logits at the cap) show in their gradients, checked to 1e-5
    softmax = torch.softmax(SOFTCAP * torch.tanh(logits / SOFTCAP), dim=1)
    assert (softmax[torch.arange(3, 6), targets[3:6]] > 1e-3).all()
    assert abs(loss.item() - expected.item()) < 1e-6 * expected.item()
    assert written.dtype == torch.bfloat16 and written.shape == logits.shape
    assert kernel_gives_the_gradient(written, row_scales, target_shares, targets, expected_grad)


@needs_triton
def test_a_zero_head_gives_log_vocab_and_a_uniform_gradient():
    """Every logit 0, as at initialisation: each row's loss is exactly ln V, and its gradient
    (1/V - onehot(target)) / rows. A column past the end of the logits counted in the row's sum
    (the last block of 2,048 columns reaches 896 past the 50,304) moves the loss by 0.018."""
    rows, vocab = 16, 50304
    x, weight = randn(rows, 64, seed=9), torch.zeros(vocab, 64, dtype=torch.bfloat16).to(DEVICE)
    targets = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(10))
    targets[0] = vocab - 1
    loss, grad_logits = loss_and_grad_logits(x, weight, targets.to(DEVICE))
    assert abs(loss.item() - math.log(vocab)) < 1e-5  # 10.8258
    expected = torch.full((rows, vocab), 1 / vocab, dtype=torch.float64)
    expected[torch.arange(rows), targets] -= 1
    assert within_one_ulp(grad_logits.cpu(), expected / rows)


@needs_triton
def test_logits_of_a_trained_models_scale_give_torchs_loss_and_gradient():
    """The logits of a trained head spread over a few units, below the cap's knee (the other
    head tests drive them deep into it, where a row's sum is one or two terms): here every term
    of the sum counts, and the loss must be torch's to 1e-6."""
    rows, vocab, dim = 16, 50304, 64
    x, weight = randn(rows, dim, seed=11), randn(vocab, dim, scale=0.3, seed=12)
    targets = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(13))
    targets = targets.to(DEVICE)
    loss, written, row_scales, target_shares = kernel_on_all_rows(x, weight, targets)
    expected, expected_grad, logits = softcapped_cross_entropy_in_fp64(x, weight, targets)
    assert 1.5 < logits.std() < 4 and logits.abs().max() < 15  # no logit past the cap
    assert 8 < expected < 14  # a loss that training passes through
    assert abs(loss.item() - expected.item()) < 1e-6 * expected.item()
    assert kernel_gives_the_gradient(written, row_scales, target_shares, targets, expected_grad)


@needs_triton
def test_the_head_kernel_reads_targets_of_any_stride():
    x, weight, targets = head_inputs()
    every_other = torch.stack([targets, torch.zeros_like(targets)], dim=1)[:, 0]
    assert not every_other.is_contiguous()
    assert head_loss_and_gradients(x, weight, every_other, SOFTCAP, True)[0] == \
        head_loss_and_gradients(x, weight, targets, SOFTCAP, True)[0]


def head_loss_and_gradients_exactly(x, weight, targets, softcap, with_gradients):
    """What the op returns, from torch's autograd: (mean loss, its gradients over x and the
    weight)."""
    assert with_gradients
    with torch.enable_grad():  # autograd.Function.forward runs without
        x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
        loss = F.cross_entropy(softcap * torch.tanh(x @ weight.T / softcap), targets)
        return loss.detach(), *torch.autograd.grad(loss, [x, weight])


@pytest.mark.parametrize("scale", [1.0, 0.25])  # the loss of one of 4 micro-batches
def test_head_loss_differentiates_like_the_reference(scale, monkeypatch):
    """In fp64 (the reference's cross-entropy in fp32), through the op's definition: the
    products the backward makes, and their scale."""
    monkeypatch.setattr(train_gpt, "head_loss_and_gradients", head_loss_and_gradients_exactly)
    x, weight, targets = head_inputs()
    fused = [x.double().requires_grad_(), weight.double().requires_grad_()]
    reference = [x.double().requires_grad_(), weight.double().requires_grad_()]
    losses = [HeadLoss.apply(*fused, targets, SOFTCAP), head_loss(*reference, targets, SOFTCAP)]
    for loss in losses:
        (scale * loss).backward()
    assert abs(losses[0].item() - losses[1].item()) < 1e-5
    for got, expected in zip(fused, reference):
        assert relative_error(got.grad, expected.grad) < 1e-5


@needs_triton
def test_head_loss_kernel_in_bf16_is_as_close_to_fp64_as_torch(monkeypatch):
    """In chunks of 8 rows, 3 of them, through the autograd of both."""
    monkeypatch.setattr(train_gpt, "HEAD_CHUNK_ROWS", 8)
    x, weight, targets = head_inputs()
    errors = []
    for loss_fn in (triton_head_loss, head_loss):
        leaves = [x.clone().requires_grad_(), weight.clone().requires_grad_()]
        loss_fn(*leaves, targets, SOFTCAP).backward()
        exact = [x.double().requires_grad_(), weight.double().requires_grad_()]
        head_loss(*exact, targets, SOFTCAP).backward()
        errors.append([relative_error(t.grad, e.grad) for t, e in zip(leaves, exact)])
    assert max(errors[0]) < 2 * max(errors[1]) + 1e-3, errors  # torch's: about 4e-3


@needs_triton
@pytest.mark.parametrize("rows", [24, 20])  # 3 whole chunks of 8; 2 and a last one of 4
def test_the_head_in_chunks_of_rows_gives_the_loss_and_gradients_of_all_rows_at_once(
        rows, monkeypatch):
    """The op makes the logits a chunk of rows at a time: its loss and its gradients over x and
    the head's weight must be those of the kernel on all the logits at once (here in fp64, from
    the same values that it writes), the products summed in fp32. The gradient of x is rounded
    once, after its rows' scales; that of the weight takes the scales on x's side, which costs
    one more bf16 rounding, of x. A target that rows of one chunk share has its row of the
    weight's gradient summed over them."""
    monkeypatch.setattr(train_gpt, "HEAD_CHUNK_ROWS", 8)
    x, weight, targets = head_inputs(rows=rows)
    targets[9:12] = targets[8]
    loss, grad_x, grad_weight = head_loss_and_gradients(x, weight, targets, SOFTCAP, True)
    whole_loss, written, row_scales, target_shares = kernel_on_all_rows(x, weight, targets)
    assert abs(loss.item() - whole_loss.item()) < 1e-6 * whole_loss.item()
    assert grad_x.dtype == x.dtype and grad_weight.dtype == torch.float32
    grad_logits = row_scales.double()[:, None] * written.double()
    target_grads = row_scales.double() * target_shares.double()
    grad_logits[torch.arange(rows), targets] = target_grads
    expected_x = grad_logits @ weight.double()
    assert within_one_ulp(grad_x, expected_x, slack=fp32_sum_error(grad_logits, weight))
    scaled_x = (x * row_scales[:, None]).to(x.dtype).double()
    expected_weight = written.double().T @ scaled_x
    expected_weight.index_put_((targets,), target_grads[:, None] * x.double(), accumulate=True)
    error = (grad_weight.double() - expected_weight).abs()
    assert (error <= fp32_sum_error(grad_logits.T, x)).all()
    error = (grad_weight.double() - grad_logits.T @ x.double()).abs()
    bound = 2.0 ** -7 * (grad_logits.abs().T @ x.double().abs())
    assert (error <= bound + fp32_sum_error(grad_logits.T, x)).all()


@needs_triton
def test_evaluation_takes_the_loss_alone(monkeypatch):
    """Under torch.no_grad the head kernel writes no gradient and the op makes no products of
    it: the same loss, two empty tensors, and the logits the kernel read left as they were."""
    x, weight, targets = head_inputs()
    told, products = [], []
    rows = train_gpt.softcapped_cross_entropy_rows
    monkeypatch.setattr(train_gpt, "softcapped_cross_entropy_rows",
                        lambda *args: told.append(args[-1]) or rows(*args))
    monkeypatch.setattr(train_gpt, "add_product_in_fp32", lambda *args: products.append(args))
    with torch.no_grad():
        loss = triton_head_loss(x, weight, targets, SOFTCAP)
    assert told == [False] and not products
    _, grad_x, grad_weight = head_loss_and_gradients(x, weight, targets, SOFTCAP, False)
    assert grad_x.numel() == grad_weight.numel() == 0
    # the two variants sum the same terms in the same order
    assert loss.item() == pytest.approx(
        head_loss_and_gradients(x, weight, targets, SOFTCAP, True)[0].item(), rel=1e-7)
    logits = x @ weight.T
    kept, losses = logits.clone(), torch.empty(len(x), dtype=torch.float32, device=x.device)
    rows(logits, targets, losses, 1 / len(x), SOFTCAP, False)
    assert torch.equal(logits, kept) and losses.mean().item() == pytest.approx(loss.item(),
                                                                               rel=1e-7)


# 10 row tiles: a whole group of 8 and a group of 2; 2 column tiles
MLP_SHAPE = dict(tokens=1280, dim=128, hidden=512)


def mlp_inputs(hidden=MLP_SHAPE["hidden"], tokens=MLP_SHAPE["tokens"], dim=MLP_SHAPE["dim"]):
    x = randn(tokens, dim, seed=3)
    w_fc = randn(hidden, dim, scale=dim ** -0.5, seed=4)
    w_proj = randn(dim, hidden, scale=hidden ** -0.5, seed=5)
    return x, w_fc, w_proj


@needs_triton
def test_relu_square_matmul_forward_writes_the_product_and_its_relu_squared():
    x, w_fc, _ = mlp_inputs()
    assert mlp_fits_tiles(*MLP_SHAPE.values())
    pre, h = relu_square_matmul(x, w_fc.T, None, STAGES)  # w_fc.T: a transposed view, as the MLP passes
    exact = x.double() @ w_fc.double().T
    assert within_one_ulp(pre, exact, slack=fp32_sum_error(x, w_fc.T))
    assert within_one_ulp(h, F.relu(pre.double()).square())  # from the rounded product, as torch
    assert (pre < 0).any() and (pre > 0).any()


@needs_triton
def test_relu_square_matmul_backward_multiplies_by_twice_the_relu():
    x, w_fc, w_proj = mlp_inputs()
    pre = (x @ w_fc.T).contiguous()
    grad_out = randn(len(x), w_proj.size(0), seed=6)
    grad_pre, h = relu_square_matmul(grad_out, w_proj, pre, STAGES)
    twice_relu = 2 * F.relu(pre.double())
    expected = (grad_out.double() @ w_proj.double()) * twice_relu
    slack = fp32_sum_error(grad_out, w_proj) * twice_relu
    # rounded to bf16 twice, as torch does (the product, then the result): each time within
    # 2^-7 of the value, an ulp at the most
    error = (grad_pre.double() - expected).abs()
    assert (error <= 2 * 2.0 ** -7 * expected.abs() + slack).all()
    assert within_one_ulp(h, F.relu(pre.double()).square())
    assert (grad_pre == 0).float().mean() > 0.3  # where pre < 0


def relu_square_matmul_exactly(a, b, pre, num_stages):
    """What the op returns, from its definition."""
    product = a @ b
    if pre is None:
        return product, F.relu(product).square()
    return product * 2 * F.relu(pre), F.relu(pre).square()


def test_relu_square_mlp_differentiates_like_the_reference(monkeypatch):
    """In fp64, through the op's definition: which products the backward makes, of what."""
    monkeypatch.setattr(train_gpt, "relu_square_matmul", relu_square_matmul_exactly)
    inputs = [t.double() for t in mlp_inputs()]
    grad_out = torch.randn(len(inputs[0]), inputs[0].size(1), dtype=torch.float64,
                           generator=torch.Generator().manual_seed(6))
    fused = [t.clone().requires_grad_() for t in inputs]
    reference = [t.clone().requires_grad_() for t in inputs]
    outputs = [ReluSquareMLP.apply(*fused, STAGES), relu_square_mlp(*reference)]
    for out in outputs:
        out.backward(grad_out.to(DEVICE))
    assert relative_error(*outputs) < 1e-12
    for got, expected in zip(fused, reference):
        assert relative_error(got.grad, expected.grad) < 1e-12


@needs_triton
@pytest.mark.parametrize("hidden", [512, 768], ids=["4x", "6x"])  # the recipe's width, another
def test_relu_square_mlp_kernel_in_bf16_is_about_as_close_to_fp64_as_torch(hidden):
    """The interpreter's rounding toward zero adds up to about twice torch's 4e-3."""
    inputs = mlp_inputs(hidden)
    assert mlp_fits_tiles(MLP_SHAPE["tokens"], MLP_SHAPE["dim"], hidden)
    grad_out = randn(len(inputs[0]), inputs[0].size(1), seed=7)
    exact = [t.double().requires_grad_() for t in inputs]
    relu_square_mlp(*exact).backward(grad_out.double())
    errors = []
    for mlp in (functools.partial(triton_relu_square_mlp, num_stages=STAGES), relu_square_mlp):
        leaves = [t.clone().requires_grad_() for t in inputs]
        mlp(*leaves).backward(grad_out)
        errors.append([relative_error(t.grad, e.grad) for t, e in zip(leaves, exact)])
    assert max(errors[0]) < 3 * max(errors[1]), errors


@pytest.mark.parametrize("tokens, dim, hidden, fits", [
    (65536, 768, 3072, True), (4096, 256, 1024, True), (4096, 256, 768, True),  # 3 x 256
    (4096, 200, 800, False), (4096, 96, 384, False), (4000, 256, 1024, False),
    (4096, 128, 384, False), (4096, 96, 1024, False)])  # the last: a width of 96, not 64 k
def test_the_mlp_kernel_takes_whole_tiles_only(tokens, dim, hidden, fits):
    assert mlp_fits_tiles(tokens, dim, hidden) == fits


class StandInGPU:
    """What torch.cuda.get_device_properties says of a GPU: its compute capability's major
    number and its shared memory per block (the opt-in maximum)."""

    def __init__(self, major, shared_memory_per_block_optin):
        self.major, self.shared_memory_per_block_optin = major, shared_memory_per_block_optin


def runs_as(model):
    """(the head's loss, the MLP) of a model: "kernel" or "recipe" each, as the log says."""
    said = what_runs(model)
    return tuple("kernel" if " kernel (Triton, " in said[part] else "recipe"
                 for part in ("head", "mlp"))


def small_model(model_dim=128, embed_dtype=torch.float32):
    return GPT(vocab_size=1000, num_layers=1, num_heads=2, model_dim=model_dim,
               max_seq_len=256, embed_dtype=embed_dtype)


@pytest.mark.parametrize("gpu, embed_dtype, expected", [
    (None, torch.float32, ("kernel", "kernel")),  # the CPU, where the interpreter runs them
    ((9, 232_448), torch.bfloat16, ("kernel", "kernel")),  # an H100
    ((9, 232_448), torch.float32, ("kernel", "recipe")),  # a stream in fp32, which the MLP
    ((8, 166_912), torch.bfloat16, ("kernel", "kernel")),  # an A100   kernel multiplies in bf16
    ((8, 101_376), torch.bfloat16, ("kernel", "kernel")),  # an RTX 3090: 99 KB per block
    ((12, 101_376), torch.bfloat16, ("kernel", "kernel")),  # an RTX 5090
    ((8, 99_000), torch.bfloat16, ("kernel", "recipe")),  # 328 bytes short of the MLP's
    ((9, 1_024), torch.bfloat16, ("kernel", "recipe"))])  # the head's kernel needs a few bytes
def test_each_kernel_runs_where_it_fits_the_gpu(gpu, embed_dtype, expected, monkeypatch):
    """Decided when the model is built, from the GPU's shared memory per block as torch reports
    it; where no pipeline of the MLP's fits, the recipe's function stays on the model. The GPU is stood in for
    by its properties; the model stays on the CPU."""
    if train_gpt.triton is None:
        pytest.skip("needs Triton, which comes with PyTorch's CUDA builds; without it the "
                    "recipe's functions always run")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: StandInGPU(*gpu))
    model = small_model(embed_dtype=embed_dtype)
    use_kernels(model, torch.device("cpu") if gpu is None else torch.device("cuda", 0))
    assert runs_as(model) == expected
    mlps = {block.mlp.relu_square_mlp for block in model.blocks}
    assert len(mlps) == 1  # every block alike


def test_a_model_width_whose_products_the_tiles_do_not_split_takes_the_recipe():
    """A width of 96 (hidden 384) or 200 does not split into 64-wide steps over the width or
    256-wide tiles of the hidden units: the MLP's recipe, and the head's kernel."""
    for model_dim, expected in [(128, "kernel"), (96, "recipe"), (200, "recipe"),
                                (256, "kernel")]:
        model = small_model(model_dim)
        use_kernels(model, torch.device("cpu"))
        assert runs_as(model)[1] == (expected if train_gpt.triton else "recipe"), model_dim


@needs_triton
def test_a_width_of_3_steps_of_64_takes_the_mlp_kernel_which_computes_its_mlp():
    """A width of 192 (hidden 768, 3 tiles) is 3 of the tiles' 64-wide steps, though not a
    whole number of their 128 rows, which only a sequence's 128-token blocks need be: the MLP's
    kernel, whose output and gradients on one block of tokens are about as close to fp64 as
    torch's. Widths of 128 and 256 are whole numbers of both, so they cannot tell the width's
    check from the rows'."""
    model = small_model(model_dim=192, embed_dtype=torch.bfloat16)
    use_kernels(model, torch.device(DEVICE))
    assert runs_as(model) == ("kernel", "kernel")
    inputs = mlp_inputs(hidden=768, tokens=128, dim=192)
    grad_out = randn(128, 192, seed=7)
    exact = [t.double().requires_grad_() for t in inputs]
    exact_out = relu_square_mlp(*exact)
    exact_out.backward(grad_out.double())
    errors = []
    for mlp in (model.blocks[0].mlp.relu_square_mlp, relu_square_mlp):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = mlp(*leaves)
        out.backward(grad_out)
        errors.append([relative_error(out, exact_out.detach()),
                       *(relative_error(t.grad, e.grad) for t, e in zip(leaves, exact))])
    assert max(errors[0]) < 3 * max(errors[1]), errors


def test_a_width_the_tiles_do_not_split_takes_the_recipe_where_the_hidden_units_split():
    """A copy's MLP of 768 hidden units (3 whole tiles) on a width of 96 (not a multiple of the
    tiles' 64): the recipe, which computes it, where the kernel would refuse the product."""
    model = small_model(model_dim=96)
    for block in model.blocks:
        block.mlp.c_fc = train_gpt.CastedLinear(96, 768)
        block.mlp.c_proj = train_gpt.CastedLinear(768, 96)
    use_kernels(model, torch.device("cpu"))
    assert runs_as(model) == ("kernel" if train_gpt.triton else "recipe", "recipe")
    x = torch.randn(1, 128, 96, generator=torch.Generator().manual_seed(0))
    mlp = model.blocks[0].mlp
    assert torch.equal(mlp(x)[0], relu_square_mlp(x[0], mlp.c_fc.weight, mlp.c_proj.weight))


@pytest.mark.parametrize("tokens, dim, hidden", [(1200, 128, 512), (1280, 128, 384),
                                                 (1280, 96, 1024)])
def test_the_mlp_kernel_refuses_a_product_it_cannot_tile(tokens, dim, hidden):
    x = randn(tokens, dim, seed=3)
    w_fc = randn(hidden, dim, seed=4)
    with pytest.raises(ValueError, match=f"{tokens} x {dim} by {dim} x {hidden} product does "):
        relu_square_matmul(x, w_fc.T, None, STAGES)


@needs_triton
def test_each_op_keeps_to_its_registered_schema_and_shapes():
    """torch.library.opcheck: the schema, the fake implementation's shapes, dtypes and strides
    against the real outputs, and the op under AOT dispatch."""
    x, weight, targets = head_inputs(rows=16, vocab=300)
    for with_gradients in (True, False):
        torch.library.opcheck(head_loss_and_gradients,
                              (x, weight, targets, SOFTCAP, with_gradients))
    x, w_fc, w_proj = mlp_inputs()
    pre, _ = relu_square_matmul(x, w_fc.T, None, STAGES)
    torch.library.opcheck(relu_square_matmul, (x, w_fc.T, None, STAGES))
    torch.library.opcheck(relu_square_matmul, (x, w_proj, pre, STAGES))


@needs_triton
def test_both_kernels_compile_into_one_graph_with_the_eager_results():
    """torch.compile sees each kernel through its registered shapes: no graph break, and the
    loss and gradients of eager mode. Traced by dynamo and AOTAutograd, which is what the
    registered shapes serve, then run as traced (aot_eager): Inductor's C++ for the CPU would
    add 20 s of compiling here, and test_training.py runs the whole model through it."""
    x, w_fc, w_proj = mlp_inputs(tokens=256)  # the interpreter takes 20 ms a row of the head
    _, weight, _ = head_inputs(vocab=1000, dim=x.size(1))
    targets = torch.randint(0, 1000, (len(x),), generator=torch.Generator().manual_seed(8))
    # as a model runs them
    head, mlp = triton_head_loss, functools.partial(triton_relu_square_mlp, num_stages=STAGES)

    def loss(x, w_fc, w_proj, weight):
        return head(norm(x + mlp(x, w_fc, w_proj)), weight, targets.to(DEVICE), SOFTCAP)

    results = []
    for fn in (loss, torch.compile(loss, fullgraph=True, backend="aot_eager")):
        leaves = [t.clone().requires_grad_() for t in (x, w_fc, w_proj, weight)]
        value = fn(*leaves)
        value.backward()
        results.append([value, *(t.grad for t in leaves)])
    for eager, compiled in zip(*results):
        assert relative_error(compiled, eager) < 1e-2


# The PyTorch that requirements.txt pins: the builds of the Triton it brings (3.6) are known to
# the byte; another Triton may lay out registers and memory otherwise.
PINNED_TORCH = re.search(r"^torch==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M)[1]


@needs_triton
def test_on_every_gpu_from_the_a100_on_a_kernel_launches_only_with_a_setting_that_fits(tmp_path):
    """Triton's compiler and ptxas, not its interpreter, with an empty kernel cache, for each
    target: every target takes both kernels, the 99 KB GPUs the MLP's shallower pipeline, and
    each build fits the target's shared memory. The head kernel's training build orders its
    memory between the warps: loads of the target and its logit, a barrier, the row's loads and
    stores, the sum's barrier, the row's scale and target's share, a barrier, the target's 0
    (the interpreter, running one program at a time, cannot show a race). Each of the head's
    builds loads and stores the row under its masks, as predicated instructions: the last block
    of 2,048 columns reaches 896 past the row's 50,304, and the last row's past the chunk's
    logits, where the interpreter reads without a fault and a GPU may not (the sum drops those
    columns, so no result shows an unmasked load).

    With the pinned PyTorch's Triton the builds are also exact: the shared memory that
    train_gpt.mlp_shared_memory works out for the MLP's pipeline is the build's, with at most
    1 KiB and 16 bytes to spare, never less; no build holds local memory; the head's holds at
    most 1 KiB; the H100's MLP runs on wgmma. With another, whose compiler may place registers
    otherwise (Triton 3.8 and 3.9 spill 12 bytes of sm_100's MLP backward), a warning gives the
    table of what each target gets instead."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(GPU_BUILDS)], capture_output=True, text=True,
                            env=env | {"TRITON_CACHE_DIR": str(tmp_path)}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    targets = json.loads(result.stdout.splitlines()[-1])
    assert set(targets) == {"80", "86", "89", "90", "100", "120"}
    exact = torch.__version__.split("+")[0] == PINNED_TORCH
    for capability, target in targets.items():
        for build in target["builds"]:
            where = (capability, build["kernel"], build["setting"], build["variant"])
            assert build["shared_bytes"] <= target["max_shared"], where
            if build["kernel"] == "head":
                assert build["unmasked_in_loops"] == 0, where
            if not exact:
                continue
            if build["kernel"] == "mlp":
                assert build["shared_bytes"] <= build["need"] <= build["shared_bytes"] + 1040, where
                assert build["need"] <= target["max_shared"], where
            else:
                assert build["need"] is None and build["shared_bytes"] <= 1024, where
            assert build["local_bytes"] == 0, where
        assert target["takes"] == dict(head="kernel", mlp="kernel"), capability
        (training,) = [build["memory_order"] for build in target["builds"]
                       if build["kernel"] == "head" and build["variant"] == "training"]
        assert training == "LBLSBSBS", (capability, training)
        # the 99 KB GPUs (86, 89, 120) take the MLP's shallower pipeline, the others its deepest
        stages = train_gpt.MLP_STAGES[0 if target["max_shared"] > 101_376 else 1]
        setting = dict(train_gpt.MLP_TILES, num_stages=stages)
        mlp = [(build["variant"], build["setting"]) for build in target["builds"]
               if build["kernel"] == "mlp"]
        assert mlp == [("forward", setting), ("backward", setting)], capability
    for build in targets["90"]["builds"]:  # the H100's MLP, on pipelined tensor cores
        if build["kernel"] == "mlp" and exact:
            assert build["wgmma"], build
            assert build["stages"] == train_gpt.MLP_STAGES[0], build
    if not exact:
        warnings.warn(f"PyTorch {torch.__version__}, not the pinned {PINNED_TORCH}: each build "
                      f"fits its GPU; what the builds hold, as this Triton makes them:\n"
                      + "\n".join(result.stdout.splitlines()[:-1]))


def test_without_triton_the_kernel_tests_skip_with_their_reason():
    """PyTorch's CPU-only builds come without Triton: the tests that launch a kernel skip and
    say why, and the rest (the autograd of each Function, the dispatch to the recipe) pass."""
    code = ("import sys; sys.modules['triton'] = None; import pytest; sys.exit(pytest.main("
            f"['-q', '-rs', '-n', '0', '-p', 'no:cacheprovider', '-k', 'not without_triton', "
            f"{__file__!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    summary = result.stdout.splitlines()[-1]
    assert " passed" in summary and " skipped" in summary and "failed" not in summary, summary
    assert "needs Triton, which comes with PyTorch's CUDA builds" in result.stdout


@needs_triton
@pytest.mark.parametrize("gpu, stages", [((9, 232_448), 4), ((8, 166_912), 4),
                                         ((8, 101_376), 3), ((12, 101_376), 3)])
def test_the_mlp_kernel_takes_the_deepest_pipeline_that_fits(gpu, stages, monkeypatch):
    """The H100's and the A100's take 4 stages, the 99 KB GPUs (an RTX 3090, an RTX 5090) 3: a
    list in another order would give the 99 KB GPUs' to every GPU."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: StandInGPU(*gpu))
    model = small_model(embed_dtype=torch.bfloat16)
    use_kernels(model, torch.device("cuda", 0))
    assert model.blocks[0].mlp.relu_square_mlp.keywords == dict(num_stages=stages)


@needs_triton
def test_the_log_names_the_pipeline_that_the_gpu_takes(monkeypatch):
    """On a 99 KB GPU (an RTX 3090) the log's line of what runs names the MLP kernel's 3 stages,
    the pipeline it launches, not the list of depths it chose from."""
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: StandInGPU(8, 101_376))
    model = small_model(embed_dtype=torch.bfloat16)
    use_kernels(model, torch.device("cuda", 0))
    assert what_runs(model) == {
        "head": "the head kernel (Triton, {'BLOCK': 2048, 'num_warps': 4})",
        "mlp": "the MLP kernel (Triton, {'BLOCK_M': 128, 'BLOCK_N': 256, 'BLOCK_K': 64, "
               "'GROUP_M': 8, 'num_warps': 8}, {'num_stages': 3})"}
