"""Data section: the shard format, its checks, and the token stream of DistributedDataLoader."""
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from train_gpt import DistributedDataLoader, UserError, check_shard, read_shard, write_shard

DATA = Path(__file__).resolve().parent.parent / "data"
SAMPLE = DATA / "shakespeare"
sys.path.insert(0, str(DATA))
import synthetic_fineweb  # noqa: E402
from synthetic_fineweb import write_synthetic_shards  # noqa: E402


def reference_stream(shards, batch_size, world_size, steps):
    """The stream rule written out literally: per step, every rank's (inputs, targets) as lists."""
    shard, pos, out = 0, 0, []
    for _ in range(steps):
        if pos + batch_size + 1 >= len(shards[shard]):
            shard, pos = (shard + 1) % len(shards), 0
        tokens, local = shards[shard], batch_size // world_size
        step = []
        for rank in range(world_size):
            chunk = list(tokens[pos + rank * local: pos + (rank + 1) * local + 1])
            step.append((chunk[:-1], chunk[1:]))
        pos += batch_size
        out.append(step)
    return out


def make_shards(tmp_path, lengths, seed=0, prefix="train"):
    """Shards of random tokens; shard i draws from [10000 i, 10000 (i + 1)) so ids tell shards apart."""
    rng = np.random.default_rng(seed)
    shards = [rng.integers(10000 * i, 10000 * (i + 1), size=n) for i, n in enumerate(lengths)]
    for i, tokens in enumerate(shards):
        write_shard(tmp_path / f"{prefix}_{i:06d}.bin", tokens)
    return shards, str(tmp_path / f"{prefix}_*.bin")


def test_write_then_read_round_trips(tmp_path):
    tokens = np.array([50256, 0, 1, 65535, 15496, 11, 995, 0])
    write_shard(tmp_path / "s.bin", tokens)
    raw = (tmp_path / "s.bin").read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[:3].tolist() == [20240520, 1, len(tokens)] and not header[3:].any()
    assert len(raw) == 1024 + 2 * len(tokens)
    assert check_shard(tmp_path / "s.bin") == len(tokens)
    read = read_shard(tmp_path / "s.bin")
    assert read.dtype == torch.uint16
    assert read.to(torch.int64).tolist() == tokens.tolist()


def test_write_refuses_ids_that_do_not_fit_uint16(tmp_path):
    with pytest.raises(ValueError, match="65535"):
        write_shard(tmp_path / "s.bin", [1, 70000])


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_stream_matches_the_reference_rule(tmp_path, world_size):
    batch_size = 96
    # 193 = 2B + 1 hits the boundary rule with equality; 500 and 97 + 100 leave ragged tails.
    shards, pattern = make_shards(tmp_path, [500, 193, 300, 197])
    steps = 24  # walks through every shard and wraps around to the first twice
    expected = reference_stream(shards, batch_size, world_size, steps)
    loaders = [DistributedDataLoader(pattern, rank, world_size) for rank in range(world_size)]
    for step in range(steps):
        for rank, loader in enumerate(loaders):
            inputs, targets = loader.next_batch(batch_size)
            assert inputs.dtype == torch.int32 and targets.dtype == torch.int64
            assert (inputs.tolist(), targets.tolist()) == expected[step][rank], (step, rank)


