"""benchmarks/compare.py: alternating runs of two whole scripts, their step_avg, mean, spread and
ratio, checked against figures worked by hand on stand-in scripts, then on train_gpt.py itself."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import compare  # noqa: E402

# A stand-in for a training script: it notes its name, arguments and world size, and writes a
# log whose final step_avg and val loss are the next of its STEP_AVGS and VAL_LOSSES, after a
# hyperparameters line with its log_dir where it has HYPERPARAMETERS; and the allocator setting
# it was given.
STAND_IN = """import os, sys
from pathlib import Path
log_dir = Path(next(a for a in sys.argv if a.startswith("--log_dir="))[len("--log_dir="):])
if os.environ.get("RANK", "0") == "0":
    with open(log_dir.parent / "order.txt", "a") as f:
        print(NAME, os.environ.get("WORLD_SIZE", "1"), *sys.argv[1:-1], file=f)
    (log_dir / "GLIBC_TUNABLES").write_text(os.environ.get("GLIBC_TUNABLES", "unset"))
    n = (log_dir.parent / "order.txt").read_text().split().count(NAME)
    ms, loss = STEP_AVGS[n - 1], VAL_LOSSES[n - 1]
    logged = dict(HYPERPARAMETERS or {}, log_dir=str(log_dir))
    (log_dir / "0f1e.txt").write_text(
        ("" if HYPERPARAMETERS is None else f"hyperparameters: {logged}\\n") +
        "step:0/5 val_loss:10.8258 train_time:0ms step_avg:0.00ms\\n"
        f"step:4/5 train_time:1ms step_avg:999.00ms train_loss:3.1\\n"
        f"step:5/5 train_time:{5 * ms:.0f}ms step_avg:{ms + 0.4:.2f}ms train_loss:3.0\\n"
        f"step:5/5 val_loss:{loss:.4f} train_time:{5 * ms:.0f}ms step_avg:{ms:.2f}ms\\n")
"""


# A stand-in that fails on its last rank alone, as a crash would; one write, so that nothing
# from another process can land inside its lines.
FAILING = """import os, sys
if int(os.environ.get("RANK", 0)) == int(os.environ.get("WORLD_SIZE", 1)) - 1:
    sys.stderr.write("Traceback (most recent call last):\\nboom\\n")
    sys.exit(3)
