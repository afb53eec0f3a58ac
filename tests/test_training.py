"""Training section: command line, bad input, world-size invariance, the undone compile steps,
logs."""
import dataclasses
import datetime
import importlib.util
import io
import math
import os
import re
import struct
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

import train_gpt
from train_gpt import GPT, Hyperparameters, UserError, check_config, main, parse_args

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "shakespeare"
TINY = [f"--train_files={SAMPLE}/shakespeare_train_*.bin",
        f"--val_files={SAMPLE}/shakespeare_val_*.bin", "--num_layers=2", "--num_heads=1",
        "--model_dim=64", "--batch_size=512", "--micro_batch_size=256", "--val_tokens=1024",
        "--num_iterations=4", "--val_every=2", "--compile_steps=0"]


def test_overrides_are_typed_by_the_field():
    args = parse_args(["--num_iterations=7", "--muon_lr=0.1", "--log_dir=x",
                       "--no_attention_layers=1,3"])
    assert (args.num_iterations, args.muon_lr, args.log_dir) == (7, 0.1, "x")
    assert args.no_attention_layers == (1, 3) and parse_args([]) == Hyperparameters()
    assert parse_args(["--no_attention_layers="]).no_attention_layers == ()
    assert parse_args(["--save_checkpoint"]).save_checkpoint is True
    assert parse_args(["--save_checkpoint=false"]).save_checkpoint is False
    assert parse_args(["--save_checkpoint=1"]).save_checkpoint is True


def help_text(config, capsys):
    """What `--help` prints for `config`, with argparse's line wrapping undone."""
    with pytest.raises(SystemExit):
        parse_args(["--help"], config)
    return " ".join(capsys.readouterr().out.split())


