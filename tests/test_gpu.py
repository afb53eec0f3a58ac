"""The CUDA path: FlexAttention, the compiled bf16 model, recompiles, host syncs, memory, Muon.

Each test needs a CUDA GPU and is skipped without one, with that reason. The CPU tests check the
same code in fp32 through the dense attention path; these check what only a GPU runs.
"""
import functools
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

import train_gpt
from test_kernels import kernel_on_all_rows, relative_error
from test_model import perturbed, random_documents
from test_muon import with_singular_values
from train_gpt import (GPT, DistributedDataLoader, Muon, build_block_mask, build_model,
                       build_optimizers, dense_attention_mask, evaluate, forward_backward, main,
                       optimizer_step, use_kernels, zeropower_via_newtonschulz5)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU; the CPU tests cover the fp32 path")
ROOT = Path(__file__).resolve().parent.parent
SOFTCAP = train_gpt.Hyperparameters.softcap
SAMPLE = ROOT / "data" / "shakespeare"
# a small model with the reference's head size, on the embedded sample, 2 sequences per step
SMALL = [f"--train_files={SAMPLE}/shakespeare_train_*.bin",
         f"--val_files={SAMPLE}/shakespeare_val_*.bin", "--num_layers=4", "--num_heads=2",
         "--model_dim=256", "--batch_size=8192", "--micro_batch_size=4096", "--val_tokens=8192"]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-3), (torch.bfloat16, 2e-2)])
def test_flex_attention_matches_dense_sdpa(dtype, tolerance):
    flex = torch.compile(flex_attention, dynamic=False)
    rng = np.random.default_rng(0)
    generator = torch.Generator(device="cuda").manual_seed(0)
    for layout, window in [("many_short", 2), ("few_long", 5), ("block_edges", 1),
                           ("starts_with_eot", 3), ("no_eot", 16)]:
        inputs = random_documents(rng, 16, layout).cuda()
        q, k, v = torch.randn(3, 1, 6, 16 * 128, 128, device="cuda",
                              generator=generator).unbind(0)
        window_blocks = torch.tensor(window, dtype=torch.int32, device="cuda")
        got = flex(q.to(dtype), k.to(dtype), v.to(dtype),
                   block_mask=build_block_mask(inputs, window_blocks))
        expected = F.scaled_dot_product_attention(
            q, k, v, attn_mask=dense_attention_mask(inputs, window_blocks))
        assert got.dtype == dtype and relative_error(got, expected) < tolerance, layout


def test_compiled_bf16_model_matches_fp32_eager():
    """The GPU's model (compiled, FlexAttention, the kernels, bf16) against the CPU's (eager, fp32),
    within a tolerance ten times smaller than the change from window 1 to 14: weights large
    enough for attention to matter, and long documents. Measured on a CPU: the fp32 losses at
    windows 1 and 14 differ by 0.116; eager bf16 on a CPU is within 1.3e-3 of them."""
    tolerance = 1e-2
    torch.manual_seed(0)
    reference = perturbed(GPT(vocab_size=50257, num_layers=4, num_heads=2, model_dim=256,
                              max_seq_len=4096), scale=0.5)
    model = GPT(vocab_size=50257, num_layers=4, num_heads=2, model_dim=256, max_seq_len=4096,
                embed_dtype=torch.bfloat16).cuda()
    use_kernels(model, torch.device("cuda"))
    runs = train_gpt.what_runs(model)
    assert runs["head"].startswith("the head kernel") and runs["mlp"].startswith("the MLP kern")
    model.load_state_dict(reference.state_dict())
    rng = np.random.default_rng(1)
    tokens = torch.tensor(np.where(rng.random(4097) < 0.0005, 50256,
                                   rng.integers(0, 50257, 4097)))
    expected = {window: reference(tokens[:-1], tokens[1:], torch.tensor(window)).item()
                for window in [1, 3, 14]}
    assert abs(expected[1] - expected[14]) > 10 * tolerance, expected
    compiled = torch.compile(model)
    for window in expected:
        got = compiled(tokens[:-1].cuda(), tokens[1:].cuda(),
                       torch.tensor(window, device="cuda")).item()
        assert abs(got - expected[window]) < tolerance, (window, got, expected[window])


