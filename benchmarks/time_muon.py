"""Time one Muon step over the reference configuration's block matrices.

    python benchmarks/time_muon.py                                      # one process
    torchrun --standalone --nproc_per_node=2 benchmarks/time_muon.py    # 2 ranks (gloo on CPU)

Builds the 44 attention matrices (768 x 768) and 24 MLP matrices (768 x 3072, 3072 x 768) of
the 12-layer model, gives them random gradients, and times `Muon.step` (the median of --steps
after one warm-up step). Runs on a GPU when there is one, else on the CPU in fp32.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from train_gpt import Muon  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
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
    main()
