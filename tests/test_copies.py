"""An attempt at a record is a copy of train_gpt.py with edits. Each edit of the recipe must
reach the GPU's path as well as the CPU's, or stop the GPU's run in one line before it trains.

Copies are written to a temporary folder and loaded as modules of their own. The kernels run on
the GPU where there is one, else on the CPU through Triton's interpreter (conftest.py turns it
on), at small shapes.
"""
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import train_gpt
from test_model import block_mask_to_dense, random_documents
from test_kernels import (DEVICE, loss_and_grad_logits, needs_triton, randn,
                          relative_error, softcapped_cross_entropy_in_fp64)
from test_training import TINY

TRAIN_GPT = Path(__file__).resolve().parent.parent / "train_gpt.py"
# The reference model's head and a small model: the kernels' dispatch is the GPU run's.
SMALL = dict(vocab_size=50257, num_layers=2, num_heads=2, model_dim=128, max_seq_len=256)
SMALL_ARGS = ["--num_layers=2", "--num_heads=2", "--model_dim=128"]


def load_copy(folder, name, *edits):
    """train_gpt.py with each (old, new) text replaced, written to folder/name.py and loaded as
    the module `name`."""
    source = TRAIN_GPT.read_text()
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would; dataclasses look the module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def copies(tmp_path):
    loaded = []

    def load(name, *edits):
        loaded.append(name)
        return load_copy(tmp_path, name, *edits)
    yield load
    for name in loaded:
        sys.modules.pop(name, None)


GELU = ("F.linear(F.relu(F.linear(x, w_fc)).square(), w_proj)",
        "F.linear(F.gelu(F.linear(x, w_fc)), w_proj)")
LABEL_SMOOTHING = ("F.cross_entropy(logits.float(), targets)",
                   "F.cross_entropy(logits.float(), targets, label_smoothing=0.1)")
Z_LOSS = ("return F.cross_entropy(logits.float(), targets)",
          "return F.cross_entropy(logits.float(), targets) "
          "+ 1e-4 * logits.float().logsumexp(-1).square().mean()")
CAP_30 = ("logits = softcap * torch.tanh(logits / softcap)",
          "logits = 30 * torch.tanh(logits / 30)")


def refusal(attempt, args):
    """The one line that stops the copy's GPU path before it trains."""
    with pytest.raises(attempt.UserError) as stopped:
        attempt.build_model(args, torch.device("cpu"), gpu_path=True)
    message = str(stopped.value)
    assert "\n" not in message and "--kernels=false" in message
    return message


@pytest.mark.parametrize("edit, kernel, recipe", [
    (GELU, "mlp", "relu_square_mlp"), (LABEL_SMOOTHING, "head", "head_loss"),
    (Z_LOSS, "head", "head_loss")], ids=["gelu", "label-smoothing", "z-loss"])
def test_an_edited_recipe_function_stops_the_gpu_path_in_one_line(edit, kernel, recipe, copies):
    attempt = copies("attempt", edit)
    args = attempt.parse_args(SMALL_ARGS)
    message = refusal(attempt, args)
    assert message.startswith(f"attempt.py: {recipe} is not the code that the {kernel} kernel "
                              f"computes")
    # the fix it names: the kernel made to compute the new code, and its fingerprint
    found = message.split(f'KERNEL_RECIPES["{kernel}"] = "')[1].rstrip('"')
    assert found == attempt.recipe_fingerprint(getattr(attempt, recipe))
    assert found != train_gpt.KERNEL_RECIPES[kernel]
    fixed = copies("fixed", edit, (f'{kernel}="{train_gpt.KERNEL_RECIPES[kernel]}"',
                                   f'{kernel}="{found}"'))
    fixed.build_model(args, torch.device("cpu"), gpu_path=True)
    # the other way out: the recipe's torch code on the GPU, which trains the edit
    model, _, _ = attempt.build_model(args, torch.device("cpu"), gpu_path=False)
    assert model.head_loss is attempt.head_loss
    assert model.blocks[0].mlp.relu_square_mlp is attempt.relu_square_mlp


ACTIVATION = [("def relu_square_mlp(",
               "def activation(h):\n    return F.relu(h).square()\n\n\ndef relu_square_mlp("),
              ("F.linear(F.relu(F.linear(x, w_fc)).square(), w_proj)",
               "F.linear(activation(F.linear(x, w_fc)), w_proj)")]
