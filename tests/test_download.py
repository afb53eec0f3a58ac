"""data/cached_fineweb10B.py, run as a user runs it, against a hub served on 127.0.0.1."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hub_standin import HubStandIn
from train_gpt import write_shard

SCRIPT = Path(__file__).resolve().parent.parent / "data" / "cached_fineweb10B.py"
REPO_ID = "kjj0/fineweb10B-gpt2"
NAMES = ["fineweb_val_000000.bin", "fineweb_train_000001.bin", "fineweb_train_000002.bin"]


def shard_bytes(tmp_path, name, seed):
    write_shard(tmp_path / name, np.random.default_rng(seed).integers(0, 50257, size=1000 + seed))
    return (tmp_path / name).read_bytes()


@pytest.fixture
def served(tmp_path):
    return {name: shard_bytes(tmp_path, name, i) for i, name in enumerate(NAMES)}


def download(tmp_path, endpoint, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf_home"))
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--dir", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=120)


def test_downloads_val_and_first_n_train_shards(tmp_path, served):
    with HubStandIn(REPO_ID, served) as hub:
        result = download(tmp_path, hub.url, "2")
    assert result.returncode == 0, result.stderr
    assert sorted(hub.gets) == sorted(NAMES)
    for name in NAMES:
        assert (tmp_path / "out" / name).read_bytes() == served[name]
    assert "shards in" in result.stderr  # the tqdm progress bar


def test_fewer_shards_fetch_only_those(tmp_path, served):
    with HubStandIn(REPO_ID, served) as hub:
        result = download(tmp_path, hub.url, "1")
    assert result.returncode == 0, result.stderr
    assert sorted(hub.gets) == sorted(NAMES[:2])
    assert not (tmp_path / "out" / NAMES[2]).exists()


def test_valid_files_are_skipped_and_corrupt_ones_fetched_again(tmp_path, served):
    out = tmp_path / "out"
    out.mkdir()
    (out / NAMES[0]).write_bytes(served[NAMES[0]])
    (out / NAMES[1]).write_bytes(served[NAMES[1]][:-10])  # an interrupted download
    with HubStandIn(REPO_ID, served) as hub:
        result = download(tmp_path, hub.url, "2")
    assert result.returncode == 0, result.stderr
    assert sorted(hub.gets) == sorted(NAMES[1:])
    assert f"{out / NAMES[0]} is present and valid, skipped" in result.stdout
    assert "shorter" in result.stdout and "downloading it again" in result.stdout
    assert (out / NAMES[1]).read_bytes() == served[NAMES[1]]


def test_a_downloaded_file_with_a_bad_header_is_an_error(tmp_path, served):
    served[NAMES[1]] = b"\0" * 4 + served[NAMES[1]][4:]
    with HubStandIn(REPO_ID, served) as hub:
        result = download(tmp_path, hub.url, "2")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "not valid" in result.stderr and NAMES[1] in result.stderr
    assert "magic number is 0" in result.stderr


def test_a_shard_the_hub_does_not_have(tmp_path, served):
    with HubStandIn(REPO_ID, served) as hub:
        result = download(tmp_path, hub.url, "3")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "fineweb_train_000003.bin" in result.stderr and "fewer train shards" in result.stderr
    assert (tmp_path / "out" / NAMES[2]).read_bytes() == served[NAMES[2]]


def test_unreachable_hub_is_a_readable_error(tmp_path):
    with HubStandIn(REPO_ID, {}) as hub:
        url = hub.url  # the port is free again once the stand-in has stopped
    result = download(tmp_path, url, "1")  # huggingface_hub retries for about 20 s first
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"could not download from the Hugging Face dataset {REPO_ID}" in result.stderr
    assert "network connection" in result.stderr


def test_negative_shard_count_is_refused(tmp_path):
    result = download(tmp_path, "http://127.0.0.1:9", "-1")
    assert result.returncode == 2 and "must be 0 or more" in result.stderr
