"""Launched by tests/test_training.py, with plain python (one process) or torchrun (gloo):

    training_worker.py train OUT [--name=value ...]   runs train_gpt.main, saves its val losses
    training_worker.py gpu_path OUT [...]  the same on the GPU's path: compiled, with the kernels
                                         (in Triton's interpreter on a CPU); saves the val losses
                                         and how many times each kernel was launched
    training_worker.py grads OUT [--name=value ...]   one forward and backward, saves the gradients
    training_worker.py crash OUT [...]   train, but the last rank dies in step 5 of the first
                                         attempt (torchrun --max-restarts then starts it again)
    training_worker.py nan OUT [...]     train, but the last rank's loss of step 5 is NaN
    training_worker.py sigterm OUT [...] train, but the last rank alone gets SIGTERM in step 5
    training_worker.py sigint:K OUT [...] (or sigterm:K) the same signal, in step K
    training_worker.py torchrun_sigterm:K OUT [...]  rank 0 sends SIGTERM to torchrun in step K,
                                         and waits until torchrun has passed it on to rank 0
    training_worker.py diskfull:K OUT [...] train, but rank 0 cannot write the K-th checkpoint
                                         or any after it: from then on no file it writes may
                                         grow past 1 MiB (RLIMIT_FSIZE)
    training_worker.py logfull:N OUT [...] train, but once its header is written, the log
                                         takes N bytes more (RLIMIT_FSIZE), past which its
                                         writes fail as on a full disk
    training_worker.py hang:K OUT [...]  train, but the last rank says "blocked" on standard
                                         error and waits for good in step K (on several ranks
                                         the others then wait in a collective)

A run that stops on an error writes it to OUT/stopped_rank<r>.txt on each rank; an interrupted
run prints its message and exits with 1. Rank 0 writes OUT/result.pt.
"""
import os
import resource
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train_gpt  # noqa: E402


def gradients(argv):
    args = train_gpt.parse_args(argv)
    rank, world_size, device = train_gpt.setup_device()
    torch.manual_seed(args.seed)
    model = train_gpt.GPT(args.vocab_size, args.num_layers, args.num_heads, args.model_dim,
                          max_seq_len=args.micro_batch_size)
    ddp_model = train_gpt.data_parallel(model, device) if dist.is_initialized() else model
    with torch.no_grad():  # a nonzero head and projections, so every gradient is informative
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    loader = train_gpt.DistributedDataLoader(args.train_files, rank, world_size)
    inputs, targets = loader.next_batch(args.batch_size)
    seq_len = train_gpt.sequence_length(args, world_size)
    train_gpt.forward_backward(ddp_model, inputs, targets, torch.tensor(2), seq_len)
    return {name: p.grad.clone() for name, p in model.named_parameters()}


class Counted:
    """A Triton kernel that counts its launches."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def on_the_gpu_path():
    """build_model as on a GPU, and the kernels counted; returns the counted kernels."""
    build_model = train_gpt.build_model
    train_gpt.build_model = lambda args, device: build_model(args, device, gpu_path=True)
    # the head's row in one block, not 25: the interpreter then takes 5 s for 256 rows, not 52
    train_gpt.HEAD_KERNEL_SETTING.update(BLOCK=65536)
    kernels = {}
    for name in ("softcapped_cross_entropy_kernel", "relu_square_matmul_kernel"):
        kernels[name] = Counted(getattr(train_gpt, name))
        setattr(train_gpt, name, kernels[name])
    return kernels


def limit_file_size(size):
    """From now on no file this process writes may grow past `size` bytes (RLIMIT_FSIZE): a
    write past that fails with EFBIG, as on a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def fill_the_log_after_its_header(room):
    """From the end of the log's header on, every file this process writes may hold `room`
    bytes more than the log then does."""
    header = train_gpt.log_run_header

    def then_full(log, *args):
        header(log, *args)
        limit_file_size(os.path.getsize(log.path) + room)
    train_gpt.log_run_header = then_full


def break_step(mode, call):
    """Wrap forward_backward so that on the last rank its `call`-th call dies, returns NaN, gets a
    signal (rank 0 for torchrun_sigterm) or never returns."""
    original, calls = train_gpt.forward_backward, []
    last_rank = int(os.environ.get("RANK", 0)) == int(os.environ.get("WORLD_SIZE", 1)) - 1

    def forward_backward(*args):
        calls.append(None)
        if len(calls) == call and mode == "hang" and last_rank:
            print("blocked", file=sys.stderr, flush=True)
            threading.Event().wait()
        loss = original(*args)
        if len(calls) == call and mode == "torchrun_sigterm" and os.environ["RANK"] == "0":
            sigterm_through_torchrun()
        if len(calls) == call and last_rank:
            if mode == "nan":
                return torch.full_like(loss, float("nan"))
            if mode in ("sigint", "sigterm"):
                os.kill(os.getpid(), getattr(signal, mode.upper()))
            if mode == "crash" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
                os._exit(1)  # no clean-up at all, as in a crash
        return loss
    train_gpt.forward_backward = forward_backward


def sigterm_through_torchrun():
    """SIGTERM to torchrun, which passes it on to every worker; return once this one has it, so
    that the request is part of this step on this rank."""
    noted, received = signal.getsignal(signal.SIGTERM), []

    def handler(signum, frame):
        received.append(signum)
        noted(signum, frame)
    signal.signal(signal.SIGTERM, handler)
    os.kill(os.getppid(), signal.SIGTERM)
    deadline = time.monotonic() + 60
    while not received:
        if time.monotonic() > deadline:
            raise RuntimeError("torchrun did not pass SIGTERM on within 60 s")
        time.sleep(0.01)


if __name__ == "__main__":
    torch.set_num_threads(1)
    (mode, _, call), out, argv = sys.argv[1].partition(":"), Path(sys.argv[2]), sys.argv[3:]
    if mode == "logfull":
        fill_the_log_after_its_header(int(call))
    elif mode not in ("train", "grads", "diskfull", "gpu_path"):
        break_step(mode, int(call or 5))
    kernels = on_the_gpu_path() if mode == "gpu_path" else None
    if mode == "diskfull" and os.environ["RANK"] == "0":
        written, write = [], train_gpt.write_checkpoint

        def write_checkpoint(state, path):
            if len(written) + 1 >= int(call):
                limit_file_size(2**20)
            write(state, path)
            written.append(path)
        train_gpt.write_checkpoint = write_checkpoint
    code = 0
    try:
        result = gradients(argv) if mode == "grads" else train_gpt.main(argv)
        if kernels:
            result = dict(val_losses=result,
                          launches={name: k.launches for name, k in kernels.items()})
        if not dist.is_initialized() or dist.get_rank() == 0:
            torch.save(result, out / "result.pt")
    except train_gpt.UserError as err:
        (out / f"stopped_rank{os.environ.get('RANK', 0)}.txt").write_text(str(err))
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