Z_WEIGHT = [("def head_loss(", "Z_WEIGHT = 1e-4\n\n\ndef head_loss("),
            (Z_LOSS[0], Z_LOSS[1].replace("1e-4", "Z_WEIGHT"))]


@pytest.mark.parametrize("name, edits, kernel, later", [
    ("activation", ACTIVATION, "mlp", ("F.relu(h).square()", "F.gelu(h)")),
    ("z_weight", Z_WEIGHT, "head", ("Z_WEIGHT = 1e-4", "Z_WEIGHT = 1e-3"))])
def test_an_edit_of_a_function_or_constant_that_a_recipe_function_names_stops_it_too(
        name, edits, kernel, later, copies):
    """A recipe function written with a helper of the file, whose kernel was made to compute it
    (its fingerprint set), then the helper alone edited."""
    args = train_gpt.parse_args(SMALL_ARGS)
    written = copies(f"{name}_written", *edits)
    fingerprint = written.recipe_fingerprint(
        written.head_loss if kernel == "head" else written.relu_square_mlp)
    kernel_made = (f'{kernel}="{train_gpt.KERNEL_RECIPES[kernel]}"', f'{kernel}="{fingerprint}"')
    copies(f"{name}_kernel_made", *edits, kernel_made).build_model(
        args, torch.device("cpu"), gpu_path=True)
    edited = copies(f"{name}_edited", *edits, kernel_made, later)
    assert refusal(edited, args).startswith(f"{name}_edited.py: ")


@pytest.mark.parametrize("cap", ["30", "30.0", "7.5"])
def test_a_cap_written_into_head_loss_is_refused_naming_the_softcap_that_makes_it(cap, copies):
    """The cap written where the recipe reads its argument: the one line names the argument
    that gives the copy's loss on both paths, and the unedited file takes it to the kernel."""
    attempt = copies("attempt", (CAP_30[0], CAP_30[1].replace("30", cap)))
    assert refusal(attempt, attempt.parse_args(SMALL_ARGS)) == (
        f"attempt.py: head_loss is not the code that the head kernel computes, so a GPU would "
        f"train other code than a CPU: run it with --kernels=false, or write softcap back where "
        f"head_loss has {cap}, and run with --softcap={cap}")
    args = train_gpt.parse_args(SMALL_ARGS + [f"--softcap={cap}"])
    model, _, _ = train_gpt.build_model(args, torch.device("cpu"), gpu_path=True)
    assert model.softcap == float(cap)
    # a number beside the argument is not a cap: its fix is the kernel's
    half = copies("half", (CAP_30[0], CAP_30[1].replace("30 *", "softcap *")))
    assert "KERNEL_RECIPES" in refusal(half, half.parse_args(SMALL_ARGS))


# Edits a record attempt makes every day, each of which once ended the GPU's path in a
# traceback (a KeyError, a NameError or a TypeError) where the CPU's trained.
RENAMED = [("def relu_square_mlp(x, w_fc, w_proj):", "def squared_relu_mlp(x, w_fc, w_proj):"),
           ("self.relu_square_mlp = relu_square_mlp", "self.relu_square_mlp = squared_relu_mlp")]
LAMBDA = [("def relu_square_mlp(", "ACTIVATION = lambda h: F.relu(h).square()  # noqa: E731"
                                   "\n\n\ndef relu_square_mlp("),
          ("F.linear(F.relu(F.linear(x, w_fc)).square(), w_proj)",
           "F.linear(ACTIVATION(F.linear(x, w_fc)), w_proj)")]
DECORATED = [("def head_loss(", "def traced(fn):\n    def wrapper(*args):\n        return fn(*args)"
                                "\n    return wrapper\n\n\n@traced\ndef head_loss(")]


@pytest.mark.parametrize("edits, named", [(RENAMED, "squared_relu_mlp"),
                                          (LAMBDA, "relu_square_mlp"), (DECORATED, "wrapper")],
                         ids=["renamed", "lambda-helper", "decorator-without-wraps"])