def test_help_lists_every_field_with_its_help_and_default(capsys):
    result = subprocess.run([sys.executable, str(ROOT / "train_gpt.py"), "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert text == help_text(Hyperparameters, capsys)
    for field in dataclasses.fields(Hyperparameters):
        metavar = "[bool]" if field.type is bool else field.type.__name__
        assert f"--{field.name} {metavar} {field.metadata['help']} (default: " in text, field.name
    assert ("--val_tokens int validate on this many tokens from the val shard's start "
            "(default: 10485760)") in text
    assert ("--save_checkpoint [bool] write the training state after the last step "
            "(default: False)") in text
    assert "--preset {smoke}" in text


def test_a_new_field_needs_no_new_code(tmp_path, capsys):
    """The command line, its help and the checks come from the dataclass and the limits table;
    a subclass keeps the help of the fields it inherits."""
    @dataclasses.dataclass
    class Extended(Hyperparameters):
        dropout: float = train_gpt.option(0.0, "a knob nobody has yet")
    args = parse_args(TINY + ["--dropout=0.25", f"--log_dir={tmp_path}"], Extended)
    assert args.dropout == 0.25 and args.num_layers == 2
    check_config(args, 1, val_shard_tokens=10**6)  # no limit for it, so no complaint
    text = help_text(Extended, capsys)
    assert "--dropout float a knob nobody has yet (default: 0.0)" in text
    assert "--muon_lr float Muon: the matrices of the blocks (default: 0.05)" in text


@pytest.mark.parametrize("future_annotations", [False, True])
def test_the_command_line_works_however_the_file_is_loaded(future_annotations, tmp_path, capsys,
                                                          monkeypatch):
    """A copy loaded by its path and never put in sys.modules; a copy whose annotations are
    strings (which Python's dataclasses can only take from a module in sys.modules)."""
    source = (ROOT / "train_gpt.py").read_text()
    if future_annotations:  # right after the docstring, where Python allows it
        end_of_docstring = source.index('"""\n', 3) + 4
        source = (source[:end_of_docstring] + "from __future__ import annotations\n"
                  + source[end_of_docstring:])
    path = tmp_path / "copied_train_gpt.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("copied_train_gpt", path)
    module = importlib.util.module_from_spec(spec)
    if future_annotations:
        monkeypatch.setitem(sys.modules, "copied_train_gpt", module)
    spec.loader.exec_module(module)
    assert isinstance(module.Hyperparameters.__annotations__["seed"], str) == future_annotations
    args = module.parse_args(["--num_iterations=7", "--no_attention_layers=1,3",
                              "--save_checkpoint"])
    assert (args.num_iterations, args.no_attention_layers, args.save_checkpoint) == (7, (1, 3), True)
    with pytest.raises(SystemExit):
        module.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--num_iterations int training steps (default: 1390)" in text


def test_preset_applies_first_and_overrides_win():
    args = parse_args(["--num_iterations=3", "--preset=smoke"])
    assert args.num_iterations == 3 and args.model_dim == 128
    assert args.train_files == "data/shakespeare/shakespeare_train_*.bin"


@pytest.mark.parametrize("argv, message", [
    (["--num_iteration=3"], r"^unrecognized arguments: --num_iteration=3 \(--help lists the "
                            r"hyperparameters\)$"),
    (["--num_iterations=three"], r"argument --num_iterations: invalid int value: 'three'"),
    (["--muon_lr=fast"], r"argument --muon_lr: invalid float value: 'fast'"),
    (["--no_attention_layers=7,x"], r"argument --no_attention_layers: invalid "
                                    r"comma_separated_ints value: '7,x'"),
    (["num_iterations=3"], r"^unrecognized arguments: num_iterations=3 \(--help lists"),
    (["--preset=huge"], r"argument --preset: invalid choice: 'huge' \(choose from '?smoke"),
])
def test_bad_arguments_are_clear_errors(argv, message):
    with pytest.raises(UserError, match=message):
        parse_args(argv)


@pytest.mark.parametrize("override, world_size, message", [
    ({"batch_size": 516}, 8, "does not split over 8 ranks"),
    ({"micro_batch_size": 384}, 1, "must split into sequences of 384"),
    ({"val_tokens": 2048}, 1, "the val shard holds 2048 tokens, not more than --val_tokens=2048"),
    ({"micro_batch_size": 1000}, 1, "--micro_batch_size=1000 must be a multiple of 128"),
    ({"val_tokens": 1000}, 1, "multiple of world size x micro batch"),
    ({"num_layers": 0}, 1, "--num_layers=0 must be positive"),
])
def test_impossible_configurations_are_refused(override, world_size, message):
    args = parse_args(TINY)
    for name, value in override.items():
        setattr(args, name, value)
    with pytest.raises(UserError, match=message):
        check_config(args, world_size, val_shard_tokens=2048)


@pytest.mark.parametrize("world_size, argv, refusal", [
    (3, ["--preset=smoke"], "error: a batch of 1024 tokens does not split over 3 ranks; make "
     "--batch_size a multiple of 3 (it starts on 1, 2, 4 or 8 processes)"),
    (2, ["--preset=smoke"], None),
    (6, [], "error: a batch of 524288 tokens does not split over 6 ranks; make --batch_size a "
     "multiple of 6 (it starts on 1, 2, 4 or 8 processes)"),
    (2, ["--batch_size=1536", "--micro_batch_size=512", "--val_tokens=6144"],
     "error: each rank's 768 tokens must split into sequences of 512, and --micro_batch_size=512 "
     "must be a multiple of 128; change --batch_size or --micro_batch_size (it starts on 1, 3, "
     "4 or 6 processes)"),  # on 8, each rank's 192 tokens are not whole 128-token blocks
    (8, ["--model_dim=-1"], "error: --model_dim=-1 must be positive"),  # on no number of them
    (8, ["--model_dims=1"], "error: unrecognized arguments: --model_dims=1 (--help lists the "
     "hyperparameters)"),
    (3, ["--preset=smoke", "--help"], None),  # the script only prints its help
])
def test_a_launcher_learns_what_every_process_would_refuse(world_size, argv, refusal):
    assert train_gpt.launch_refusal(world_size, argv) == refusal


@pytest.mark.parametrize("world_size, sequences", [
    (1, "4 sequence(s) of 256 tokens per rank per step"),
    (2, "2 sequence(s) of 256 tokens per rank per step"),
    (8, "1 sequence(s) of 128 tokens per rank per step (shorter than --micro_batch_size: a "
        "different run from the reference)")])
def test_the_header_says_how_each_rank_splits_its_share(world_size, sequences, tmp_path):
    args = parse_args(TINY + ["--batch_size=1024"])
    log = train_gpt.RunLog(str(tmp_path / "run.txt"), writes=True)
    model = train_gpt.build_model(args, torch.device("cpu"))[0]
    train_gpt.log_run_header(log, args, world_size, [], [], model, b"print('the code')\n")
    text = (tmp_path / "run.txt").read_text()
    assert f"\nworld size {world_size}: {sequences}\n" in text
    assert text.startswith("print('the code')\n" + "=" * 100 + "\n")
    # 17b4971161b8: printf "print('the code')\n" | sha256sum
    assert "\nthe script's SHA-256 begins 17b4971161b8, as sha256sum train_gpt.py says\n" in text


@pytest.mark.parametrize("shard_tokens", [1024, 1025, 1026, 1027])
def test_the_val_shard_check_agrees_with_the_loader(shard_tokens, tmp_path):
    """Validation reads val_tokens inputs and one more target; the loader leaves (here: wraps
    around) a shard as soon as a batch would reach its last token."""
    train_gpt.write_shard(tmp_path / "val_000000.bin", [7] * shard_tokens)
    loader = train_gpt.DistributedDataLoader(str(tmp_path / "val_*.bin"), 0, 1)
    for _ in range(4):
        loader.next_batch(256)
    stays_in_the_shard = loader.pos == 1024
    args = dataclasses.replace(parse_args(TINY), val_tokens=1024)
    try:
        check_config(args, 1, val_shard_tokens=shard_tokens)
        accepted = True
    except UserError as err:
        assert f"holds {shard_tokens} tokens, not more than --val_tokens=1024 + 1" in str(err)
        accepted = False
    assert accepted == stays_in_the_shard


# Every hyperparameter with an impossible value: (argument, error, message). {tmp} is a folder
# holding a text file, a tensor file, files cut short (torch.load raised RuntimeError for one and
# OSError for the other) and an empty one, a zip file of numpy's, a checkpoint with a byte of its
# pickle changed (torch.load raised UnicodeDecodeError or EOFError for such), a pickled object
# that is not plain data (only weights_only=False would load it) and an empty folder.
SWEEP = [
    ("--train_files={tmp}/none_*.bin", UserError, r"no shard matches .*--train_files and"),
    ("--train_files={tmp}", UserError, r"is a folder, not a shard, and holds no \.bin file; down"),
    ("--val_files={tmp}/none_*.bin", UserError, r"no shard matches .*--train_files and"),
    ("--val_tokens=0", UserError, r"--val_tokens=0 must be positive"),
    ("--val_tokens=1000", UserError, r"--val_tokens=1000 must be a multiple of world size x"),
    ("--val_tokens=169984", UserError, r"holds 169501 tokens, not more than --val_tokens=169984"),
    ("--batch_size=-512", UserError, r"--batch_size=-512 must be positive"),
    ("--batch_size=384", UserError, r"384 tokens must split into sequences of 256"),
    ("--micro_batch_size=0", UserError, r"--micro_batch_size=0 must be positive"),
    ("--micro_batch_size=200", UserError,
     r"sequences of 200, and --micro_batch_size=200 must be a multiple of 128"),
    ("--vocab_size=50000", UserError, r"--vocab_size=50000 cannot hold the GPT-2 tokens"),
    ("--num_layers=0", UserError, r"--num_layers=0 must be positive"),
    ("--num_heads=-1", UserError, r"--model_dim=64 must split into --num_heads=-1 heads"),
    ("--num_heads=3", UserError, r"--model_dim=64 must split into --num_heads=3 heads, each"),
    ("--model_dim=0", UserError, r"--model_dim=0 must be positive"),
    ("--model_dim=66", UserError, r"--model_dim=66 must split into --num_heads=1 heads, each of a"),
    ("--no_attention_layers=-1", UserError, r"--no_attention_layers=-1 must count layers from 0"),
    ("--no_attention_layers=0,2", UserError,
     r"--no_attention_layers names layer 2, but the model's layers are 0 to 1"),
    ("--num_iterations=0", UserError, r"--num_iterations=0 must be positive"),
    ("--cooldown_frac=1.5", UserError, r"--cooldown_frac=1.5 must lie in \[0, 1\]"),
    ("--softcap=0", UserError, r"--softcap=0.0 must be a finite number above 0"),
    ("--softcap=inf", UserError, r"--softcap=inf must be a finite number above 0"),
    ("--embed_lr=-0.6", UserError, r"--embed_lr=-0.6 must be a finite number, 0 or more"),
    ("--head_lr=nan", UserError, r"--head_lr=nan must be a finite number"),
    ("--scalar_lr=inf", UserError, r"--scalar_lr=inf must be a finite number"),
    ("--muon_lr=-1", UserError, r"--muon_lr=-1.0 must be a finite number"),
    ("--val_every=-1", UserError, r"--val_every=-1 must be 0 or more"),
    ("--compile_steps=-10", UserError, r"--compile_steps=-10 must be 0 or more"),
    ("--seed=-1", UserError, r"--seed=-1 must be 0 or more"),
    ("--log_dir=", UserError, r"--log_dir= must name a folder"),
    ("--log_dir={tmp}/notes.txt/logs", UserError, r"logs: cannot make the folder \(Not a direc"),
    ("--checkpoint_every=-1", UserError, r"--checkpoint_every=-1 must be 0 or more"),
    ("--save_checkpoint=sometimes", UserError,
     r"--save_checkpoint: expected true or false, got 'sometimes'"),
    ("--resume={tmp}/missing.pt", UserError, r"--resume=\S+missing.pt: no such file"),
    ("--resume={tmp}/empty", UserError, r"empty: the folder holds no checkpoint"),
    ("--resume={tmp}/notes.txt", UserError, r"notes.txt is not a readable checkpoint"),
    ("--resume={tmp}/cut.pt", UserError, r"cut.pt is not a readable checkpoint: not a sound zip"),
    ("--resume={tmp}/end_cut.pt", UserError, r"end_cut.pt is not a readable checkpoint: not a so"),
    ("--resume={tmp}/empty.pt", UserError, r"empty.pt is not a readable checkpoint: not a sound"),
    ("--resume={tmp}/arrays.npz", UserError, r"npz is not a readable checkpoint: a zip archive, b"),
    ("--resume={tmp}/damaged.pt", UserError,
     r"damaged.pt is not a readable checkpoint: its part whole/data.pkl is damaged"),
    ("--resume={tmp}/tensor.pt", UserError, r"tensor.pt is not a checkpoint of this script"),
    ("--resume={tmp}/date.pt", UserError, r"date.pt is not a readable checkpoint: it holds obj"),
    ("--kernels=maybe", UserError, r"--kernels: expected true or false, got 'maybe'"),
]


def test_the_sweep_covers_every_field():
    """Every hyperparameter has a value in the sweep that the script refuses."""
    swept = {argument[2:].partition("=")[0] for argument, _, _ in SWEEP}
    assert swept == {f.name for f in dataclasses.fields(Hyperparameters)}


@pytest.mark.parametrize("argument, error, message", SWEEP, ids=[case[0] for case in SWEEP])
def test_bad_input_stops_with_a_clear_message(argument, error, message, tmp_path):
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "empty").mkdir()
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    torch.save(datetime.date(2026, 11, 22), tmp_path / "date.pt")
    torch.save({"model": torch.zeros(1000)}, tmp_path / "whole.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "whole.pt").read_bytes()[:2000])
    (tmp_path / "end_cut.pt").write_bytes((tmp_path / "whole.pt").read_bytes()[:-100])
    (tmp_path / "empty.pt").write_bytes(b"")
    np.savez(tmp_path / "arrays.npz", weights=np.zeros(3))
    damaged = bytearray((tmp_path / "whole.pt").read_bytes())
    with zipfile.ZipFile(tmp_path / "whole.pt") as archive:  # a byte of its pickle flipped
        start = archive.getinfo("whole/data.pkl").header_offset
    name_length, extra_length = struct.unpack("<HH", damaged[start + 26:start + 30])
    damaged[start + 30 + name_length + extra_length + 20] ^= 0xFF
    (tmp_path / "damaged.pt").write_bytes(damaged)
    logs = tmp_path / "logs"
    with pytest.raises(error, match=message):
        main(TINY + [f"--log_dir={logs}", argument.format(tmp=tmp_path)])
    assert not list(logs.glob("*.txt"))  # refused before the run starts


@pytest.mark.parametrize("error", [OSError(5, "Input/output error"), MemoryError()])
def test_an_error_in_reading_a_checkpoint_keeps_its_type(error, tmp_path, monkeypatch):
    """Not the file's fault, so not bad input: it reaches the user with its traceback."""
    main(TINY + [f"--log_dir={tmp_path}", "--num_iterations=1", "--save_checkpoint"])
    (saved,) = tmp_path.glob("*/state_step000001.pt")

    def load(*args, **kwargs):
        raise error
    monkeypatch.setattr(torch, "load", load)
    with pytest.raises(type(error)) as raised:
        main(TINY + [f"--log_dir={tmp_path}", f"--resume={saved}", "--num_iterations=1"])
    assert raised.value is error


def test_a_read_only_log_folder_is_refused(tmp_path, monkeypatch):
    """As root a read-only folder can still be written, and os.access says so: for this folder
    it answers as it would for any other user."""
    folder = tmp_path / "read_only"
    folder.mkdir(mode=0o555)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kwargs: (
        not mode & os.W_OK if Path(path) == folder else real_access(path, mode, **kwargs)))
    with pytest.raises(UserError, match="the folder is not writable"):
        main(TINY + [f"--log_dir={folder}"])


def test_a_sequence_the_cpus_memory_cannot_hold_is_refused_before_the_log(tmp_path, monkeypatch):
    """A stand-in machine that holds TINY's 256-token sequences for one process and not two:
    at 14 bytes per head column and 56 per layer and unit of width, a token takes 711,424."""
    per_token = 14 * 50304 + 56 * 2 * 64
    real_sysconf = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: (
        256 * per_token // 4096 + 1 if name == "SC_PHYS_PAGES" else
        4096 if name == "SC_PAGE_SIZE" else real_sysconf(name)))
    model = train_gpt.GPT(50257, num_layers=2, num_heads=1, model_dim=64)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)  # one process, as without torchrun
    train_gpt.check_host_memory(model, 256)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # as torchrun starts two processes on it
    with pytest.raises(UserError) as refused:
        main(TINY + [f"--log_dir={tmp_path}"])
    assert str(refused.value) == (
        "on a CPU, a sequence of 256 tokens needs at least 0.2 GiB, and this machine has 0.1 GiB "
        "for each of its 2 process(es), enough for at most 128 tokens: set a smaller "
        "--micro_batch_size, or run the CPU smoke run, --preset=smoke")
    assert not list(tmp_path.glob("*.txt"))


