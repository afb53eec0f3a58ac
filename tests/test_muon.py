"""Muon section: Newton-Schulz, the Muon update, its distributed form, and the optimizer setup."""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from muon_worker import SHAPES
from train_gpt import (GPT, Hyperparameters, Muon, build_optimizers, lr_multiplier,
                       muon_momentum, optimizer_step, window_schedule, zeropower_via_newtonschulz5)


def with_singular_values(rows, cols, seed):
    """A matrix with known singular vectors and singular values spread over [0.1, 1]."""
    generator = torch.Generator().manual_seed(seed)
    k = min(rows, cols)
    u, _ = torch.linalg.qr(torch.randn(rows, k, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, k, generator=generator, dtype=torch.float64))
    s = torch.linspace(0.1, 1, k, dtype=torch.float64)[torch.randperm(k, generator=generator)]
    return (u * s) @ v.T, u, v


@pytest.mark.parametrize("rows, cols", [(64, 64), (32, 128), (128, 32), (768, 3072)])
def test_newton_schulz_orthogonalizes(rows, cols):
    g, u, v = with_singular_values(rows, cols, seed=rows + cols)
    x = zeropower_via_newtonschulz5(g.float()).double()
    assert x.shape == (rows, cols)
    s = torch.linalg.svdvals(x)
    assert s.min() > 0.6 and s.max() < 1.25
    core = u.T @ x @ v  # diagonal when x = U diag(f(s)) V^T with the input's U and V
    off_diagonal = core - torch.diag(core.diagonal())
    assert off_diagonal.abs().max() < 1e-4
    assert core.diagonal().min() > 0.6  # and the same sign: no vector flipped


def test_compiled_newton_schulz_matches_eager():
    """On a GPU Muon runs the compiled function, compiled as here; it must compute what the eager
    one does. (On a CPU, reduce-overhead has no CUDA graph to record: the kernels are the same.)"""
    compiled = torch.compile(zeropower_via_newtonschulz5, dynamic=False, mode="reduce-overhead")
    for rows, cols in [(64, 64), (128, 32), (32, 128)]:
        g, _, _ = with_singular_values(rows, cols, seed=rows * cols)
        eager = zeropower_via_newtonschulz5(g.float())
        assert (compiled(g.float()) - eager).abs().max() < 1e-5, (rows, cols)
    params = [torch.nn.Parameter(torch.zeros(4, 4))]
    assert Muon(params, lr=0.1, momentum=0.9).orthogonalize is zeropower_via_newtonschulz5


def newton_schulz(g, steps=5):
    """The quintic Newton-Schulz iteration, written out for comparison."""
    x = g.T if g.size(0) > g.size(1) else g
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        a = x @ x.T
        x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
    return x.T if g.size(0) > g.size(1) else x


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_matches_a_plain_reference(nesterov):
    generator = torch.Generator().manual_seed(0)
    shapes = [(16, 32), (32, 16), (24, 24), (16, 32)]
    params = [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in shapes]
    expected = [p.detach().clone() for p in params]
    buffers = [torch.zeros(s) for s in shapes]  # Muon's momentum starts at zero
    muon = Muon(params, lr=0.05, momentum=0.9, nesterov=nesterov)
    for step in range(5):
        momentum, lr = 0.85 + 0.02 * step, 0.05 * (1 - 0.1 * step)
        for group in muon.param_groups:
            group["momentum"], group["lr"] = momentum, lr
        grads = [torch.randn(s, generator=generator) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        muon.step()
        for i, (w, g) in enumerate(zip(expected, grads)):
            buffers[i] = momentum * buffers[i] + (1 - momentum) * g
            direction = (1 - momentum) * g + momentum * buffers[i] if nesterov else buffers[i]
            scale = math.sqrt(max(1, w.size(0) / w.size(1)))
            expected[i] = w - lr * scale * newton_schulz(direction)
        for p, w in zip(params, expected):
            assert (p.detach() - w).abs().max() < 1e-6, step


def test_muon_groups_parameters_by_size():
    shapes = [(8, 16), (16, 8), (12, 12), (4, 32)]
    muon = Muon([torch.nn.Parameter(torch.zeros(s)) for s in shapes], lr=0.1, momentum=0.9)
    assert [[tuple(p.shape) for p in g["params"]] for g in muon.param_groups] == [
        [(12, 12)], [(8, 16), (16, 8), (4, 32)]]


def run_workers(tmp_path, nproc):
    out = tmp_path / f"w{nproc}"
    out.mkdir()
    worker = Path(__file__).resolve().parent / "muon_worker.py"
    if nproc == 1:
        command = [sys.executable, str(worker), str(out)]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={nproc}", str(worker), str(out)]
    # what the PyTorch at hand deprecates is an error: 2.14 deprecates all_gather_into_tensor
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONWARNINGS="error::FutureWarning"))
    assert result.returncode == 0, result.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(nproc)]


def test_distributed_muon_is_bit_identical_to_one_process(tmp_path):
    """Also across the round trips of the compile steps' restore (after step 2) and a resume
    (step 3)."""
    (single,) = run_workers(tmp_path, 1)
    every = list(range(len(SHAPES)))
    assert single["held"] == dict(own=every, gathered=every)
    for nproc in (2, 3):
        ranks = run_workers(tmp_path, nproc)
        for step, expected in enumerate(single["history"]):
            for rank, saved in enumerate(ranks):
                for got, want in zip(saved["history"][step], expected):
                    assert torch.equal(got, want), (nproc, rank, step)
        for rank, saved in enumerate(ranks):  # copies, not views into the gathered rows
            assert saved["compact"] and all(saved["compact"]), (nproc, rank)
        # each rank holds its own momentum buffers, and only rank 0 gathers them all
        owners = [saved["held"]["own"] for saved in ranks]
        assert sorted(sum(owners, [])) == every, (nproc, owners)
        assert [saved["held"]["gathered"] for saved in ranks] == [every] + owners[1:], nproc
    history = single["history"]
    assert not torch.equal(history[0][0], history[1][0])  # the steps really moved the weights