def test_reference_rule_visits_every_shard_and_wraps(tmp_path):
    """Guards the test above: its layout really crosses each boundary and wraps around."""
    shards, _ = make_shards(tmp_path, [500, 193, 300, 197])
    visited = [step[0][0][0] // 10000 for step in reference_stream(shards, 96, 1, 24)]
    changes = [s for i, s in enumerate(visited) if i == 0 or s != visited[i - 1]]
    assert changes == [0, 1, 2, 3, 0, 1, 2, 3, 0]


def test_reset_restarts_from_the_first_token(tmp_path):
    shards, pattern = make_shards(tmp_path, [300, 300])
    loader = DistributedDataLoader(pattern, 1, 2)
    first = [t.tolist() for t in loader.next_batch(64)]
    for _ in range(7):
        loader.next_batch(64)
    assert loader.shard == 1
    loader.reset()
    assert [t.tolist() for t in loader.next_batch(64)] == first


# saved inside shard 0, at its end, inside shard 2, at the end of the last shard (wraps)
@pytest.mark.parametrize("saved_after", [3, 5, 7, 9])
def test_a_saved_position_continues_the_stream(tmp_path, saved_after):
    shards, pattern = make_shards(tmp_path, [500, 193, 300])
    expected = reference_stream(shards, 96, 2, 14)
    loader = DistributedDataLoader(pattern, 1, 2)
    for _ in range(saved_after):
        loader.next_batch(96)
    resumed = DistributedDataLoader(pattern, 1, 2)
    resumed.load_state_dict(loader.state_dict())
    for step in range(saved_after, 14):
        inputs, targets = resumed.next_batch(96)
        assert (inputs.tolist(), targets.tolist()) == expected[step][1], step


def test_a_position_past_the_shards_is_refused(tmp_path):
    _, pattern = make_shards(tmp_path, [300, 300])
    with pytest.raises(UserError, match="saved position is in shard 2, but only 2 shards match"):
        DistributedDataLoader(pattern, 0, 1).load_state_dict(dict(shard=2, pos=0))


def resident_anonymous_bytes():
    """Memory private to this process (not pages of mapped files), from /proc/self/status."""
    with open("/proc/self/status") as f:
        return 1024 * int(next(line for line in f if line.startswith("RssAnon:")).split()[1])


def test_shards_are_mapped_not_read(tmp_path):
    """The ranks of a node share the page cache's copy instead of each holding its own."""
    tokens = np.random.default_rng(0).integers(0, 50257, size=20_000_000)
    write_shard(tmp_path / "big_000000.bin", tokens)
    write_shard(tmp_path / "big_000001.bin", tokens[:1000])
    before = resident_anonymous_bytes()
    loader = DistributedDataLoader(str(tmp_path / "big_*.bin"), 1, 2)
    inputs, targets = loader.next_batch(2 * 65536)
    grown = resident_anonymous_bytes() - before
    assert grown < 10_000_000, grown  # far below the 40 MB shard
    with open("/proc/self/maps") as f:
        assert str(tmp_path / "big_000000.bin") in f.read()
    assert inputs.tolist() == tokens[65536:2 * 65536].tolist()
    assert targets.tolist() == tokens[65537:2 * 65536 + 1].tolist()


def test_single_shard_is_not_mapped_again(tmp_path):
    _, pattern = make_shards(tmp_path, [300])
    loader = DistributedDataLoader(pattern, 0, 1)
    tokens = loader.tokens
    for _ in range(10):
        loader.next_batch(64)
    loader.reset()
    assert loader.tokens is tokens


# ----------------------------------------------------------------------------- synthetic shards


def test_synthetic_shards_are_shaped_like_fineweb(tmp_path):
    paths = write_synthetic_shards(tmp_path, 2, tokens_per_shard=3_000_000, val_tokens=1_000_000)
    assert [path.name for path in paths] == [
        "synthetic_val_000000.bin", "synthetic_train_000001.bin", "synthetic_train_000002.bin"]
    assert [check_shard(path) for path in paths] == [1_000_000, 3_000_000, 3_000_000]
    val, *train = (read_shard(path).numpy().astype(np.int64) for path in paths)
    stream = np.concatenate(train)  # one stream: a document may cross into the next shard
    starts = np.flatnonzero(stream == 50256)
    assert starts[0] == 0 and val[0] == 50256  # every document opens with <|endoftext|>
    assert stream.max() == 50256
    lengths = np.diff(starts)  # the documents that end inside the stream
    assert abs(lengths.mean() / 700 - 1) < 0.1  # FineWeb: ~10B tokens in ~15M documents
    assert np.median(lengths) < 0.7 * lengths.mean() and lengths.max() > 20_000  # a long tail
    counts = np.bincount(stream, minlength=50257)
    assert counts[0] > counts[1] > counts[10] > counts[1000] > 0  # token id = frequency rank
    assert abs(counts[0] / counts[9] / ((9 + 2.7) / 2.7) - 1) < 0.1  # Zipf, 1 / (k + 2.7)


@pytest.mark.parametrize("argv, message", [
    (["--", "-1"], r"the number of train shards is -1; give 0 or more"),
    (["--tokens=1"], r"--tokens=1 must lie in \[2, 2\*\*31\)"),
    (["--val-tokens=2147483648"], r"--val-tokens=2147483648 must lie in \[2, 2\*\*31\)")])
def test_synthetic_shards_refuse_bad_input_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        synthetic_fineweb.main(argv)
    assert stopped.value.code == 2
    assert re.fullmatch(r"\S+: error: " + message, capsys.readouterr().err.splitlines()[-1])


def test_synthetic_shards_that_cannot_be_written_end_in_one_line():
    with pytest.raises(SystemExit) as stopped:
        synthetic_fineweb.main(["1", "--tokens=100", "--val-tokens=100", "--dir=/dev/null/x"])
    assert stopped.value.code == "error: --dir=/dev/null/x: /dev/null/x: Not a directory"


# ----------------------------------------------------------------------------- bad input


def corrupt(path, offset, value):
    raw = bytearray(path.read_bytes())
    raw[offset:offset + 4] = np.array([value], dtype="<i4").tobytes()
    path.write_bytes(bytes(raw))


def test_no_file_matches_the_pattern(tmp_path):
    with pytest.raises(UserError, match=r"nothing_\*\.bin': check --train_files and "
                       r"--val_files, or download .*cached_fineweb10B\.py 8`$"):
        DistributedDataLoader(str(tmp_path / "nothing_*.bin"), 0, 1)


def test_a_folder_given_as_the_shards_is_refused_naming_the_patterns_in_it(tmp_path):
    """As when --train_files names the sample's folder: the script says which shards it holds."""
    (tmp_path / "empty").mkdir()
    write_shard(tmp_path / "fw_train_000001.bin", [1] * 10)
    write_shard(tmp_path / "fw_train_000002.bin", [1] * 10)
    write_shard(tmp_path / "fw_val_000000.bin", [1] * 10)
    for folder, message in [
        (tmp_path, f"{tmp_path} is a folder, not a shard: name the shards, as a pattern such as "
                   f"'{tmp_path}/fw_train_*.bin' or '{tmp_path}/fw_val_*.bin'"),
        (tmp_path / "empty", f"{tmp_path}/empty is a folder, not a shard, and holds no .bin "
                             f"file; download the shards with `python data/cached_fineweb10B.py 8`")]:
        for check in (check_shard, lambda path: DistributedDataLoader(str(path), 0, 1)):
            with pytest.raises(UserError) as refused:
                check(folder)
            assert str(refused.value) == message


@pytest.mark.parametrize("edit, message", [
    (lambda p: corrupt(p, 0, 12345), "magic number is 12345, expected 20240520"),
    (lambda p: corrupt(p, 4, 7), "shard version is 7"),
    (lambda p: p.write_bytes(p.read_bytes()[:-2]), "claims 100 tokens.*shorter"),
    (lambda p: p.write_bytes(p.read_bytes() + b"\0\0"), "claims 100 tokens.*longer"),
    (lambda p: corrupt(p, 8, 101), "claims 101 tokens.*shorter"),
    (lambda p: p.write_bytes(p.read_bytes()[:500]), "shorter than the 1024-byte header"),
    (lambda p: p.write_bytes(p.read_bytes()[:501]), "501 bytes, shorter than the 1024-byte"),
])
def test_bad_shards_are_refused_naming_the_file(tmp_path, edit, message):
    _, pattern = make_shards(tmp_path, [100, 100])
    bad = tmp_path / "train_000001.bin"
    edit(bad)
    for check in (check_shard, read_shard):
        with pytest.raises(UserError, match=message) as info:
            check(bad)
        assert str(bad) in str(info.value) and "cached_fineweb10B.py" in str(info.value)
    with pytest.raises(UserError, match=message):  # checked up front, not at the boundary
        DistributedDataLoader(pattern, 0, 1)


def test_shard_too_small_for_one_batch(tmp_path):
    _, pattern = make_shards(tmp_path, [300, 65])
    loader = DistributedDataLoader(pattern, 0, 2)
    for _ in range(4):
        loader.next_batch(64)
    with pytest.raises(UserError, match=r"train_000001\.bin holds 65 tokens.*batch of 64.*66"):
        loader.next_batch(64)


def test_first_shard_too_small_for_one_batch(tmp_path):
    _, pattern = make_shards(tmp_path, [65])
    with pytest.raises(UserError, match=r"train_000000\.bin holds 65 tokens"):
        DistributedDataLoader(pattern, 0, 1).next_batch(64)


def test_batch_that_the_world_size_does_not_divide(tmp_path):
    _, pattern = make_shards(tmp_path, [300])
    with pytest.raises(UserError, match="batch of 100 tokens does not split over 8 ranks"):
        DistributedDataLoader(pattern, 0, 8).next_batch(100)


# in the second batch of shard 1 (positions 128-256): inside rank 1's slice; at the batch's end
@pytest.mark.parametrize("at", [150, 256])
@pytest.mark.parametrize("bad", [50257, 50303, 65535])
def test_ids_past_the_vocabulary_stop_every_rank_naming_the_place(bad, at, tmp_path):
    """A compiled model cannot check its inputs: the loader does, on the whole batch, so that
    every rank stops, not only the one whose slice holds the id. The batch's last token is the
    last rank's last target and no rank's input: on a GPU it would reach the head's kernel."""
    shards, pattern = make_shards(tmp_path, [300, 300])
    shards[1][at] = bad
    write_shard(tmp_path / "train_000001.bin", shards[1])
    loaders = [DistributedDataLoader(pattern, rank, 2) for rank in range(2)]
    for _ in range(3):  # shard 0's two batches, and shard 1's first (positions 0-128)
        for loader in loaders:
            loader.next_batch(128)
    for loader in loaders:
        with pytest.raises(UserError) as stopped:
            loader.next_batch(128)
        assert str(stopped.value) == (
            f"{tmp_path / 'train_000001.bin'}: token {at} is {bad}, not a GPT-2 id below 50257; "
            f"download the shards with `python data/cached_fineweb10B.py 8`")


def test_a_larger_vocabulary_takes_larger_ids(tmp_path):
    shards, pattern = make_shards(tmp_path, [300])
    shards[0][5] = 50300
    write_shard(tmp_path / "train_000000.bin", shards[0])
    inputs, _ = DistributedDataLoader(pattern, 0, 1, vocab_size=50304).next_batch(128)
    assert inputs[5] == 50300
    with pytest.raises(UserError, match="token 5 is 50300"):
        DistributedDataLoader(pattern, 0, 1).next_batch(128)


# ----------------------------------------------------------------------------- embedded sample


@pytest.mark.parametrize("split, tokens, documents", [("train", 1_825_710, 48), ("val", 169_501, 4)])
def test_embedded_sample_shards(split, tokens, documents):
    shard = read_shard(SAMPLE / f"shakespeare_{split}_000000.bin").to(torch.int64)
    assert len(shard) == tokens
    starts = (shard == 50256).nonzero().flatten().tolist()
    assert len(starts) == documents and starts[0] == 0  # every play starts with <|endoftext|>
    assert int(shard.max()) < 50257


def test_embedded_sample_fits_the_budget():
    sizes = [p.stat().st_size for p in SAMPLE.glob("*.bin")]
    assert len(sizes) == 2 and sum(sizes) <= 4_000_000