def test_no_recompile_after_the_first_validation():
    """A growing window and switching between training and validation reuse the compiled code."""
    args = train_gpt.parse_args(SMALL + ["--num_iterations=8"])
    device = torch.device("cuda")
    model, compiled, ddp_model = build_model(args, device)
    adam, muon = build_optimizers(model, args)
    train_loader = DistributedDataLoader(args.train_files, 0, 1, device)
    val_loader = DistributedDataLoader(args.val_files, 0, 1, device)
    window = torch.tensor(1, dtype=torch.int32, device=device)

    def train_and_validate(step):
        window.fill_(train_gpt.window_schedule(step, args.num_iterations))
        inputs, targets = train_loader.next_batch(args.batch_size)
        forward_backward(ddp_model, inputs, targets, window, args.micro_batch_size)
        optimizer_step(adam, muon, step, args)
        return evaluate(compiled, val_loader, window, args, 1)

    evaluate(compiled, val_loader, window, args, 1)  # the first validation, at step 0
    train_and_validate(0)
    with torch.compiler.set_stance("fail_on_recompile"):
        losses = [train_and_validate(step) for step in (1, 3, 5, 7)]  # windows 2, 6, 9 and 12
        window.fill_(14)
        losses.append(evaluate(compiled, val_loader, window, args, 1))
    assert losses[3] < losses[0]  # and the steps trained


def test_steady_steps_never_wait_for_the_gpu(tmp_path, monkeypatch):
    """From the third step on, any host-device synchronisation raises, until validation. Each
    step's line is read once the next step is queued. The log says that both kernels ran."""
    original_step, calls, events = train_gpt.forward_backward, [], []

    def forward_backward_watched(*args):
        calls.append(None)
        if len(calls) == 3:
            torch.cuda.set_sync_debug_mode("error")
        return original_step(*args)

    class Clock(train_gpt.TrainClock):
        def paused(self):  # validation and checkpoints synchronise on purpose
            torch.cuda.set_sync_debug_mode("default")
            return super().paused()

    send, receive = train_gpt.send_loss_and_stop, train_gpt.receive_loss_and_stop

    def sent(step, *args):
        events.append(("queued", step))
        return send(step, *args)

    def received(in_flight, clock):
        events.append(("read", in_flight[0]))
        return receive(in_flight, clock)

    monkeypatch.setattr(train_gpt, "forward_backward", forward_backward_watched)
    monkeypatch.setattr(train_gpt, "TrainClock", Clock)
    monkeypatch.setattr(train_gpt, "send_loss_and_stop", sent)
    monkeypatch.setattr(train_gpt, "receive_loss_and_stop", received)
    try:
        main(SMALL + ["--num_iterations=10", "--val_every=0", "--compile_steps=0",
                      f"--log_dir={tmp_path}"])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(calls) == 10
    # step s's line is read after step s + 1 is queued; the last one's before the validation
    assert events == [("queued", 1)] + [event for step in range(2, 11) for event in
                                        (("queued", step), ("read", step - 1))] + [("read", 10)]
    text = next(tmp_path.glob("*.txt")).read_text()
    assert "the head's loss runs as the head kernel (Triton, " in text
    assert "the MLPs as the MLP kernel (Triton, " in text


