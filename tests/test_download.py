"""data/cached_fineweb10B.py, run as a user runs it, against a hub served on 127.0.0.1, and
what run.sh has it download for a run."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import train_gpt
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


def download(tmp_path, endpoint, *args, without_waits=False):
    """Run the download script as a user does; `without_waits`: every time.sleep returns at
    once, so that huggingface_hub's retries of an unreachable hub take no 20 s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf_home"))
    argv = [str(SCRIPT), *args, "--dir", str(tmp_path / "out")]
    if without_waits:
        argv = ["-c", "import runpy, sys, time; time.sleep = lambda seconds: None; "
                "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
                *argv]
    return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                          timeout=120)


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
    assert result.stderr.endswith("not a token shard; run this again to fetch it anew\n")


def test_a_shard_the_hub_does_not_have(tmp_path, served):
    with HubStandIn(REPO_ID, served) as hub:
        result = download(tmp_path, hub.url, "3")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "fineweb_train_000003.bin" in result.stderr and "fewer train shards" in result.stderr
    assert (tmp_path / "out" / NAMES[2]).read_bytes() == served[NAMES[2]]


def test_unreachable_hub_is_a_readable_error(tmp_path):
    # a port bound but never listening refuses every connection, and no other test can take it
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        result = download(tmp_path, url, "1", without_waits=True)  # its retries: 20 s of waits
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"could not download from the Hugging Face dataset {REPO_ID}" in result.stderr
    assert "network connection" in result.stderr


def test_negative_shard_count_is_refused(tmp_path):
    result = download(tmp_path, "http://127.0.0.1:9", "-1")
    assert result.returncode == 2 and "must be 0 or more" in result.stderr


def test_a_shard_count_beside_for_run_is_refused(tmp_path):
    result = download(tmp_path, "http://127.0.0.1:9", "2", "--for_run", "--num_iterations=10")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].endswith(
        "error: give the number of train shards (2) or --for_run, not both")


# ----------------------------------------------------------------------------- what a run reads

sys.path.insert(0, str(SCRIPT.parent))
import cached_fineweb10B  # noqa: E402

ROOT = SCRIPT.parent.parent


@pytest.mark.parametrize("argv, expected", [
    ([], (True, 8)),  # 1390 steps of 524,288 tokens: 190 a shard (by hand: 1e8 - 2 // 524,288)
    (["--num_iterations=190"], (True, 1)),
    (["--num_iterations=191"], (True, 2)),
    (["--batch_size=65536"], (True, 1)),  # 1390 x 65,536 = 91M tokens
    (["--train_files=data/synthetic/synthetic_train_*.bin"], (True, 0)),
    (["--val_files=data/synthetic/synthetic_val_*.bin", "--num_iterations=400"], (False, 3)),
    (["--preset=smoke"], (False, 0)),  # the embedded sample
    (["--help"], (False, 0)),
])
def test_a_run_needs_the_shards_it_reads(argv, expected, monkeypatch):
    monkeypatch.chdir(ROOT)  # the patterns are relative, as run.sh runs them
    assert cached_fineweb10B.shards_for_run(argv) == expected


@pytest.mark.parametrize("shard_tokens, batch_size", [(1000, 64), (1026, 128), (1025, 128)])
def test_the_shard_count_agrees_with_the_loader(shard_tokens, batch_size, tmp_path, monkeypatch):
    """How many batches the loader takes from a shard before it moves to the next one."""
    for i in range(1, 7):  # more than 30 batches take: no wrapping around
        write_shard(tmp_path / f"fineweb_train_{i:06d}.bin", [i] * shard_tokens)
    loader = train_gpt.DistributedDataLoader(str(tmp_path / "fineweb_train_*.bin"), 0, 1)
    shards_read = [int(loader.next_batch(batch_size)[0][0]) for _ in range(30)]
    monkeypatch.setattr(cached_fineweb10B, "SHARD_TOKENS", shard_tokens)
    pattern = f"--train_files={tmp_path}/fineweb_train_*.bin"
    for steps in range(1, 30):
        _, needed = cached_fineweb10B.shards_for_run(
            [pattern, f"--batch_size={batch_size}", f"--num_iterations={steps}"], tmp_path)
        assert needed == max(shards_read[:steps]), steps


def test_for_run_fetches_only_what_the_run_reads(tmp_path, served):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    with HubStandIn(REPO_ID, served) as hub:
        env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf_home"))
        result = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(out), "--for_run",
                                 f"--train_files={out}/fineweb_train_*.bin", "--num_iterations=3"],
                                env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert hub.gets == ["fineweb_train_000001.bin"]  # its val files are the default's, elsewhere