def test_the_cpus_memory_floor_counts_each_layer_and_the_head_as_it_says(monkeypatch):
    """A token counts 3.5 fp32 copies of its logits and 14 fp32 values per layer and unit of
    width: with 128 columns, 12 layers of 768, that is 4 x (448 + 129,024) = 517,888 bytes, so a
    machine of 1,000 tokens' bytes (and 5 more) holds 1,000 tokens, not 1,001."""
    per_token = 4 * (3.5 * 128 + 14 * 12 * 768)
    assert per_token == 517_888
    real_sysconf = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: (
        1 if name == "SC_PAGE_SIZE" else 1000 * 517_888 + 5 if name == "SC_PHYS_PAGES" else
        real_sysconf(name)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    model = train_gpt.GPT(128, num_layers=12, num_heads=6, model_dim=768, max_seq_len=128)
    train_gpt.check_host_memory(model, 1000)
    with pytest.raises(UserError, match=r"a sequence of 1001 tokens needs at least 0\.5 GiB, and "
                       r"this machine has 0\.5 GiB for each of its 1 process\(es\), enough for "
                       r"at most 1000 tokens"):
        train_gpt.check_host_memory(model, 1001)


def test_the_cpus_memory_check_takes_what_a_step_takes(monkeypatch):
    """The check refuses only what cannot fit, and not only the absurd: the resident memory
    that 896 more tokens in a step take, measured without run.sh's allocator setting (which
    keeps freed pages), must hold them, and half of it must not. Four layers of the reference's
    width without attention, which take the fewest floats a token; a step of 128 tokens first
    makes the weights' gradients."""
    layers = ["--num_layers=4", "--model_dim=768", "--num_heads=6", "--no_attention_layers=0,1,2,3"]
    code = (f"import torch, train_gpt; torch.set_num_threads(1)\n"
            f"args = train_gpt.parse_args({TINY + layers!r} + ['--micro_batch_size=1024'])\n"
            f"model, _, _ = train_gpt.build_model(args, torch.device('cpu'))\n"
            f"tokens = torch.randint(0, 50257, (1025,), generator=torch.Generator().manual_seed(0))"
            f"\ndef peak_after(n):\n"
            f"    train_gpt.forward_backward(model, tokens[:n], tokens[1:n + 1], torch.tensor(1),"
            f" n)\n"
            f"    return train_gpt.peak_memory_mib(torch.device('cpu')) * 2**20\n"
            f"print(-peak_after(128) + peak_after(1024))")
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    taken = int(result.stdout.split()[-1])
    args = parse_args(TINY + layers)
    model = train_gpt.GPT(args.vocab_size, args.num_layers, args.num_heads, args.model_dim,
                          no_attention_layers=args.no_attention_layers)
    real_sysconf = os.sysconf
    for memory, fits in [(taken, True), (taken // 2, False)]:
        monkeypatch.setattr(os, "sysconf", lambda name: (
            1 if name == "SC_PAGE_SIZE" else memory if name == "SC_PHYS_PAGES" else
            real_sysconf(name)))
        try:
            train_gpt.check_host_memory(model, 1024 - 128)
            accepted = True
        except UserError:
            accepted = False
        assert accepted == fits, (memory, taken)


def test_a_cpu_runs_peak_memory_is_its_own_not_its_parents():
    """ru_maxrss keeps the peak of the process that started this one across exec: a process
    that holds 3 GiB, then becomes one that imports the script, must report the second's peak
    alone (torch's import: about 650 MiB)."""
    code = ("import os, sys\n"
            "held = bytearray(3 * 2**30)\n"
            "held[::4096] = b'1' * (len(held) // 4096)  # every page resident\n"
            "os.execv(sys.executable, [sys.executable, '-c', 'import torch, train_gpt; "
            "print(train_gpt.peak_memory_mib(torch.device(\"cpu\")))'])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 200 < int(result.stdout) < 2048, result.stdout


@pytest.mark.parametrize("name, capability", [
    ("Tesla V100-SXM2-16GB", (7, 0)), ("Tesla T4", (7, 5)), ("NVIDIA A100-SXM4-80GB", (8, 0))])
def test_a_gpu_without_bf16_is_refused_in_one_line_before_anything_is_built(name, capability):
    """A stand-in GPU: CUDA's queries answer as this GPU would, and the run stops at the first
    call that needs the GPU itself (after the check, for the A100)."""
    code = (f"import runpy, sys, torch; c = torch.cuda; c.is_available = lambda: True; "
            f"c.get_device_capability = lambda device: {capability}; "
            f"c.get_device_name = lambda device: {name!r}; "
            f"c.set_device = lambda device: sys.exit('set_device'); "
            f"sys.argv = ['train_gpt.py', '--preset=smoke']; "
            f"runpy.run_path({str(ROOT / 'train_gpt.py')!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=os.environ | {"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 1
    major, minor = capability
    assert result.stderr == ("set_device\n" if major >= 8 else (
        f"error: {name} (compute capability {major}.{minor}) has no bf16 arithmetic, in which "
        "the recipe trains; use a GPU from the A100 (8.0) on, or hide this one for the CPU "
        "smoke run: CUDA_VISIBLE_DEVICES= python train_gpt.py --preset=smoke\n"))


def launcher(nproc):
    """The command that starts `nproc` processes: Python itself for one, torchrun for more."""
    return [sys.executable] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def launch(tmp_path, mode, nproc, argv, name=None):
    out = tmp_path / (name or f"{mode}{nproc}")
    out.mkdir()
    worker = str(Path(__file__).resolve().parent / "training_worker.py")
    # stops a hang only: the whole two-rank GPU-path test has taken up to 128 s on 2 busy cores
    result = subprocess.run(launcher(nproc) + [worker, mode, str(out), *argv, f"--log_dir={out}"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out / "result.pt")


def checkpoint(folder, step):
    (path,) = Path(folder).glob(f"*/state_step{step:06d}.pt")
    return path


def assert_same_state(a, b):
    """Two checkpoints hold the same training state, bit for bit."""
    a, b = (torch.load(path, weights_only=True) for path in (a, b))
    assert a["step"] == b["step"] and a["train_loader"] == b["train_loader"]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for part in ("adam", "muon"):
        assert a[part]["state"].keys() == b[part]["state"].keys(), part
        for index, state in a[part]["state"].items():
            for key, value in state.items():
                assert torch.equal(value, b[part]["state"][index][key]), (part, index, key)


def test_one_and_two_processes_train_the_same_with_or_without_compile_steps(tmp_path):
    """The weights bit for bit: a sum of two gradients does not depend on its order. The val
    loss sums its batches in another order on two ranks ((v0 + v2) + (v1 + v3) rather than
    ((v0 + v1) + v2) + v3), so it may differ in its last bits."""
    argv = TINY + ["--save_checkpoint"]
    one, two = launch(tmp_path, "train", 1, argv), launch(tmp_path, "train", 2, argv)
    warm = launch(tmp_path, "train", 2, argv + ["--compile_steps=3"], name="warm")
    assert_same_state(checkpoint(tmp_path / "train1", 4), checkpoint(tmp_path / "train2", 4))
    assert_same_state(checkpoint(tmp_path / "train2", 4), checkpoint(tmp_path / "warm", 4))
    assert list(one) == [0, 2, 4] and two == warm, (two, warm)
    assert one == pytest.approx(two, rel=1e-6, abs=0)
    assert one[4] < one[0] - 0.5  # and it trained


def test_the_gpus_path_on_two_ranks_trains_as_one_process_of_the_recipe(tmp_path):
    """What a GPU run does, on a CPU: the model compiled, the head and the MLP through their
    kernels (in Triton's interpreter, in fp32), DDP over two ranks, which splits the compiled
    graph at its gradient buckets. Against one process running the recipe's torch code eagerly.
    Small, as the interpreter takes 2 s for the head of one sequence and the compiler 10 s for
    each layer: one layer, one sequence of 128 tokens per rank and step; 3 steps, as the
    zero-initialised projections leave the MLP's first matrix without a gradient until then.
    Measured with two layers: the val loss at step 3 moves by 2e-4 between the kernels and
    torch, and by as much between compiled and eager; one process on this path gives the two
    ranks' losses exactly."""
    argv = TINY + ["--num_layers=1", "--batch_size=256", "--micro_batch_size=128",
                   "--val_tokens=256", "--num_iterations=3", "--val_every=3"]
    one = main(argv + [f"--log_dir={tmp_path}"])
    two = launch(tmp_path, "gpu_path", 2, argv)
    assert list(two["val_losses"]) == [0, 3]
    assert two["val_losses"][0] == pytest.approx(math.log(50304), abs=1e-5)
    assert two["val_losses"][3] == pytest.approx(one[3], abs=1e-3) and one[3] < one[0] - 0.2
    # every forward took both kernels: 3 steps and 2 validations of one sequence per rank, the
    # MLP's kernel once more in each step's backward
    assert two["launches"] == dict(softcapped_cross_entropy_kernel=3 + 2,
                                   relu_square_matmul_kernel=3 * 2 + 2)


@pytest.mark.parametrize("layout", [["--num_layers=12", "--no_attention_layers=0,9"],
                                    ["--num_layers=1"], ["--no_attention_layers=0,1"]],
                         ids=["a-table-without-attention", "one-layer", "no-attention"])
def test_models_with_fewer_parts_train_on_two_ranks_as_on_one(layout, tmp_path):
    """DDP stops at the second step if a parameter has no gradient: here a value table whose
    two layers have no attention, skip weights without a decoder layer, or both."""
    argv = TINY + layout + ["--num_iterations=3", "--val_every=3"]
    one, two = main(argv + [f"--log_dir={tmp_path}"]), launch(tmp_path, "train", 2, argv)
    assert list(one) == [0, 3] and one == pytest.approx(two, rel=1e-6, abs=0)
    assert one[3] < one[0] - 0.1  # and it trained


def test_ddp_leaves_the_buffers_alone_under_the_name_the_pytorch_at_hand_gives_it():
    """The rotary tables are the same on every rank, so DDP does not broadcast them before each
    forward, with no deprecation warning: PyTorch 2.14 renamed broadcast_buffers
    forward_sync_buffers, and warns of the old name (broadcast_buffers stays a property)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ddp = train_gpt.data_parallel(GPT(1000, 1, 1, 64, max_seq_len=128), torch.device("cpu"))
        assert ddp.broadcast_buffers is False and ddp.gradient_as_bucket_view
    finally:
        dist.destroy_process_group()


def test_gradients_are_averaged_over_sequences_and_ranks(tmp_path):
    """Adam and Muon barely notice a scaled gradient, so compare the gradients themselves. Two
    sequences a rank: DDP must average over the ranks only after the last sequence's backward."""
    argv = TINY + ["--batch_size=1024"]
    one, two = launch(tmp_path, "grads", 1, argv), launch(tmp_path, "grads", 2, argv)
    for name in one:
        scale = one[name].abs().max()
        assert scale > 0 and (one[name] - two[name]).abs().max() < 1e-5 * scale, name


def test_the_compile_steps_are_undone(tmp_path):
    cold = main(TINY + [f"--log_dir={tmp_path}"])
    warm = main(TINY + [f"--log_dir={tmp_path}", "--compile_steps=3"])
    assert cold == warm


def test_the_compile_steps_are_undone_on_four_ranks_up_to_the_order_of_sums(tmp_path):
    """From 3 ranks on, a gradient sum depends on its order, and DDP regroups its buckets after
    its first backward, so the compile steps change the order of the timed steps' sums.
    Measured: 9.2791 without them and 9.2758 with 2 at step 6, each repeatable."""
    argv = TINY + ["--num_layers=3", "--num_iterations=6"]
    (tmp_path / "cold").mkdir()
    (tmp_path / "warm").mkdir()
    cold = launch(tmp_path / "cold", "train", 4, argv)
    warm = launch(tmp_path / "warm", "train", 4, argv + ["--compile_steps=2"])
    assert list(cold) == list(warm) == [0, 2, 4, 6] and cold[0] == warm[0]
    for step in cold:
        assert abs(cold[step] - warm[step]) < 1e-2, (step, cold[step], warm[step])
    assert cold[6] < cold[0] - 1  # and it trained


def test_log_file_has_the_header_and_the_reference_lines(tmp_path):
    main(TINY + [f"--log_dir={tmp_path}/new/logs"])  # a missing folder is made
    (log,) = (tmp_path / "new" / "logs").glob("*.txt")
    assert re.fullmatch(r"[0-9a-f-]{36}\.txt", log.name)
    text = log.read_text()
    assert text.startswith(Path(train_gpt.__file__).read_text())
    digest = subprocess.run(["sha256sum", train_gpt.__file__], capture_output=True, text=True,
                            check=True).stdout[:12]
    assert f"\nthe script's SHA-256 begins {digest}, as sha256sum train_gpt.py says\n" in text
    assert f"PyTorch {torch.__version__}" in text and "hyperparameters: {" in text
    assert "shakespeare_train_000000.bin" in text
    lines = text.splitlines()
    steps = [line for line in lines if line.startswith("step:")]
    val = r"step:{0}/4 val_loss:\d+\.\d{{4}} train_time:\d+ms step_avg:\d+\.\d{{2}}ms"
    train = r"step:{0}/4 train_time:\d+ms step_avg:\d+\.\d{{2}}ms train_loss:\d+\.\d{{4}}"
    # no step yet: the clock has run only through the loop's few lines before validation,
    # well under a millisecond unless the process waits for a core
    first = r"step:0/4 val_loss:10\.8258 train_time:\d+ms step_avg:0\.00ms"
    patterns = [first, train.format(1), train.format(2), val.format(2), train.format(3),
                train.format(4), val.format(4)]
    assert len(steps) == len(patterns)
    for line, pattern in zip(steps, patterns):
        assert re.fullmatch(pattern, line), line
    assert re.fullmatch(r"peak memory consumption: \d+ MiB.*", lines[-1])
    # the first step trains the zero head, so its loss is ln 50304 as validation's before it
    assert steps[1].endswith(f"train_loss:{math.log(50304):.4f}")
    # step_avg is train_time over the steps, each rounded; the clock never runs back
    fields = [re.search(r"step:(\d+)/4.* train_time:(\d+)ms step_avg:([\d.]+)ms", line).groups()
              for line in steps]
    for step, ms, avg in [(int(a), int(b), float(c)) for a, b, c in fields[1:]]:
        assert abs(avg * step - ms) <= 0.5 + 0.005 * step, (step, ms, avg)
    times = [int(ms) for _, ms, _ in fields]
    assert times == sorted(times)


def test_the_compile_steps_show_each_step_and_log_their_time(tmp_path, capsys):
    """Redirected output (not a terminal) gets a line per compile step; the log gets the total,
    between the header and the step lines."""
    main(TINY + [f"--log_dir={tmp_path}", "--compile_steps=2"])
    shown = re.findall(r"^compile step (\d)/2: (\d+\.\d)s$", capsys.readouterr().out, re.MULTILINE)
    assert [step for step, _ in shown] == ["1", "2"]
    (log,) = tmp_path.glob("*.txt")
    lines = log.read_text().splitlines()
    (total,) = [line for line in lines if line.startswith("compile steps")]
    seconds = float(re.fullmatch(r"compile steps: 2 in (\d+\.\d)s, untimed, then undone",
                                 total)[1])
    assert float(shown[0][1]) <= float(shown[1][1]) <= seconds + 0.1
    after = lines[lines.index(total) + 1]
    first = re.fullmatch(r"step:0/4 val_loss:10\.8258 train_time:(\d+)ms step_avg:0\.00ms", after)
    assert first, after
    # the compile steps are not train time: step 0's clock reads less than one of them took
    assert int(first[1]) < 1e3 * float(shown[0][1]), (after, shown)


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_the_compile_steps_are_timed_at_their_end(terminal, monkeypatch, capsys):
    """A step's time is taken when its result is there: a bar on a terminal, lines in a file."""
    monkeypatch.setattr(sys, "stdout", Terminal() if terminal else io.StringIO())
    logged = []

    def step_once(step):
        time.sleep(0.2)
        return torch.tensor(float(step))
    assert not train_gpt.run_compile_steps(step_once, 3, [], logged.append, show_progress=True)
    out = sys.stdout.getvalue()
    seconds = [float(t) for t in re.findall(r"compile step \d/3: (\d+\.\d)s", out)]
    if terminal:
        assert seconds == [] and "compile steps (untimed): 100%" in out and "| 3/3 [" in out
    else:
        assert "%" not in out and len(seconds) == 3
        assert all(0.2 * k - 0.05 <= t < 0.2 * k + 0.5 for k, t in enumerate(seconds, 1)), seconds
    assert capsys.readouterr() == ("", "")  # standard error stays quiet
    (total,) = logged
    assert 0.55 <= float(re.fullmatch(r"compile steps: 3 in (\d+\.\d)s, untimed, then undone",
                                      total)[1]) < 1.5


def test_the_compile_steps_show_nothing_on_other_ranks_and_when_there_are_none(monkeypatch,
                                                                               capsys):
    monkeypatch.setattr(sys, "stdout", Terminal())
    logged = []
    train_gpt.run_compile_steps(lambda step: torch.tensor(0.0), 2, [], logged.append, False)
    train_gpt.run_compile_steps(lambda step: torch.tensor(0.0), 0, [], logged.append, True)
    assert sys.stdout.getvalue() == "" and capsys.readouterr() == ("", "")
    # the total still goes to `log`, which is a no-op on the other ranks
    assert logged == ["compile steps: 2 in 0.0s, untimed, then undone"]


def test_step_lines_are_read_one_step_late(tmp_path, monkeypatch):
    """A step's loss is read once the next step is queued, so the CPU never waits for the GPU;
    validation waits anyway and reads it at once."""
    original, last_line_before_step = train_gpt.forward_backward, []

    def forward_backward(*args):
        lines = re.findall(r"^step:(\d)/8 train_time", "".join(
            path.read_text() for path in tmp_path.glob("*.txt")), re.MULTILINE)
        last_line_before_step.append(int(lines[-1]) if lines else None)
        return original(*args)
    monkeypatch.setattr(train_gpt, "forward_backward", forward_backward)
    main(TINY + [f"--log_dir={tmp_path}", "--num_iterations=8", "--val_every=4"])
    # before step k runs, the lines of steps up to k - 2 are out; validation at 4 flushes line 4
    assert last_line_before_step == [None, None, 1, 2, 4, 4, 5, 6]
    text = next(tmp_path.glob("*.txt")).read_text()
    assert re.findall(r"^step:(\d)/8 train_time", text, re.MULTILINE) == list("12345678")


@pytest.mark.parametrize("preset, expected", [
    ({}, "PYTORCH_ALLOC_CONF=expandable_segments:True"),
    ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}, "PYTORCH_ALLOC_CONF=max_split_size_mb:64"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "backend:native"}, "PYTORCH_CUDA_ALLOC_CONF=backend:native"),
])
def test_allocator_settings_keep_the_users_and_are_logged(preset, expected, tmp_path, monkeypatch):
    """Expandable segments through the current variable, unless the user set either name."""
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.setenv(name, "")  # so that monkeypatch restores the environment afterwards
        monkeypatch.delenv(name)
    for name, value in preset.items():
        monkeypatch.setenv(name, value)
    main(TINY + [f"--log_dir={tmp_path}", "--num_iterations=1"])
    assert f"allocator settings: {expected}\n" in next(tmp_path.glob("*.txt")).read_text()
    assert os.environ.get("PYTORCH_ALLOC_CONF") == preset.get(
        "PYTORCH_ALLOC_CONF", None if preset else "expandable_segments:True")


def test_a_token_id_past_the_vocabulary_stops_the_run_naming_the_shard(tmp_path):
    """Checked in the loader, where a compiled model (on a GPU) does not check; in the batch of
    step 2 (tokens 512 to 1024)."""
    tokens = train_gpt.read_shard(SAMPLE / "shakespeare_train_000000.bin").numpy().copy()
    tokens[700] = 50300
    train_gpt.write_shard(tmp_path / "train_000000.bin", tokens)
    with pytest.raises(UserError, match=r"train_000000\.bin: token 700 is 50300, not a GPT-2 id "
                                        r"below 50257"):
        main(TINY + [f"--train_files={tmp_path}/train_*.bin", f"--log_dir={tmp_path}"])


def test_missing_data_names_the_download_command(tmp_path):
    with pytest.raises(UserError, match="cached_fineweb10B.py"):
        main(TINY + [f"--train_files={tmp_path}/none_*.bin", f"--log_dir={tmp_path}"])


def test_torchrun_that_may_restart_needs_a_run_id(tmp_path, monkeypatch):
    """Without --rdzv-id, torchrun's run id is "none": each restart would draw a new one, find
    no checkpoint of its own and train again from step 0."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    with pytest.raises(UserError, match=r"--max-restarts\) but has no run id.*--rdzv-id=NAME"):
        main(TINY + [f"--log_dir={tmp_path}"])
    assert not list(tmp_path.glob("*.txt"))
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")  # nothing to resume: a new id will do
    assert list(main(TINY + [f"--log_dir={tmp_path}", "--num_iterations=1"])) == [0, 1]


def test_a_new_run_may_not_take_a_run_id_that_has_a_log_or_checkpoints(tmp_path, monkeypatch):
    """It would write a second run into the same log; a restart by torchrun goes on with it."""
    argv = TINY + [f"--log_dir={tmp_path}", "--num_iterations=2"]
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "first")
    main(argv)
    log = tmp_path / "first.txt"
    logged = log.read_text()
    with pytest.raises(UserError, match=rf"^the run id first is taken: {log} holds an earlier "
                                        rf"run; give torchrun a new --rdzv-id$"):
        main(argv)
    assert log.read_text() == logged
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "second")
    main(argv + ["--checkpoint_every=1"])
    (tmp_path / "second.txt").unlink()  # the checkpoints alone take the id too
    with pytest.raises(UserError, match=rf"^the run id second is taken: {tmp_path}/second holds "
                                        rf"an earlier run; give torchrun a new --rdzv-id \(to "
                                        rf"continue that run, add --resume={tmp_path}/second\)$"):
        main(argv)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert list(main(argv)) == [2]  # restarted: resumed after its last step


def test_torchrun_sets_what_the_run_id_check_reads(tmp_path):
    """torchrun as in the README's several-node command, but without --rdzv-id; port 0 lets the
    store take a free port as it binds, so no other test's can take it first."""
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=1",
               "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--max-restarts=1",
               str(Path(__file__).resolve().parent / "training_worker.py"), "train", str(out),
               *TINY, f"--log_dir={out}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--rdzv-id=NAME" in (out / "stopped_rank0.txt").read_text()


def run_script(argv, tmp_path, broken=""):
    """python train_gpt.py ARGV, with `broken` (a statement) run in the process first."""
    code = (f"import runpy, sys, torch\n{broken}\nsys.argv = sys.argv[1:]\n"
            f"runpy.run_path(sys.argv[0], run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code, str(ROOT / "train_gpt.py"), *argv,
                           f"--log_dir={tmp_path}"], capture_output=True, text=True, timeout=120)


def test_a_bug_keeps_its_traceback_and_bad_input_is_one_line(tmp_path):
    bad = run_script(TINY + ["--num_layers=0"], tmp_path)
    assert (bad.returncode, bad.stderr) == (1, "error: --num_layers=0 must be positive\n")
    # a ValueError raised inside torch is a bug, not bad input
    bug = run_script(TINY, tmp_path, broken="def broken(*args, **kwargs): raise ValueError("
                     "'a bug in torch')\ntorch.nn.functional.cross_entropy = broken")
    assert bug.returncode == 1
    assert "Traceback (most recent call last)" in bug.stderr
    assert bug.stderr.endswith("ValueError: a bug in torch\n") and "error:" not in bug.stderr


def test_the_file_runs_without_its_docstrings_and_without_its_path(tmp_path):
    """python -OO drops the docstrings; exec() of the file's text gives it no __file__, as a
    notebook cell would. Both train, the second with a log that has no source to copy."""
    argv = TINY + ["--num_iterations=1", "--val_every=0"]
    optimized = subprocess.run([sys.executable, "-OO", str(ROOT / "train_gpt.py"), *argv,
                                f"--log_dir={tmp_path / 'oo'}"], capture_output=True, text=True,
                               timeout=120)
    assert optimized.returncode == 0, optimized.stderr[-3000:]
    assert re.search(r"^step:1/1 val_loss:\d+\.\d{4} ", optimized.stdout, re.MULTILINE)
    exec_argv = argv + [f"--log_dir={tmp_path / 'exec'}"]
    code = (f"namespace = dict(__name__='notebook')\n"
            f"exec(open({str(ROOT / 'train_gpt.py')!r}).read(), namespace)\n"
            f"print(namespace['main']({exec_argv!r}))")
    executed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120)
    assert executed.returncode == 0, executed.stderr[-3000:]
    assert re.search(r"^\{1: \d+\.\d+\}$", executed.stdout, re.MULTILINE)
    (log,) = (tmp_path / "exec").glob("*.txt")
    assert log.read_text().startswith("Python ")