"""


def stand_in(folder, name, step_avgs, val_losses=None, fail=False, hyperparameters=None):
    path = folder / f"{name}.py"
    val_losses = val_losses or [3.2] * len(step_avgs)
    path.write_text(f"NAME, STEP_AVGS, VAL_LOSSES = {name!r}, {step_avgs!r}, {val_losses!r}\n"
                    f"HYPERPARAMETERS = {hyperparameters!r}\n" + (FAILING if fail else STAND_IN))
    return path


def test_alternating_runs_compared_by_hand(tmp_path, capsys):
    a = stand_in(tmp_path, "a", [100.0, 104.0, 102.0], [3.2810, 3.2790, 3.2800])
    b = stand_in(tmp_path, "b", [90.0, 91.0, 92.0], [3.3000, 3.3040, 3.3020])
    out = tmp_path / "out"
    result = compare.main([str(a), str(b), "--runs=3", f"--out={out}", "--",
                           "--num_iterations=5", "--val_every=0"])
    assert (out / "order.txt").read_text().splitlines() == [
        f"{name} 1 --num_iterations=5 --val_every=0" for name in "ababab"]
    # by hand: means 102 and 91, spreads 4 and 2, 91 / 102 = 0.89216, 11 ms > 4 ms; val losses
    # 3.2800 and 3.3020, spreads 0.0020 and 0.0040
    assert result["baseline"] == dict(script=str(a), step_avg_ms=[100.0, 104.0, 102.0],
                                      steps=[5], mean_ms=102.0, spread_ms=4.0,
                                      val_loss=[3.2810, 3.2790, 3.2800],
                                      val_loss_mean=pytest.approx(3.28),
                                      val_loss_spread=pytest.approx(0.002))
    assert result["attempt"] == dict(script=str(b), step_avg_ms=[90.0, 91.0, 92.0], steps=[5],
                                     mean_ms=91.0, spread_ms=2.0,
                                     val_loss=[3.3000, 3.3040, 3.3020],
                                     val_loss_mean=pytest.approx(3.302),
                                     val_loss_spread=pytest.approx(0.004))
    assert result["ratio"] == pytest.approx(0.892157, abs=1e-6)
    assert result["exceeds_spread"] is True
    assert result["hyperparameters_differ"] == {}  # no hyperparameters line: nothing to compare
    assert json.loads((out / "compare.json").read_text()) == result
    text = capsys.readouterr().out
    assert "attempt / baseline: 0.8922 (-11.00ms per step); larger than the larger spread, " \
           "4.00ms" in text and "warning" not in text and "other hyperparameters" not in text
    assert "baseline" in text and "step_avg 102.00ms, spread 4.00ms over 3 runs" in text
    assert "; final val loss 3.3020, spread 0.0040 (3.3000, 3.3040, 3.3020)" in text
    assert "attempt run 3/3 (" in text and "step_avg 92.00ms over 5 steps, val loss 3.3020" in text


def test_without_a_gpu_the_runs_get_the_allocator_setting_of_run_sh(tmp_path, monkeypatch):
    """A CPU step's time depends on the allocator: compare runs the scripts as run.sh runs the
    smoke run, with the same setting."""
    exported = re.search(r"export GLIBC_TUNABLES=(\S+)", (ROOT / "run.sh").read_text())[1]
    assert compare.CPU_MALLOC == exported
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    a, b = stand_in(tmp_path, "a", [1.0]), stand_in(tmp_path, "b", [1.0])
    compare.main([str(a), str(b), "--runs=1", f"--out={tmp_path / 'out'}"])
    for label in ("baseline", "attempt"):
        assert (tmp_path / "out" / f"{label}_1" / "GLIBC_TUNABLES").read_text() == exported


# 20 steps that each make and free two tensors of 64 MB (15,625 pages each); prints the pages
# the process faulted in meanwhile
FRESH_PAGES = """import resource, sys, torch
sys.path.insert(0, "tests")
import conftest  # noqa: F401
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.ones(16_000_000).mul(2)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.parametrize("tunables, most, least", [(None, 10 * 15_625, 0),
                                                   ("glibc.malloc.check=0", None, 20 * 15_625)])