def test_loaded_momentum_buffers_are_copies():
    """A kept buffer must not be a view that keeps a larger gathered tensor alive."""
    params = [torch.nn.Parameter(torch.zeros(4, 8)) for _ in range(3)]
    muon = Muon(params, lr=0.05, momentum=0.9)
    rows = torch.arange(4 * 32, dtype=torch.float32).view(4, 32)  # as gathered from 4 ranks
    state = muon.state_dict()
    state["state"] = {i: {"momentum_buffer": rows[i].view(4, 8)} for i in range(3)}
    muon.load_state_dict(state)
    for i, p in enumerate(params):
        buffer = muon.state[p]["momentum_buffer"]
        assert torch.equal(buffer, rows[i].view(4, 8))
        assert buffer.untyped_storage().nbytes() == buffer.nbytes == 4 * 8 * 4


# ----------------------------------------------------------------------------- optimizer setup


def test_every_parameter_is_in_exactly_one_group():
    torch.manual_seed(0)
    model = GPT(vocab_size=50257, num_layers=12, num_heads=2, model_dim=64, max_seq_len=128)
    adam, muon = build_optimizers(model, Hyperparameters())
    in_groups = [p for opt in (adam, muon) for g in opt.param_groups for p in g["params"]]
    assert len(in_groups) == len({id(p) for p in in_groups}) == len(list(model.parameters()))
    block_matrices = {id(p) for p in model.blocks.parameters() if p.ndim == 2}
    assert {id(p) for g in muon.param_groups for p in g["params"]} == block_matrices
    embed, head, scalars = adam.param_groups
    assert [id(p) for p in embed["params"]] == [id(model.embed.weight)] + [
        id(t.weight) for t in model.value_embeds]
    assert [id(p) for p in head["params"]] == [id(model.lm_head.weight)]
    assert all(p.ndim < 2 for p in scalars["params"]) and len(scalars["params"]) == 12 + 11 + 1
    assert [embed["lr"], head["lr"], scalars["lr"]] == [0.6, 0.008, 0.04]
    assert adam.defaults["betas"] == (0.8, 0.95) and adam.defaults["eps"] == 1e-8
    assert all(g["lr"] == 0.05 and g["nesterov"] and g["ns_steps"] == 5 for g in muon.param_groups)
    assert all(g["initial_lr"] == g["lr"] for opt in (adam, muon) for g in opt.param_groups)


@pytest.mark.parametrize("step, multiplier, momentum", [(0, 1, 0.85), (150, 1, 0.90),
                                                         (1112, 0.5, 0.95)])
def test_optimizer_step_applies_the_schedules_of_its_step(step, multiplier, momentum):
    """One step of fresh optimizers at `step` of 1390 (1112: 278 steps left, half the cooldown):
    Adam's first update of an entry is its lr times g / (|g| + eps), Muon's is its lr times
    the orthogonalized momentum, and both rates must be the step's before they are applied."""
    torch.manual_seed(0)
    model = GPT(vocab_size=50257, num_layers=2, num_heads=2, model_dim=64, max_seq_len=128)
    args = Hyperparameters()
    adam, muon = build_optimizers(model, args)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    before = {p: (p.detach().clone(), p.grad.clone()) for p in model.parameters()}
    optimizer_step(adam, muon, step, args)
    for group, lr in zip(adam.param_groups, (0.6, 0.008, 0.04)):
        for p in group["params"]:
            w, g = before[p]
            torch.testing.assert_close(p.detach(), w - lr * multiplier * g / (g.abs() + 1e-8),
                                       rtol=0, atol=1e-6)
    for group in muon.param_groups:
        assert group["momentum"] == pytest.approx(momentum)
        for p in group["params"]:
            w, g = before[p]
            direction = (1 - momentum ** 2) * g  # Nesterov on a zero buffer: (1 - m) g (1 + m)
            scale = math.sqrt(max(1, w.size(0) / w.size(1)))
            torch.testing.assert_close(p.detach(), w - 0.05 * multiplier * scale
                                       * newton_schulz(direction), rtol=0, atol=1e-6)
    assert all(p.grad is None for p in model.parameters())


def test_schedules_at_start_sixty_percent_and_end():
    n = 1390
    assert lr_multiplier(0, n, 0.4) == 1.0
    assert lr_multiplier(834, n, 0.4) == 1.0  # 60%: the last step at full rate
    assert lr_multiplier(835, n, 0.4) == pytest.approx((1 - 835 / n) / 0.4)
    assert lr_multiplier(1112, n, 0.4) == pytest.approx(0.5, abs=2e-3)
    assert lr_multiplier(n, n, 0.4) == 0.0
    assert muon_momentum(0) == 0.85 and muon_momentum(150) == pytest.approx(0.90)
    assert muon_momentum(300) == pytest.approx(0.95) and muon_momentum(n) == pytest.approx(0.95)
    # 60%: (0.4 * 128 + 0.6 * 1856) // 128 = 1164.8 // 128 = 9
    assert (window_schedule(0, n), window_schedule(834, n), window_schedule(n, n)) == (1, 9, 14)
    assert [window_schedule(s, n) for s in range(n + 1)] == sorted(window_schedule(s, n)
                                                                  for s in range(n + 1))