def stand_in_tools(folder, **scripts):
    """A folder of executable shell scripts, each named for the command it stands in for."""
    folder.mkdir()
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def gpus_python(gpus, then):
    """A stand-in python for run.sh: it counts `gpus` GPUs, runs the launch check as python
    does, and does `then` (shell) with whatever else it is given."""
    return (f'case "$*" in *device_count*) echo {gpus}; exit 0;; *launch_refusal*) exec '
            f'{sys.executable} "$@";; esac\n{then}')


def run_sh(tmp_path, tools, nproc=None, argv=()):
    """./run.sh `argv` with the stand-in `tools` first on the PATH, offline."""
    bin_dir = stand_in_tools(tmp_path / "bin", **tools)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", HF_HUB_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf_home"), **({"NPROC_PER_NODE": nproc} if nproc else {}))
    return subprocess.run(["bash", str(ROOT / "run.sh"), *argv], env=env, capture_output=True,
                          text=True, timeout=120)


def test_run_sh_trains_offline_on_data_elsewhere(tmp_path):
    """./run.sh on a machine with GPUs (a stand-in python says 8, a stand-in torchrun records its
    arguments), with no network: shards elsewhere need no download."""
    data = [f"--train_files={tmp_path}/train_*.bin", f"--val_files={tmp_path}/val_*.bin"]
    result = run_sh(tmp_path, dict(torchrun=f'echo "$@" > {tmp_path}/torchrun_args',
                                   python=gpus_python(8, f'exec {sys.executable} "$@"')),
                    argv=[*data, "--num_iterations=5"])
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "torchrun_args").read_text().split() == [
        "--standalone", "--nproc_per_node=8", "train_gpt.py", *data, "--num_iterations=5"]


def test_run_sh_leaves_torchruns_own_words_for_the_processes_to_torchrun(tmp_path):
    """NPROC_PER_NODE=auto (or gpu, cpu) is a number torchrun works out: run.sh checks numbers."""
    data = [f"--train_files={tmp_path}/train_*.bin", f"--val_files={tmp_path}/val_*.bin"]
    result = run_sh(tmp_path, dict(torchrun=f'echo "$@" > {tmp_path}/torchrun_args',
                                   python=gpus_python(8, f'exec {sys.executable} "$@"')),
                    nproc="auto", argv=data)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "torchrun_args").read_text().split()[:2] == [
        "--standalone", "--nproc_per_node=auto"]


def test_run_sh_refuses_what_the_processes_would_before_it_downloads_or_starts_them(tmp_path):
    """NPROC_PER_NODE=3 of 8 GPUs: the batch does not split over 3. One line says so and what
    would start; nothing is downloaded (a stand-in records it) and torchrun never starts."""
    result = run_sh(tmp_path, dict(torchrun=f"touch {tmp_path}/torchrun_started",
                                   python=gpus_python(8, f"touch {tmp_path}/downloaded")),
                    nproc="3")
    assert result.returncode == 1
    assert result.stderr == ("error: a batch of 524288 tokens does not split over 3 ranks; make "
                             "--batch_size a multiple of 3 (it starts on 1, 2, 4 or 8 "
                             "processes)\n")
    assert not list(tmp_path.glob("torchrun_started")) + list(tmp_path.glob("downloaded"))


@pytest.mark.parametrize("nproc, hint", [
    ("2", "NPROC_PER_NODE counts GPUs; the smoke run is one process (several on a CPU: torchrun "
          "--standalone --nproc_per_node=2 train_gpt.py --preset=smoke)"),
    ("auto", "NPROC_PER_NODE counts GPUs; the smoke run is one process (several on a CPU: "
             "torchrun --standalone --nproc_per_node=auto train_gpt.py --preset=smoke)"),
    ("3", "NPROC_PER_NODE counts GPUs; the smoke run is one process, and several on a CPU "
          "(torchrun --standalone --nproc_per_node=3 train_gpt.py --preset=smoke) would stop: a "
          "batch of 1024 tokens does not split over 3 ranks; make --batch_size a multiple of 3 "
          "(it starts on 1, 2, 4 or 8 processes)")])
def test_run_sh_without_a_gpu_says_that_nproc_per_node_counts_gpus(nproc, hint, tmp_path):
    """A stand-in python sees no GPU and records what it would run; nvidia-smi sees none. The
    hint names a number of processes that the smoke run starts on."""
    result = run_sh(tmp_path, {"nvidia-smi": "exit 9",
                               "python": gpus_python(0, f'echo "$@" > {tmp_path}/args')},
                    nproc=nproc)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == hint
    assert (tmp_path / "args").read_text() == "train_gpt.py --preset=smoke\n"