def test_the_suites_own_process_keeps_freed_memory_unless_the_user_set_the_allocator(
        tunables, most, least):
    """conftest.py gives the process that runs the tests run.sh's setting too (with
    pytest -n 0 that is the one): freed memory is used again, where a fresh mapping would fault
    in every page of every step: at least 20 x 15,625 pages (measured: 625 thousand), where
    keeping them took 78 to 94 thousand."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    result = subprocess.run([sys.executable, "-c", FRESH_PAGES], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    pages = int(result.stdout)
    assert least <= pages <= (most or pages), pages


SMOKE = dict(num_layers=4, num_heads=2, model_dim=128, no_attention_layers=(), seed=0,
             checkpoint_every=0, kernels=True)  # a part of the smoke preset's hyperparameters


@pytest.mark.parametrize("baseline, attempt, differ", [
    (None, None, {}),  # no hyperparameters line: nothing to compare
    (SMOKE, None, {}),
    (SMOKE, dict(SMOKE, seed=1, checkpoint_every=50), {}),  # and their log_dirs differ
    (dict(SMOKE, model_dim=64), SMOKE, {"model_dim": [64, 128]}),
    ({k: v for k, v in SMOKE.items() if k != "kernels"}, dict(SMOKE, no_attention_layers=(1,)),
     {"no_attention_layers": [(), (1,)], "kernels": [None, True]}),
])
def test_the_hyperparameters_that_differ_are_named(baseline, attempt, differ, tmp_path, capsys):
    """Two scripts whose presets differ: a line and a field of compare.json name the
    hyperparameters that differ, but not the seed, nor where files go (compare.py gives each run
    a log_dir of its own)."""
    a = stand_in(tmp_path, "a", [100.0, 101.0], hyperparameters=baseline)
    b = stand_in(tmp_path, "b", [99.0, 100.0], hyperparameters=attempt)
    out = tmp_path / "out"
    result = compare.main([str(a), str(b), "--runs=2", f"--out={out}"])
    assert result["hyperparameters_differ"] == differ
    saved = json.loads((out / "compare.json").read_text())["hyperparameters_differ"]
    assert saved == {name: [list(v) if isinstance(v, tuple) else v for v in values]
                     for name, values in differ.items()}  # JSON keeps a tuple as a list
    line = {0: None, 1: "model_dim 64 -> 128",
            2: "no_attention_layers () -> (1,), kernels not logged -> True"}[len(differ)]
    text = capsys.readouterr().out
    if line is None:
        assert "other hyperparameters" not in text
    else:  # after the verdict
        assert "within the larger spread, 1.00ms\nthe scripts ran with other hyperparameters, " \
               f"baseline -> attempt: {line}\n" in text


def test_a_difference_within_the_spread_is_said_to_be(tmp_path, capsys):
    a = stand_in(tmp_path, "a", [100.0, 110.0])
    b = stand_in(tmp_path, "b", [103.0, 105.0])
    result = compare.main([str(a), str(b), "--runs=2", f"--out={tmp_path / 'out'}"])
    assert result["ratio"] == pytest.approx(104 / 105) and result["exceeds_spread"] is False
    assert "(-1.00ms per step); within the larger spread, 10.00ms" in capsys.readouterr().out


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_failed_run_stops_with_its_last_lines(nproc, tmp_path):
    """Under torchrun, the lines shown are the worker's, not torchrun's report after them."""
    a = stand_in(tmp_path, "a", [100.0])
    b = stand_in(tmp_path, "b", [], fail=True)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stopped:
        compare.main([str(a), str(b), "--runs=2", f"--nproc_per_node={nproc}", f"--out={out}"])
    message = str(stopped.value)
    assert message.startswith(f"{b} failed (exit status {3 if nproc == 1 else 1}); all its output "
                              f"is in {out / 'attempt_1' / 'output.txt'}, its last lines:\n")
    assert message.endswith("\nTraceback (most recent call last):\nboom")
    assert "elastic" not in message and "FAILED" not in message
    assert (out / "order.txt").read_text().split() == ["a", str(nproc)]  # nothing ran after it


def test_one_run_each_gives_no_verdict_and_unequal_lengths_a_warning(tmp_path, capsys):
    a, b = stand_in(tmp_path, "a", [100.0]), stand_in(tmp_path, "b", [100.5])
    b.write_text(b.read_text().replace("step:5/5", "step:6/6"))
    out = tmp_path / "out"
    result = compare.main([str(a), str(b), "--runs=1", f"--out={out}"])
    assert result["exceeds_spread"] is None and result["larger_spread_ms"] is None
    assert (result["baseline"]["steps"], result["attempt"]["steps"]) == ([5], [6])
    # one run measures no spread: null in the JSON, not a spread of 0
    saved = json.loads((out / "compare.json").read_text())
    assert saved == result and saved["larger_spread_ms"] is None
    assert [saved[label][spread] for label in ("baseline", "attempt")
            for spread in ("spread_ms", "val_loss_spread")] == [None] * 4
    text = capsys.readouterr().out
    assert "step_avg 100.50ms, no spread over 1 run (100.50); final val loss 3.2000, no spread " \
           "(3.2000)\n" in text
    assert "(+0.50ms per step); one run each: no spread to compare with (--runs=2 or more)\n" in text
    assert "warning: the runs took [5] and [6] steps" in text


@pytest.mark.parametrize("broken", ["baseline", "attempt"])
def test_a_script_that_does_not_compile_is_refused_before_any_run(broken, tmp_path, capsys):
    """A syntax error in either script is found before the other script's runs are spent."""
    scripts = dict(baseline=stand_in(tmp_path, "a", [1.0]), attempt=stand_in(tmp_path, "b", [1.0]))
    scripts[broken].write_text("NAME = 'broken'\ndef f(:\n    pass\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit):
        compare.main([str(scripts["baseline"]), str(scripts["attempt"]), f"--out={out}"])
    assert not out.exists()  # no run folder, and no order.txt in it
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f": error: {scripts[broken]}, line 2: invalid syntax")