def test_an_ordinary_edit_stops_the_gpu_path_in_one_line_naming_the_function(edits, named,
                                                                             copies):
    attempt = copies("attempt", *edits)
    args = attempt.parse_args(SMALL_ARGS)
    model, _, _ = attempt.build_model(args, torch.device("cpu"), gpu_path=False)
    model(torch.arange(256) % 50257, torch.arange(1, 257) % 50257, torch.tensor(1))  # CPU: trains
    assert refusal(attempt, args).startswith(f"attempt.py: {named} is not the code that the ")


RECURSIVE = [("def relu_square_mlp(",
               "def power(h, n):\n    return h if n == 1 else h * power(h, n - 1)\n\n\n"
               "def relu_square_mlp("),
              ("F.linear(F.relu(F.linear(x, w_fc)).square(), w_proj)",
               "F.linear(power(F.relu(F.linear(x, w_fc)), 2), w_proj)")]
PARTIAL = [("self.head_loss = head_loss  #", "self.head_loss = functools.partial(head_loss)  #")]


def test_a_recipe_with_a_recursive_helper_or_a_partial_stops_in_one_line_too(copies):
    """Its fingerprint takes each function it names once; a partial has no code to read."""
    for name, edits, named in [("recursive", RECURSIVE, "relu_square_mlp"),
                               ("partial", PARTIAL, "functools.partial(<function head_loss")]:
        attempt = copies(name, *edits)
        assert refusal(attempt, attempt.parse_args(SMALL_ARGS)).startswith(
            f"{name}.py: {named}"), name


def test_the_log_names_a_function_without_a_name(copies, tmp_path):
    """A partial as the model's head loss, on the CPU's path, which trains it."""
    attempt = copies("attempt", *PARTIAL)
    attempt.main(TINY + ["--num_iterations=1", "--val_every=0", f"--log_dir={tmp_path}"])
    text = next(tmp_path.glob("*.txt")).read_text()
    assert "the head's loss runs as functools.partial(<function head_loss at " in text


GELU_IN_FORWARD = [("return self.relu_square_mlp(x[0],", "return gelu_mlp(x[0],"),
                   ("def relu_square_mlp(", "def gelu_mlp(x, w_fc, w_proj):\n    return "
                    "F.linear(F.gelu(F.linear(x, w_fc)), w_proj)\n\n\ndef relu_square_mlp(")]


def test_an_mlp_that_calls_a_new_function_runs_the_edit_on_the_gpu_path(copies):
    """The kernel replaces the function the model holds; a forward that calls another function
    computes that one, on either path, and what_runs (the log's and the benchmarks' words) says
    so rather than name the kernel."""
    attempt = copies("attempt", *GELU_IN_FORWARD)
    torch.manual_seed(0)
    model = attempt.GPT(**SMALL)
    torch.nn.init.normal_(model.blocks[0].mlp.c_proj.weight, std=0.05)
    attempt.use_kernels(model, torch.device("cpu"))
    mlp = model.blocks[0].mlp
    x = randn(1, 256, 128, seed=6).float().cpu()
    expected = torch.nn.functional.linear(torch.nn.functional.gelu(
        x[0] @ mlp.c_fc.weight.T), mlp.c_proj.weight)
    assert torch.allclose(mlp(x)[0], expected, atol=1e-5)
    assert not torch.allclose(expected, train_gpt.relu_square_mlp(
        x[0], mlp.c_fc.weight, mlp.c_proj.weight), atol=1e-3)
    assert attempt.what_runs(model)["mlp"] == (
        "MLP.forward's own code (it does not call self.relu_square_mlp)")
    assert attempt.what_runs(model)["head"].startswith("the head kernel (Triton")


def test_the_unedited_file_and_edits_of_words_alone_take_the_kernels(copies):
    """Docstrings, comments and the layout of a line are not the code a kernel computes."""
    reworded = copies("reworded", (
        '    """The MLP: ReLU^2 between two products, relu(x w_fc^T)^2 w_proj^T."""',
        '    """ReLU squared."""  # the speedrun\'s activation'),
        ("return F.linear(F.relu(F.linear(x, w_fc)).square(), w_proj)",
         "return F.linear(F.relu(F.linear(x,\n"
         "                                 w_fc)).square(), w_proj)"))
    for module in (train_gpt, reworded):
        model = module.GPT(**SMALL)
        module.use_kernels(model, torch.device("cpu"))
        kernels = module.triton is not None  # without Triton the recipe's functions stay
        runs = module.what_runs(model)
        assert runs["head"].startswith("the head kernel (Triton") == kernels
        assert runs["mlp"].startswith("the MLP kernel (Triton") == kernels
    assert reworded.recipe_fingerprint(reworded.relu_square_mlp) == \
        train_gpt.KERNEL_RECIPES["mlp"]


