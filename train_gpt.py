"""The GPT-2 speedrun: train a GPT-2-small-sized model on FineWeb to a validation loss of 3.28.

Launch with `torchrun --standalone --nproc_per_node=8 train_gpt.py` (or `./run.sh`).
The file reads top to bottom: hyperparameters, Muon, model, data, training.
Importing it has no side effects; everything that runs lives in `main()`.
"""
import glob
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

# ----------------------------------------------------------------------------- hyperparameters


@dataclass
class Hyperparameters:
    train_files: str = "data/fineweb10B/fineweb_train_*.bin"
    val_files: str = "data/fineweb10B/fineweb_val_*.bin"


# ----------------------------------------------------------------------------- data

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256  # little-endian int32: magic, version, token count, then zeros
HEADER_BYTES = HEADER_INTS * 4
DOWNLOAD_HINT = "download the shards with `python data/cached_fineweb10B.py 8`"


def write_shard(path, tokens):
    """Write GPT-2 token ids as one shard: a 1024-byte header, then the tokens as uint16."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**16):
        raise ValueError(f"{path}: token ids must lie in [0, 65535] to be stored as uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = SHARD_MAGIC, SHARD_VERSION, tokens.size
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def check_shard(path):
    """Validate a shard's header against its size on disk; return its token count."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4")
    if header.size < HEADER_INTS:
        raise ValueError(f"{path}: file is {os.path.getsize(path)} bytes, shorter than the "
                         f"{HEADER_BYTES}-byte header; the file is truncated, {DOWNLOAD_HINT}")
    if header[0] != SHARD_MAGIC:
        raise ValueError(f"{path}: magic number is {header[0]}, expected {SHARD_MAGIC}; "
                         f"this is not a token shard, {DOWNLOAD_HINT}")
    if header[1] != SHARD_VERSION:
        raise ValueError(f"{path}: shard version is {header[1]}, this script reads version "
                         f"{SHARD_VERSION}; {DOWNLOAD_HINT}")
    num_tokens = int(header[2])
    expected, actual = HEADER_BYTES + 2 * num_tokens, os.path.getsize(path)
    if actual != expected:
        kind = "shorter" if actual < expected else "longer"
        raise ValueError(f"{path}: header claims {num_tokens} tokens ({expected} bytes) but the "
                         f"file is {actual} bytes, {kind} than that; {DOWNLOAD_HINT}")
    return num_tokens


def read_shard(path, pin_memory=False):
    """Read a whole shard into a uint16 tensor (pinned for fast asynchronous copies to a GPU)."""
    num_tokens = check_shard(path)
    tokens = torch.empty(num_tokens, dtype=torch.uint16, pin_memory=pin_memory)
    with open(path, "rb", buffering=0) as f:
        f.seek(HEADER_BYTES)
        if f.readinto(tokens.numpy()) != 2 * num_tokens:
            raise ValueError(f"{path}: the file changed while it was being read")
    return tokens


class DistributedDataLoader:
    """Walks the sorted shards in order; each call hands every rank its slice of one batch.

    The stream is fixed by the speedrun rules: with global batch B and world size W, rank r takes
    tokens [p + r*B/W, p + (r+1)*B/W + 1) of the current shard, then p advances by B. A shard is
    left (wrapping around after the last) as soon as p + B + 1 would reach its end. The next shard
    is read by a background thread so that crossing a boundary does not stall a training step.
    """

    def __init__(self, filename_pattern, rank, world_size, device="cpu"):
        self.files = sorted(glob.glob(filename_pattern))
        if not self.files:
            raise FileNotFoundError(f"no shard matches {filename_pattern!r}; {DOWNLOAD_HINT}")
        for path in self.files:
            check_shard(path)
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self.pin_memory = self.device.type == "cuda"
        self.prefetcher = ThreadPoolExecutor(max_workers=1)
        self.shard, self.tokens, self.next_shard = None, None, None
        self.reset()

    def reset(self):
        """Go back to the first token of the first shard."""
        self._load(0)

    def _read_async(self, index):
        return index, self.prefetcher.submit(read_shard, self.files[index], self.pin_memory)

    def _load(self, index):
        if index != self.shard:
            if self.next_shard is not None and self.next_shard[0] == index:
                self.tokens = self.next_shard[1].result()
            else:
                self.tokens = read_shard(self.files[index], self.pin_memory)
            self.shard = index
            following = (index + 1) % len(self.files)
            self.next_shard = self._read_async(following) if following != index else None
        self.pos = 0

    def next_batch(self, batch_size):
        """Return this rank's (inputs, targets): int32 inputs and int64 targets on the device."""
        if batch_size % self.world_size:
            raise ValueError(f"batch of {batch_size} tokens does not split over {self.world_size}"
                             f" ranks; choose a batch size that is a multiple of the world size")
        if self.pos + batch_size + 1 >= len(self.tokens):
            if self.pos == 0:
                raise ValueError(f"{self.files[self.shard]} holds {len(self.tokens)} tokens, too "
                                 f"few for one batch of {batch_size} (it needs at least "
                                 f"{batch_size + 2}); use a smaller batch or larger shards")
            self._load((self.shard + 1) % len(self.files))
            return self.next_batch(batch_size)
        local = batch_size // self.world_size
        start = self.pos + self.rank * local
        buf = self.tokens[start:start + local + 1]
        self.pos += batch_size
        inputs = buf[:-1].to(device=self.device, dtype=torch.int32, non_blocking=True)
        targets = buf[1:].to(device=self.device, dtype=torch.int64, non_blocking=True)
        return inputs, targets
