"""Time DistributedDataLoader.next_batch, ordinary calls and shard boundaries, and its memory.

    python benchmarks/time_loader.py [--tokens 100000000] [--boundaries 2] [--step-ms 150]
                                     [--script attempt.py]

Writes --boundaries + 1 shards of random tokens (100M each by default, like the FineWeb shards)
to a temporary folder, evicts them from the page cache so every read comes from disk, then walks
the reference batch (524,288 tokens, rank 0 of 8) through the boundaries, sleeping `--step-ms`
between calls as a training step would. It prints the ordinary calls, the calls that crossed a
boundary, and the process's resident memory: anonymous (private to this rank) and file-backed
(pages of mapped files, which the page cache shares between the ranks of a node).
"""
import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from training_script import TRAIN_GPT, load_script, run_tool


def evict_from_page_cache(path):
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def resident_mib():
    """(anonymous, file-backed) resident memory of this process, in MiB."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return tuple(int(fields[name].split()[0]) / 1024 for name in ("RssAnon", "RssFile"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=100_000_000, help="tokens per shard")
    parser.add_argument("--boundaries", type=int, default=2, help="shard boundaries to cross")
    parser.add_argument("--step-ms", type=float, default=150.0, help="time between calls")
    parser.add_argument("--batch", type=int, default=8 * 64 * 1024, help="global batch")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--script", default=TRAIN_GPT,
                        help="the training script whose loader to time (default: train_gpt.py)")
    args = parser.parse_args()
    for option, value, least in (("--tokens", args.tokens, 1), ("--batch", args.batch, 1),
                                 ("--boundaries", args.boundaries, 1),
                                 ("--step-ms", args.step_ms, 0)):
        if value < least:
            parser.error(f"{option}={value}: give {least} or more")
    try:
        cuda = torch.device(args.device).type == "cuda"
    except RuntimeError:
        parser.error(f"--device={args.device}: not a device; use cpu, cuda or cuda:N")
    if cuda and not torch.cuda.is_available():
        parser.error(f"--device={args.device}: no CUDA GPU is visible; use --device=cpu")
    script = load_script(args.script)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder) / f"shard_{i:06d}.bin" for i in range(args.boundaries + 1)]
        for path in paths:
            script.write_shard(path, rng.integers(0, 50257, size=args.tokens, dtype=np.uint16))
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
            evict_from_page_cache(path)
        before = resident_mib()
        start = time.perf_counter()
        loader = script.DistributedDataLoader(str(Path(folder) / "shard_*.bin"), 0, 8, args.device)
        construct_ms = 1e3 * (time.perf_counter() - start)
        ordinary, boundary, peak = [], [], [0.0, 0.0]
        while len(boundary) < args.boundaries:
            shard = loader.shard
            start = time.perf_counter()
            inputs, _ = loader.next_batch(args.batch)
            if inputs.is_cuda:
                torch.cuda.synchronize()
            elapsed = 1e3 * (time.perf_counter() - start)
            (boundary if loader.shard != shard else ordinary).append(elapsed)
            peak = [max(p, now - b) for p, now, b in zip(peak, resident_mib(), before)]
            time.sleep(args.step_ms / 1e3)
    print(f"{args.tokens:,}-token shards, batch {args.batch:,}, rank 0 of 8 on {args.device}, "
          f"one call every {args.step_ms} ms")
    print(f"loader construction: {construct_ms:.1f} ms")
    print(f"ordinary next_batch: median {np.median(ordinary):.3f} ms, mean "
          f"{np.mean(ordinary):.3f} ms, max {np.max(ordinary):.3f} ms over {len(ordinary)} calls")
    print(f"next_batch crossing a boundary: median {np.median(boundary):.3f} ms; "
          f"{', '.join(f'{t:.1f}' for t in boundary)} ms")
    print(f"resident memory added by the loader, at its peak: {peak[0]:.0f} MiB anonymous, "
          f"{peak[1]:.0f} MiB file-backed")


if __name__ == "__main__":
    run_tool(main)
