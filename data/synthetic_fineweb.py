"""Write synthetic shards shaped like FineWeb's, for timing on machines without the data.

    python data/synthetic_fineweb.py 8          # 8 train shards and a val shard, 100M tokens each
    python train_gpt.py --train_files='data/synthetic/synthetic_train_*.bin' \
                        --val_files='data/synthetic/synthetic_val_*.bin'

FineWeb's 10B tokens come in about 15M documents: a mean near 700 tokens, most documents a few
hundred long and a few tens of thousands. Here document lengths are log-normal with that mean,
every document starts with <|endoftext|> (50256), and the tokens follow a Zipf law over the rest
of the GPT-2 vocabulary (token id = frequency rank). The attention mask's sparsity, and so the
time of a step, depends on the document lengths: timings on these shards stand for timings on
FineWeb. Their losses mean nothing; the text is noise.
"""
import argparse
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from train_gpt import EOT_TOKEN, write_shard  # noqa: E402  (the one definition of a shard)

DEFAULT_DIR = Path(__file__).resolve().parent / "synthetic"
MEAN_DOCUMENT_TOKENS = 700  # 10B tokens / 15M documents, rounded
LENGTH_SIGMA = 1.1  # log-normal spread: median ~380 tokens, the longest of 100M ~40,000


def document_lengths(rng, count, mean=MEAN_DOCUMENT_TOKENS, sigma=LENGTH_SIGMA):
    """`count` log-normal document lengths (at least 2 tokens) whose mean is `mean`."""
    mu = np.log(mean) - sigma ** 2 / 2  # the mean of a log-normal is exp(mu + sigma^2 / 2)
    return np.maximum(2, np.rint(rng.lognormal(mu, sigma, count))).astype(np.int64)


def zipf_tokens(rng, count, vocab_size=EOT_TOKEN, exponent=1.0, offset=2.7):
    """`count` token ids in [0, vocab_size), id k drawn with probability ~ 1 / (k + offset)^exponent.

    The default law is the Zipf-Mandelbrot fit of word frequencies in English text.
    """
    weights = 1.0 / (np.arange(vocab_size) + offset) ** exponent
    cdf = np.cumsum(weights / weights.sum())
    out = np.empty(count, dtype=np.uint16)
    for start in range(0, count, 1 << 24):  # in pieces, to bound memory
        piece = out[start:start + (1 << 24)]
        piece[:] = np.minimum(np.searchsorted(cdf, rng.random(len(piece))), vocab_size - 1)
    return out


def stream_piece(rng, num_tokens, carry):
    """The next `num_tokens` tokens of an endless stream of documents.

    The first `carry` tokens finish a document begun in the previous piece. Returns the tokens
    and the carry of the next piece: how many of its tokens finish this piece's last document.
    """
    tokens = zipf_tokens(rng, num_tokens)
    next_start = carry
    while next_start < num_tokens:
        lengths = document_lengths(rng, (num_tokens - next_start) // MEAN_DOCUMENT_TOKENS + 16)
        starts = next_start + np.cumsum(lengths) - lengths
        tokens[starts[starts < num_tokens]] = EOT_TOKEN
        beyond = starts[starts >= num_tokens]
        next_start = int(beyond[0]) if len(beyond) else int(starts[-1] + lengths[-1])
    return tokens, next_start - num_tokens


def write_synthetic_shards(folder, num_train, tokens_per_shard=100_000_000,
                           val_tokens=100_000_000, seed=0):
    """Write synthetic_val_000000.bin and synthetic_train_000001.bin .. _00000N.bin to `folder`.

    The train shards are one stream cut into pieces, so a shard may begin inside a document, as
    FineWeb's do; the val shard is a stream of its own. Returns the paths, val first.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = ["synthetic_val_000000.bin"] + [f"synthetic_train_{i:06d}.bin"
                                            for i in range(1, num_train + 1)]
    paths, carry = [], 0
    for name in tqdm(names, desc=f"synthetic shards in {folder}", unit="shard"):
        if name.startswith("synthetic_val"):
            tokens, _ = stream_piece(rng, val_tokens, carry=0)
        else:
            tokens, carry = stream_piece(rng, tokens_per_shard, carry)
        write_shard(folder / name, tokens)
        paths.append(folder / name)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("num_train", nargs="?", type=int, default=8,
                        help="number of train shards (default 8, as many as the reference run)")
    parser.add_argument("--tokens", type=int, default=100_000_000,
                        help="tokens per train shard (default 100M, as in FineWeb)")
    parser.add_argument("--val-tokens", type=int, default=100_000_000,
                        help="tokens in the val shard (default 100M; the run validates on 10.5M)")
    parser.add_argument("--dir", default=DEFAULT_DIR, help=f"target folder (default {DEFAULT_DIR})")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.num_train < 0:
        parser.error(f"the number of train shards is {args.num_train}; give 0 or more")
    for option, value in (("--tokens", args.tokens), ("--val-tokens", args.val_tokens)):
        if not 2 <= value < 2**31:  # a shard's header holds its count as an int32
            parser.error(f"{option}={value} must lie in [2, 2**31)")
    try:
        write_synthetic_shards(args.dir, args.num_train, args.tokens, args.val_tokens, args.seed)
    except OSError as error:  # a folder it cannot make or write to, a full disk
        sys.exit(f"error: --dir={args.dir}: {error.filename}: {error.strerror or error}")


if __name__ == "__main__":
    main()