def test_help_shows_the_scripts_own_options_after_a_double_dash():
    """compare splits those options off itself, so argparse's own usage would not show them."""
    shown = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare.py"), "--help"],
                           capture_output=True, text=True, check=True).stdout
    assert shown.splitlines()[0] == ("usage: compare.py BASELINE.py ATTEMPT.py [--runs=N] "
                                     "[--nproc_per_node=G] [--out=DIR] [-- --name=value ...]")


@pytest.mark.parametrize("argv, message", [
    (["missing.py", "{a}"], "missing.py: no such file"),
    (["{a}", "{a}", "--runs=0"], "--runs=0 and --nproc_per_node=1 must be 1 or more"),
    (["{a}", "{a}", "--", "--log_dir=x"], "leave --log_dir out"),
    (["{a}", "{a}", "--out={tmp}"], "exists and is not an empty folder; name a new folder"),
    (["{a}", "{a}", "--out={a}"], "exists and is not an empty folder; name a new folder"),
])
def test_bad_arguments_are_refused(argv, message, tmp_path, capsys):
    a = stand_in(tmp_path, "a", [1.0])
    with pytest.raises(SystemExit):
        compare.main([arg.format(a=a, tmp=tmp_path) for arg in argv])
    assert message in capsys.readouterr().err


def test_torchrun_runs_each_script_on_several_processes(tmp_path):
    a, b = stand_in(tmp_path, "a", [10.0]), stand_in(tmp_path, "b", [20.0])
    result = compare.main([str(a), str(b), "--runs=1", "--nproc_per_node=2",
                           f"--out={tmp_path / 'out'}"])
    assert (tmp_path / "out" / "order.txt").read_text().split() == ["a", "2", "b", "2"]
    assert result["ratio"] == 2.0 and result["nproc_per_node"] == 2


def test_two_copies_of_the_training_script(tmp_path):
    """The real thing, on the smoke preset: the figure compared is the log's own last step_avg.
    A smaller validation than the preset's, as its 16 sequences take 3.5 s of each run's 9."""
    copy = tmp_path / "attempt.py"
    shutil.copy(ROOT / "train_gpt.py", copy)
    out = tmp_path / "out"
    result = compare.main([str(ROOT / "train_gpt.py"), str(copy), "--runs=1", f"--out={out}",
                           "--", "--preset=smoke", "--num_iterations=3", "--val_every=0",
                           "--val_tokens=1024"])
    for label in ("baseline", "attempt"):
        (log,) = [p for p in (out / f"{label}_1").glob("*.txt") if p.name != "output.txt"]
        last = log.read_text().splitlines()[-2]
        assert re.fullmatch(r"step:3/3 val_loss:\d+\.\d+ train_time:\d+ms step_avg:[\d.]+ms", last)
        assert result[label]["step_avg_ms"] == [float(re.search(r"step_avg:([\d.]+)ms", last)[1])]
        assert result[label]["val_loss"] == [float(re.search(r"val_loss:([\d.]+)", last)[1])]
    assert result["baseline"]["val_loss"] == result["attempt"]["val_loss"]  # the same training
    # the ratio of the logs' own figures; not bounded, as two 3-step runs on a busy CPU may
    # differ by any factor
    assert result["ratio"] == result["attempt"]["step_avg_ms"][0] / result["baseline"][
        "step_avg_ms"][0]