@needs_triton
@pytest.mark.parametrize("softcap", [15.0, 30.0, 5.0])
def test_the_soft_cap_reaches_the_kernel_as_it_reaches_the_recipe(softcap):
    """--softcap, the record's own change, is an argument of both; the kernel follows the
    recipe's loss to 1e-6, on the same bf16 logits."""
    x, weight = randn(32, 64, seed=0), randn(5000, 64, scale=0.6, seed=1)
    targets = torch.randint(0, 5000, (32,), generator=torch.Generator().manual_seed(2))
    targets = targets.to(DEVICE)
    kernel = train_gpt.HeadLoss.apply(x, weight, targets, softcap).item()
    recipe = softcapped_cross_entropy_in_fp64(x, weight, targets, softcap)[0].item()
    at_15 = softcapped_cross_entropy_in_fp64(x, weight, targets, 15.0)[0].item()
    assert abs(kernel - recipe) < 1e-6 * recipe
    assert softcap == 15 or abs(recipe - at_15) > 1
    args = train_gpt.parse_args([f"--softcap={softcap:g}", *SMALL_ARGS])
    assert args.softcap == softcap
    model, _, _ = train_gpt.build_model(args, torch.device("cpu"), gpu_path=True)
    assert model.softcap == softcap and model.head_loss is train_gpt.triton_head_loss


def test_a_cap_past_the_head_kernels_reach_is_refused_and_the_recipe_takes_it(copies):
    """The kernel sums exp(capped logit) over a row in fp32 with no running maximum, and scales
    the row by 1 / (rows x that sum): for 2^24 rows and 50,304 columns, a normal fp32 number at
    a cap of 59, not at 60. The recipe's torch code has no such limit."""
    with pytest.raises(train_gpt.UserError, match=r"^--softcap=60.0: the head kernel scales "
                       r"each row by 1 / \(rows x its sum of exp\(capped logit\) over 50304 "
                       r"columns\), a normal fp32 number only for caps up to 59; "):
        train_gpt.use_kernels(train_gpt.GPT(**SMALL, softcap=60.0), torch.device("cpu"))
    train_gpt.use_kernels(train_gpt.GPT(**SMALL, softcap=59.0), torch.device("cpu"))
    tiny = torch.finfo(torch.float32).tiny
    assert 2 ** -24 / (50304 * math.exp(60)) < tiny < 2 ** -24 / (50304 * math.exp(59))
    generator = torch.Generator().manual_seed(0)  # logits of about 100, some of several hundred
    x, weight = torch.randn(64, 32, generator=generator), torch.randn(1000, 32, generator=generator)
    targets = torch.randint(0, 1000, (64,), generator=generator)
    recipe = train_gpt.head_loss(x, 18 * weight, targets, 1e4).item()
    uncapped = torch.nn.functional.cross_entropy(x @ (18 * weight).T, targets).item()
    assert uncapped > 100 and recipe == pytest.approx(uncapped, rel=1e-3)


def test_a_refused_configuration_leaves_no_log_so_the_suggested_rerun_may_take_its_run_id(
        copies, tmp_path, monkeypatch):
    """Under torchrun's --rdzv-id, a run id with a log is taken: the kernels' refusal must come
    before the log, or the rerun with --kernels=false that it suggests is refused in turn."""
    attempt = copies("attempt", GELU)
    build_model = attempt.build_model
    monkeypatch.setattr(attempt, "build_model",
                        lambda args, device: build_model(args, device, gpu_path=True))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "attempt-1")
    logs = tmp_path / "logs"
    argv = [a.replace("--num_layers=2", "--num_layers=1") for a in TINY] + [
        f"--log_dir={logs}", "--num_iterations=1", "--val_every=0"]
    with pytest.raises(attempt.UserError, match="--kernels=false"):
        attempt.main(argv)
    assert not logs.exists()
    monkeypatch.setattr(attempt, "build_model", build_model)  # the CPU's path: no compiling here
    assert list(attempt.main(argv + ["--kernels=false"])) == [1]
    assert (logs / "attempt-1.txt").exists()


