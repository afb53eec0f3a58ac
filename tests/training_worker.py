"""Launched by tests/test_training.py, with plain python (one process) or torchrun (gloo):

    training_worker.py train OUT [--name=value ...]   runs train_gpt.main, saves its val losses
    training_worker.py grads OUT [--name=value ...]   one train_step, saves the gradients
    training_worker.py crash OUT [...]   train, but the last rank dies in step 5 of the first
                                         attempt (torchrun --max-restarts then starts it again)
    training_worker.py nan OUT [...]     train, but the last rank's loss of step 5 is NaN;
                                         each rank writes the error to OUT/stopped_rank<r>.txt
    training_worker.py sigterm OUT [...] train, but the last rank alone gets SIGTERM in step 5
    training_worker.py diskfull OUT [...] train, but rank 0 cannot write checkpoints; each rank
                                         writes the error to OUT/stopped_rank<r>.txt

Rank 0 writes OUT/result.pt.
"""
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train_gpt  # noqa: E402


def gradients(argv):
    args = train_gpt.parse_args(argv)
    rank, world_size, device = train_gpt.setup_device()
    torch.manual_seed(args.seed)
    model = train_gpt.GPT(args.vocab_size, args.num_layers, args.num_heads, args.model_dim,
                          max_seq_len=args.micro_batch_size)
    ddp_model = DDP(model, broadcast_buffers=False, gradient_as_bucket_view=True) \
        if dist.is_initialized() else model
    with torch.no_grad():  # a nonzero head and projections, so every gradient is informative
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    loader = train_gpt.DistributedDataLoader(args.train_files, rank, world_size)
    inputs, targets = loader.next_batch(args.batch_size)
    seq_len = train_gpt.sequence_length(args, world_size)
    train_gpt.train_step(ddp_model, inputs, targets, torch.tensor(2), seq_len)
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def break_step_5(mode):
    """Wrap train_step so that on the last rank its 5th call dies, returns NaN or gets SIGTERM."""
    original, calls = train_gpt.train_step, []

    def train_step(*args):
        calls.append(None)
        loss = original(*args)
        if len(calls) == 5 and dist.get_rank() == dist.get_world_size() - 1:
            if mode == "nan":
                return torch.full_like(loss, float("nan"))
            if mode == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            if mode == "crash" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
                os._exit(1)  # no clean-up at all, as in a crash
        return loss
    train_gpt.train_step = train_step


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, out, argv = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    if mode in ("crash", "nan", "sigterm"):
        break_step_5(mode)
    if mode == "diskfull" and os.environ["RANK"] == "0":
        def write_checkpoint(state, path):
            raise OSError(28, "No space left on device")
        train_gpt.write_checkpoint = write_checkpoint
    code = 0
    try:
        result = gradients(argv) if mode == "grads" else train_gpt.main(argv)
        if not dist.is_initialized() or dist.get_rank() == 0:
            torch.save(result, out / "result.pt")
    except (FloatingPointError, OSError) as err:
        (out / f"stopped_rank{os.environ['RANK']}.txt").write_text(str(err))
    except SystemExit as err:  # an interrupted run: its message, and a failure for torchrun
        print(err, file=sys.stderr)
        code = 1
    if dist.is_initialized():
        dist.destroy_process_group()
    # Skip the interpreter's teardown: now and then gloo's threads, destroyed during it,
    # abort the process ("terminate called without an active exception") after its work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
