"""Time DistributedDataLoader.next_batch at a shard boundary against an ordinary call.

    python benchmarks/time_loader.py [--tokens 100000000] [--step-ms 150]

Writes three shards of random tokens (100M each by default, like the FineWeb shards) to a
temporary folder, evicts them from the page cache so every read comes from disk, then walks the
reference batch (524,288 tokens, rank 0 of 8) through two boundaries, sleeping `--step-ms`
between calls as a training step would. It prints the mean ordinary call, the calls that crossed
a boundary, and a plain synchronous read_shard of one shard for comparison.
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from train_gpt import DistributedDataLoader, read_shard, write_shard  # noqa: E402


def evict_from_page_cache(path):
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=100_000_000, help="tokens per shard")
    parser.add_argument("--step-ms", type=float, default=150.0, help="time between calls")
    parser.add_argument("--batch", type=int, default=8 * 64 * 1024, help="global batch")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder) / f"shard_{i:06d}.bin" for i in range(3)]
        for path in paths:
            write_shard(path, rng.integers(0, 50257, size=args.tokens, dtype=np.uint16))
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
            evict_from_page_cache(path)
        start = time.perf_counter()
        read_shard(paths[2])
        sync_read_ms = 1e3 * (time.perf_counter() - start)
        evict_from_page_cache(paths[2])

        loader = DistributedDataLoader(str(Path(folder) / "shard_*.bin"), 0, 8)
        ordinary, boundary = [], []
        while len(boundary) < 2:
            shard = loader.shard
            start = time.perf_counter()
            loader.next_batch(args.batch)
            elapsed = 1e3 * (time.perf_counter() - start)
            (boundary if loader.shard != shard else ordinary).append(elapsed)
            time.sleep(args.step_ms / 1e3)
    print(f"{args.tokens:,}-token shards, batch {args.batch:,}, one call every {args.step_ms} ms")
    print(f"ordinary next_batch: median {np.median(ordinary):.3f} ms, mean {np.mean(ordinary):.3f} ms "
          f"over {len(ordinary)} calls")
    print(f"next_batch crossing a boundary: {', '.join(f'{t:.3f} ms' for t in boundary)}")
    print(f"synchronous read_shard of one shard from disk: {sync_read_ms:.1f} ms")


if __name__ == "__main__":
    main()