@needs_triton
def test_the_kernel_at_the_largest_cap_it_takes_stays_finite():
    """Every logit far past the cap of 59, so each term of a row's sum is e^59 and the loss is
    exactly ln 50,304, with a gradient of 0 (tanh' is 0 that far out)."""
    x = torch.ones(4, 64, dtype=torch.bfloat16, device=DEVICE)
    weight = torch.full((50304, 64), 100.0, dtype=torch.bfloat16, device=DEVICE)  # logits: 6,400
    targets = torch.arange(4, device=DEVICE)
    loss, grad_logits = loss_and_grad_logits(x, weight, targets, 59.0)
    assert loss.item() == pytest.approx(math.log(50304), abs=1e-5)
    assert grad_logits.abs().max() == 0


@needs_triton
def test_at_the_largest_cap_the_rows_scales_stay_normal_and_give_the_gradients():
    """At a cap of 59, a row's sum reaches 50,304 e^59 where every logit is saturated: the
    kernel, with the scale of a micro-batch of 2^24 rows, gives that row a scale just above
    fp32's smallest normal number, which at 60, e times smaller, it would not be. Then the op
    at that cap (every logit but the targets' saturated, the targets' 0) against fp64's
    gradients."""
    vocab = 50304
    logits = torch.full((2, vocab), 6400.0, dtype=torch.bfloat16, device=DEVICE)
    losses = torch.empty(2, dtype=torch.float32, device=DEVICE)
    row_scales, _ = train_gpt.softcapped_cross_entropy_rows(
        logits, torch.tensor([0, 1], device=DEVICE), losses, 2.0 ** -24, 59.0, True)
    tiny = torch.finfo(torch.float32).tiny
    assert (tiny <= row_scales).all() and (row_scales / math.e < tiny).all()
    rows = 8
    x = torch.ones(rows, 64, dtype=torch.bfloat16, device=DEVICE)
    weight = torch.full((vocab, 64), 100.0, dtype=torch.bfloat16, device=DEVICE)
    targets = torch.arange(rows, device=DEVICE) * 7
    weight[targets] = 0.0
    weight[targets, :4] = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.bfloat16,
                                          device=DEVICE)
    loss, grad_x, grad_weight = train_gpt.head_loss_and_gradients(x, weight, targets, 59.0,
                                                                  True)
    exact = [x.double().requires_grad_(), weight.double().requires_grad_()]
    expected = train_gpt.head_loss(*exact, targets, 59.0)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert relative_error(grad_x, exact[0].grad) < 1e-2
    assert relative_error(grad_weight, exact[1].grad) < 1e-2


PLUS_ONE = ("tl.store(losses_ptr + row, tl.log(total) - softcap * tanh_target)",
            "tl.store(losses_ptr + row, tl.log(total) - softcap * tanh_target + 1)")


@needs_triton
def test_two_copies_in_one_process_keep_their_own_kernels(copies):
    """A copy whose kernel reports its loss plus one, loaded after train_gpt: each module's
    head runs its own kernel, before and after, and the copy's is the one plus one."""
    x, weight = randn(8, 64, seed=3), randn(5000, 64, scale=0.5, seed=4)
    targets = torch.randint(0, 5000, (8,), generator=torch.Generator().manual_seed(5))
    targets = targets.to(DEVICE)
    before = train_gpt.HeadLoss.apply(x, weight, targets, 15.0).item()
    attempt = copies("attempt", PLUS_ONE)
    assert attempt.OPS != train_gpt.OPS
    assert train_gpt.HeadLoss.apply(x, weight, targets, 15.0).item() == before
    assert attempt.HeadLoss.apply(x, weight, targets, 15.0).item() == pytest.approx(before + 1)
    assert torch.compile(train_gpt.HeadLoss.apply)(x, weight, targets, 15.0).item() == \
        pytest.approx(before, rel=1e-6)