def peak_memory_mib(tmp_path, compile_steps):
    command = [sys.executable, str(ROOT / "train_gpt.py"), *SMALL, "--num_iterations=12",
               "--val_every=0", f"--compile_steps={compile_steps}", f"--log_dir={tmp_path}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return int(re.search(r"peak memory consumption: (\d+) MiB", result.stdout)[1])


def test_the_compile_steps_leave_no_trace_in_peak_memory(tmp_path):
    """The snapshot of the initial state waits in host memory, not beside the weights."""
    cold, warm = peak_memory_mib(tmp_path, 0), peak_memory_mib(tmp_path, 10)
    assert abs(warm - cold) <= 0.01 * cold, (cold, warm)


def test_expandable_segments_are_on():
    code = ("import os, torch, train_gpt; train_gpt.setup_device(); x = torch.ones(1 << 20, "
            "device='cuda'); print(os.environ['PYTORCH_ALLOC_CONF']); "
            "s = torch.cuda.memory_snapshot(); "
            "print(bool(s) and all(seg.get('is_expandable') for seg in s))")
    env = {k: v for k, v in __import__("os").environ.items() if "ALLOC_CONF" not in k}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["expandable_segments:True", "True"]


def test_newton_schulz_on_the_gpu_is_compiled_and_orthogonalizes():
    params = [torch.nn.Parameter(torch.zeros(768, 768, device="cuda"))]
    muon = Muon(params, lr=0.05, momentum=0.95)
    assert muon.orthogonalize is not zeropower_via_newtonschulz5
    assert muon.orthogonalize._torchdynamo_orig_callable is zeropower_via_newtonschulz5
    for rows, cols in [(768, 768), (3072, 768), (768, 3072)]:
        g, u, v = with_singular_values(rows, cols, seed=rows + cols)
        x = muon.orthogonalize(g.float().cuda())
        assert x.dtype == torch.bfloat16 and x.shape == (rows, cols)
        s = torch.linalg.svdvals(x.double())
        assert 0.5 < s.min() and s.max() < 1.5, (rows, cols, s.min(), s.max())
        eager = zeropower_via_newtonschulz5(g.float().cuda())  # bf16 vs fp32 on a CPU: 2.5%
        assert relative_error(x, eager) < 5e-2, (rows, cols)


def test_an_update_outlives_the_next_replay_of_its_cuda_graph():
    """An update stays intact after the next call of its shape's CUDA graph, which writes every
    result to the same memory: with several ranks the asynchronous all_gather may still be
    reading it. Each update is also checked against eager Newton-Schulz."""
    params = [torch.nn.Parameter(torch.zeros(768, 3072, device="cuda")) for _ in range(2)]
    muon = Muon(params, lr=0.05, momentum=0.95)
    group = muon.param_groups[0]
    generator = torch.Generator(device="cuda").manual_seed(0)
    for step in range(4):  # the graph is warmed up and recorded in step 0, replayed after
        for p in params:
            p.grad = torch.randn_like(p, generator=generator)
        first = muon._orthogonalized_update(params[0], group)
        kept = first.clone()
        second = muon._orthogonalized_update(params[1], group)
        assert torch.equal(first, kept), step
        for update, p in zip([first, second], params):  # p.grad now holds Nesterov's gradient
            eager = zeropower_via_newtonschulz5(p.grad)
            assert relative_error(update, eager.flatten()) < 5e-2, step
    # and a graph is replayed: a result lands where the last one did, though that one is still held
    held = muon.orthogonalize(params[0].grad)
    address = held.data_ptr()
    assert muon.orthogonalize(params[1].grad).data_ptr() == address


def test_muon_steps_with_compiled_newton_schulz_match_eager():
    """Several matrices of each shape over several steps: each gets its own update (updates of
    unrelated gradients differ by about 1.4 relative, bf16 roundings by a few percent)."""
    generator = torch.Generator().manual_seed(1)
    shapes = [(256, 256), (256, 1024), (1024, 256)] * 3
    weights = [torch.randn(s, generator=generator) for s in shapes]
    grads = [[torch.randn(s, generator=generator) for s in shapes] for _ in range(4)]
    moved = []
    for compiled in (True, False):
        params = [torch.nn.Parameter(w.cuda()) for w in weights]
        muon = Muon(params, lr=0.05, momentum=0.95)
        if not compiled:
            muon.orthogonalize = zeropower_via_newtonschulz5
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = g.cuda()
            muon.step()
        moved.append([p.detach().cpu() - w for p, w in zip(params, weights)])
    for got, eager in zip(*moved):
        assert relative_error(got, eager) < 5e-2


def test_one_muon_step_on_the_gpu_matches_the_cpu():
    """Muon's update on a GPU is the CPU's up to bf16 rounding (2.5% apart on a CPU)."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(s, generator=generator) for s in [(256, 1024), (1024, 256), (256, 256)]]
    grads = [torch.randn(w.shape, generator=generator) for w in weights]
    moved = []
    for device in ("cpu", "cuda"):
        params = [torch.nn.Parameter(w.to(device, copy=True)) for w in weights]
        for p, g in zip(params, grads):
            p.grad = g.to(device, copy=True)
        Muon(params, lr=0.05, momentum=0.95).step()
        moved.append([(p.detach().cpu() - w) for p, w in zip(params, weights)])
    for cpu_update, gpu_update in zip(*moved):
        assert relative_error(gpu_update, cpu_update) < 5e-2



def errors_against_fp32(fns, inputs, grad_out, expected):
    """For each fn: [relative error of its value, of each input's gradient] against
    `expected` = (value, gradients), on the same bf16 inputs."""
    errors = {}
    for name, fn in fns.items():
        leaves = [t.clone().requires_grad_() for t in inputs]
        value = fn(*leaves)
        value.backward(grad_out)
        errors[name] = [relative_error(value, expected[0])] + [
            relative_error(t.grad, e) for t, e in zip(leaves, expected[1])]
    return errors


@pytest.mark.parametrize("scale", [0.5, 0.07], ids=["into-the-cap", "trained-scale"])
def test_the_head_kernel_at_the_real_shape_is_as_close_to_fp32_as_the_compiled_graph(
        scale, monkeypatch):
    """A 65,536-token micro-batch against the 50,304-column head: logits reaching well into the
    cap (their spread about 14), or spread over a couple of units as a trained head's are, where
    every term of a row's sum counts. The kernel's loss and gradients against fp32, beside
    torch.compile's bf16 graph."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = F.rms_norm(torch.randn(65536, 768, device="cuda", generator=generator), (768,))
    weight = torch.randn(50304, 768, device="cuda", generator=generator) * scale
    targets = torch.randint(0, 50257, (65536,), device="cuda", generator=generator)
    x, weight = x.bfloat16(), weight.bfloat16()
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # fp32 means fp32
    loss = 0.0
    grads = [torch.zeros(x.shape, device="cuda"), torch.zeros(weight.shape, device="cuda")]
    for start in range(0, len(x), 8192):  # in fp32, 8,192 rows at a time: 1.6 GB of logits
        rows = slice(start, start + 8192)
        leaves = [x[rows].float().requires_grad_(), weight.float().requires_grad_()]
        part = train_gpt.head_loss(*leaves, targets[rows], SOFTCAP) * 8192 / len(x)
        part.backward()
        loss += part.detach()
        grads[0][rows] += leaves[0].grad
        grads[1] += leaves[1].grad
    fns = {"fused": lambda *xw: train_gpt.HeadLoss.apply(*xw, targets, SOFTCAP),
           "compiled": torch.compile(lambda *xw: train_gpt.head_loss(*xw, targets, SOFTCAP))}
    errors = errors_against_fp32(fns, [x, weight], None, (loss, grads))
    print(errors)
    assert errors["fused"][0] < 1e-4, errors
    for fused, compiled in zip(errors["fused"], errors["compiled"]):
        assert fused < 1.5 * compiled + 1e-4, errors


def test_a_zero_head_at_the_real_shape_gives_log_vocab_and_a_uniform_gradient():
    """At initialisation every logit is 0: the loss is ln 50,304 = 10.8258 and each row's
    gradient (1/V - onehot(target)) / rows. The kernel gives it as each row's scale, 1 / (rows
    V), times shares: 1 = e^0 tanh'(0) written over every logit but the targets', 0 there, and
    the targets' 1 - V. A warp that wrote over the row before the target's logit was read
    would move the loss by about 1; one whose write landed after the target's 0, leave a 1."""
    generator = torch.Generator(device="cuda").manual_seed(2)
    rows, vocab = 65536, 50304
    x = F.rms_norm(torch.randn(rows, 768, device="cuda", generator=generator), (768,)).bfloat16()
    weight = torch.zeros(vocab, 768, device="cuda", dtype=torch.bfloat16)
    targets = torch.randint(0, 50257, (rows,), device="cuda", generator=generator)
    loss, written, row_scales, target_shares = kernel_on_all_rows(x, weight, targets)
    assert abs(loss.item() - math.log(vocab)) < 1e-5
    at_targets = torch.zeros_like(written, dtype=torch.bool)
    at_targets[torch.arange(rows, device="cuda"), targets] = True
    assert (written == at_targets.logical_not()).all()
    assert (target_shares == 1 - vocab).all()
    assert (row_scales == row_scales[0]).all()
    assert abs(row_scales[0].item() * vocab * rows - 1) <= 1e-6


def test_an_h100_takes_the_mlp_kernels_deepest_pipeline():
    """The shared memory per block that torch reports, which use_kernels reads, is the figure
    tests/kernels_for_gpus.py checks the pipelines' needs against."""
    gpu = torch.cuda.get_device_properties(torch.device("cuda", 0))
    if (gpu.major, gpu.minor) != (9, 0):
        pytest.skip(f"the pipelines' order is the H100's; this GPU is sm_{gpu.major}{gpu.minor}")
    assert gpu.shared_memory_per_block_optin == 232_448  # 227 KiB
    assert train_gpt.mlp_pipeline_stages(torch.device("cuda", 0)) == train_gpt.MLP_STAGES[0]


@pytest.mark.parametrize("num_stages", train_gpt.MLP_STAGES)
def test_the_mlp_kernel_at_the_real_shape_is_as_close_to_fp32_as_the_compiled_graph(
        num_stages, monkeypatch):
    """With each of the kernel's pipelines, where it fits this GPU: an H100 runs the 99 KB
    GPUs' too."""
    gpu = torch.cuda.get_device_properties(torch.device("cuda", 0))
    if train_gpt.mlp_shared_memory(num_stages, gpu.major) > gpu.shared_memory_per_block_optin:
        pytest.skip(f"the MLP kernel's {num_stages} stages do not fit this GPU's shared memory")
    generator = torch.Generator(device="cuda").manual_seed(1)
    x = F.rms_norm(torch.randn(65536, 768, device="cuda", generator=generator), (768,))
    w_fc = torch.randn(3072, 768, device="cuda", generator=generator) * 768 ** -0.5
    w_proj = torch.randn(768, 3072, device="cuda", generator=generator) * 3072 ** -0.5
    grad_out = (torch.randn(65536, 768, device="cuda", generator=generator) / 65536).bfloat16()
    inputs = [t.bfloat16() for t in (x, w_fc, w_proj)]
    assert train_gpt.mlp_fits_tiles(65536, 768, 3072)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # fp32 means fp32
    leaves = [t.float().requires_grad_() for t in inputs]
    value = train_gpt.relu_square_mlp(*leaves)
    value.backward(grad_out.float())
    expected = (value.detach(), [t.grad for t in leaves])
    fns = {"fused": functools.partial(train_gpt.triton_relu_square_mlp, num_stages=num_stages),
           "compiled": torch.compile(train_gpt.relu_square_mlp)}
    errors = errors_against_fp32(fns, inputs, grad_out, expected)
    print(errors)
    for fused, compiled in zip(errors["fused"], errors["compiled"]):
        assert fused < 1.5 * compiled + 1e-4, errors


def test_resume_on_the_gpu_continues_like_a_run_that_never_stopped(tmp_path):
    """20 steps of the small model with a checkpoint at 10, resumed from it in a new process
    to 20, against 20 straight steps. Not bit for bit: on an H100 the compiled embedding
    backward adds with atomics, whose order varies from run to run, and a second straight run
    measures how far that alone takes the training state. (On an H100 the resumed losses
    differed by at most one in the fourth decimal, and block 0's attention c_proj, zero at the
    start and so all Muon updates, by 1.8%: a fixed 1% tolerance was no measure.) A resume
    that lost the optimizer state or took other batches misses the losses by far more than
    0.01."""
    def run(folder, *extra):
        command = [sys.executable, str(ROOT / "train_gpt.py"), *SMALL, "--num_iterations=20",
                   "--val_every=5", "--compile_steps=2", "--checkpoint_every=10",
                   "--save_checkpoint", f"--log_dir={folder}", *extra]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]

    from test_checkpoints import logged_losses
    from test_training import checkpoint
    run(tmp_path / "straight")
    run(tmp_path / "again")
    run(tmp_path / "resumed", f"--resume={checkpoint(tmp_path / 'straight', 10)}")
    straight = logged_losses(tmp_path / "straight", after=10)
    resumed = logged_losses(tmp_path / "resumed", after=10)
    assert list(resumed) == list(straight) and len(resumed) == 12
    print({key: (straight[key], resumed[key]) for key in straight})
    assert all(abs(float(resumed[key]) - float(straight[key])) < 0.01 for key in straight)
    straight, again, resumed = [torch.load(checkpoint(tmp_path / name, 20), weights_only=True)
                                for name in ("straight", "again", "resumed")]
    assert straight["step"] == resumed["step"] == 20
    assert straight["train_loader"] == resumed["train_loader"]

    def within_run_to_run(get):
        """The resumed tensor is within three times the distance between the two straight
        runs' tensors, plus 1e-3: one pair of runs is a noisy measure of their spread."""
        error, spread = (relative_error(get(other), get(straight)) for other in (resumed, again))
        return error <= 3 * spread + 1e-3, (error, spread)

    for name in straight["model"]:
        ok, errors = within_run_to_run(lambda run_state: run_state["model"][name])
        assert ok, (name, errors)
    for part in ("adam", "muon"):
        for index, state in straight[part]["state"].items():
            for key, value in state.items():
                if value.ndim:  # not Adam's step count
                    ok, errors = within_run_to_run(
                        lambda run_state: run_state[part]["state"][index][key])
                    assert ok, (part, index, key, errors)
