"""Run Muon for a few steps on an uneven set of parameters; launched by tests/test_muon.py with
torchrun (gloo, CPU). After step 2 each rank's own state goes through state_dict() and
load_state_dict(), as after the compile steps; after step 3 the state gathered on rank 0 goes to
every rank and is loaded, as in a resume. Every rank saves to OUT/rank<r>.pt its parameters
after every step, whether each momentum buffer it kept after step 2 owns a storage of its own
size, and the parameter indices of its own state and of its gathered one."""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from train_gpt import Muon  # noqa: E402

# numel 128: five parameters (uneven for 2 and 3 ranks); 144: one, fewer than the ranks;
# 200: four (even for 2 ranks, uneven for 3)
SHAPES = [(8, 16), (16, 8), (4, 32), (12, 12), (10, 20), (8, 16), (20, 10), (16, 8), (10, 20),
          (20, 10)]
STEPS = 4


def run():
    torch.set_num_threads(1)  # the same arithmetic in every process, whatever the world size
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    generator = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in SHAPES]
    muon = Muon(params, lr=0.05, momentum=0.9)
    history = []
    for step in range(STEPS):
        for p in params:  # the same gradients on every rank, as after DDP's all-reduce
            p.grad = torch.randn(p.shape, generator=generator)
        muon.param_groups[0]["momentum"] = 0.85 + 0.02 * step
        muon.step()
        history.append([p.detach().clone() for p in params])
        if step == 1:
            muon.load_state_dict(muon.state_dict())
            compact = [s["momentum_buffer"].untyped_storage().nbytes() == s["momentum_buffer"].nbytes
                       for s in muon.state.values()]
        if step == 2:
            own, gathered = muon.state_dict(), [muon.state_dict(gather=True)]
            held = dict(own=sorted(own["state"]), gathered=sorted(gathered[0]["state"]))
            if dist.is_initialized():
                dist.broadcast_object_list(gathered, src=0)
            muon.load_state_dict(gathered[0])
    torch.save(dict(history=history, compact=compact, held=held),
               Path(sys.argv[1]) / f"rank{rank}.pt")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    run()
    os._exit(0)  # no interpreter teardown, where gloo's threads now and then abort the process
