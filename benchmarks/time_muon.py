"""Time one Muon step over the reference configuration's block matrices.

    python benchmarks/time_muon.py [--script attempt.py]                # one process
    torchrun --standalone --nproc_per_node=2 benchmarks/time_muon.py    # 2 ranks (gloo on CPU)

Builds the 44 attention matrices (768 x 768) and 24 MLP matrices (768 x 3072, 3072 x 768) of
the 12-layer model, gives them random gradients, and times `Muon.step` (the median of --steps
after one warm-up step). Runs on a GPU when there is one, else on the CPU in fp32.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

from training_script import TRAIN_GPT, load_script, run_tool


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--script", default=TRAIN_GPT,
                        help="the training script whose Muon to time (default: train_gpt.py)")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps={args.steps}: time at least 1 step")
    Muon = load_script(args.script).Muon
    cuda = torch.cuda.is_available()
    if "RANK" in os.environ:
        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else "cpu"
    shapes = [(768, 768)] * 44 + [(768, 3072), (3072, 768)] * 12
    params = [torch.nn.Parameter(torch.randn(s, device=device)) for s in shapes]
    muon = Muon(params, lr=0.05, momentum=0.95)
    times = []
    for _ in range(args.steps + 1):
        for p in params:
            p.grad = torch.randn_like(p)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        muon.step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    median = sorted(times[1:])[len(times[1:]) // 2]
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if rank == 0:
        print(f"Muon step, {len(params)} block matrices, {world_size} rank(s) on {device}, "
              f"{torch.get_num_threads()} thread(s) per rank: median {1e3 * median:.0f} ms "
              f"over {args.steps} steps")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tool(main)
