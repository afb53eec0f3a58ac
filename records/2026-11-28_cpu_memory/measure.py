"""Resident memory of one CPU training step, per token, against check_host_memory's floor.

    python records/2026-11-28_cpu_memory/measure.py TOKENS ARGUMENTS...

Builds the model of `train_gpt.py ARGUMENTS` on the CPU, runs a 128-token step (which makes the
weights' gradients), then one of TOKENS, and prints what the second added to the peak resident
set size, per token of the difference, beside the floor that the check counts."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import train_gpt  # noqa: E402

tokens, argv = int(sys.argv[1]), sys.argv[2:]
torch.set_num_threads(1)
args = train_gpt.parse_args(argv + [f"--micro_batch_size={tokens}"])
model, _, _ = train_gpt.build_model(args, torch.device("cpu"))
data = torch.randint(0, args.vocab_size, (tokens + 1,), generator=torch.Generator().manual_seed(0))


def peak_after(n):
    """The peak resident set size after a step of n tokens: Linux's VmHWM, in KiB (ru_maxrss
    would start from the peak of the process that started this one)."""
    train_gpt.train_step(model, data[:n], data[1:n + 1], torch.tensor(1), n)
    status = Path("/proc/self/status").read_text().split()
    return int(status[status.index("VmHWM:") + 1]) * 1024


added = -peak_after(128) + peak_after(tokens)
columns, width = model.lm_head.weight.shape
floor = 14 * columns + 56 * len(model.blocks) * width  # check_host_memory's bytes a token
per_token = added / (tokens - 128)
print(f"{' '.join(argv) or 'the reference model'}, {tokens} tokens: {per_token / 2**20:.3f} MiB "
      f"a token, {per_token / (4 * columns):.2f} fp32 copies of the logits; the floor counts "
      f"{floor / 2**20:.3f} MiB, {per_token / floor:.2f} times less")