@needs_triton
def test_two_copies_of_one_name_in_two_folders_keep_their_own_kernels(tmp_path):
    """attempt.py in two folders, as two record attempts side by side: one name, two ops."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    x, weight = randn(8, 64, seed=3), randn(5000, 64, scale=0.5, seed=4)
    targets = torch.randint(0, 5000, (8,), generator=torch.Generator().manual_seed(5)).to(DEVICE)
    try:
        first = load_copy(tmp_path / "a", "attempt")
        second = load_copy(tmp_path / "b", "attempt", PLUS_ONE)
        assert first.OPS != second.OPS
        loss = first.HeadLoss.apply(x, weight, targets, 15.0).item()
        assert second.HeadLoss.apply(x, weight, targets, 15.0).item() == \
            pytest.approx(loss + 1)
        assert first.HeadLoss.apply(x, weight, targets, 15.0).item() == loss
    finally:
        sys.modules.pop("attempt", None)


@needs_triton
def test_a_kernel_that_does_not_compile_stops_with_tritons_own_error(copies):
    """An edited kernel with a typo is not a silent fall back to the recipe: the run stops with
    the error of Triton's compiler (here, its interpreter's)."""
    attempt = copies("attempt", ("acc = tl.dot(a, b.to(OPERAND), acc)",
                                 "acc = tl.dott(a, b.to(OPERAND), acc)"))
    model = attempt.GPT(**SMALL)
    attempt.use_kernels(model, torch.device("cpu"))
    assert model.blocks[0].mlp.relu_square_mlp.func is attempt.triton_relu_square_mlp
    with pytest.raises(Exception, match="dott"):
        model.blocks[0].mlp(randn(1, 128, 128, seed=1).float())


NO_DOCUMENTS = ("return (doc_start[q_idx] <= kv_idx) & (kv_idx <= q_idx)",
                "return kv_idx <= q_idx")
WIDER_WINDOW = ("in_window = q_blk - kv_blk < window_blocks",
                "in_window = q_blk - kv_blk <= window_blocks")


@pytest.mark.parametrize("edit", [NO_DOCUMENTS, WIDER_WINDOW], ids=["no-documents", "window"])
def test_an_edit_of_the_mask_reaches_both_attention_paths(edit, copies):
    """The CPU's dense mask is FlexAttention's: the same blocks and the same per-token rule,
    read from the BlockMask as FlexAttention reads it."""
    attempt = copies("attempt", edit)
    rng = np.random.default_rng(0)
    changed = False
    for layout in ["many_short", "few_long", "block_edges"]:
        inputs = random_documents(rng, 6, layout)
        for window in [1, 2, 4]:
            window = torch.tensor(window)
            dense = attempt.dense_attention_mask(inputs, window)
            assert torch.equal(dense, block_mask_to_dense(attempt.build_block_mask(inputs, window),
                                                          inputs)), (layout, window)
            changed |= not torch.equal(dense, train_gpt.dense_attention_mask(inputs, window))
    assert changed  # and the edit did change the mask


@needs_triton
def test_a_narrower_mlp_takes_the_kernel_where_its_tiles_divide_and_the_recipe_elsewhere(copies):
    """A copy with 3 x dim hidden units: 768 at a width of 256 splits into the kernel's tiles of
    256 columns, 384 at 128 does not."""
    attempt = copies("attempt", ("self.c_fc = CastedLinear(dim, 4 * dim)",
                                 "self.c_fc = CastedLinear(dim, 3 * dim)"),
                     ("self.c_proj = CastedLinear(4 * dim, dim, zero_init=True)",
                      "self.c_proj = CastedLinear(3 * dim, dim, zero_init=True)"))
    for dim, kernel in [(256, True), (128, False)]:
        torch.manual_seed(0)
        model = attempt.GPT(**dict(SMALL, model_dim=dim),  # in bf16 on a GPU, as a run's
                            embed_dtype=torch.bfloat16 if DEVICE == "cuda" else torch.float32)
        mlp = model.blocks[0].mlp
        torch.nn.init.normal_(mlp.c_proj.weight, std=dim ** -0.5)
        attempt.use_kernels(model.to(DEVICE), torch.device(DEVICE))
        assert mlp.c_fc.weight.shape == (3 * dim, dim)
        assert attempt.what_runs(model)["mlp"].startswith("the MLP kernel") == kernel, dim
        x = randn(1, 128, dim, seed=6)
        args = (x[0], mlp.c_fc.weight.type_as(x), mlp.c_proj.weight.type_as(x))
        expected = attempt.relu_square_mlp(*(t.double() for t in args))
        assert relative_error(mlp(x)[0], expected) < 1e-2, dim
