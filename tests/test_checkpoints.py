"""Training section, checkpoints: exact resume (1 and 2 ranks, after a torchrun restart, after
Ctrl-C or SIGTERM), a second Ctrl-C that ends a blocked run, atomic writes and rotation, refused
checkpoints, non-finite losses."""
import contextlib
import dataclasses
import errno
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train_gpt
from test_training import TINY, assert_same_state, checkpoint, launcher
from train_gpt import UserError, checkpoints_in, main, write_checkpoint

SIX = TINY + ["--num_iterations=6"]  # validation at steps 0, 2, 4 and 6
WORKER = str(Path(__file__).resolve().parent / "training_worker.py")


def torchrun(mode, out, argv, launcher_args=(), timeout=300):
    """The worker on two ranks under torchrun, given `launcher_args` as well."""
    out.mkdir(exist_ok=True)
    command = [*launcher(2), *launcher_args, WORKER, mode, str(out), *argv, f"--log_dir={out}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def logged_losses(folder, after):
    """{line kind and step: the loss as printed} for the steps after `after`, from the log."""
    (log,) = Path(folder).glob("*.txt")
    found = {}
    for match in re.finditer(r"^step:(\d+)/\d+ (val_loss:|train_time).*?(\d+\.\d{4})?$",
                             log.read_text(), re.MULTILINE):
        if int(match[1]) > after:
            found[match[2][:3], int(match[1])] = re.search(r"loss:(\d+\.\d+)", match[0])[1]
    return found


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Six steps in one process with a checkpoint every three: the run to match."""
    folder = tmp_path_factory.mktemp("straight")
    main(SIX + [f"--log_dir={folder}", "--checkpoint_every=3"])
    return folder


@pytest.fixture(scope="module")
def straight_two_ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("straight2")
    result = torchrun("train", folder, SIX + ["--checkpoint_every=3"])
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def test_resume_continues_exactly(straight, tmp_path):
    """Also with compile steps before the restore, and checkpoints every 4 then at the end."""
    main(SIX + [f"--log_dir={tmp_path}", f"--resume={checkpoint(straight, 3)}",
                "--compile_steps=2", "--checkpoint_every=4", "--save_checkpoint"])
    assert [Path(p).name for p in checkpoints_in(str(checkpoint(tmp_path, 6).parent))] == [
        "state_step000004.pt", "state_step000006.pt"]
    assert_same_state(checkpoint(straight, 6), checkpoint(tmp_path, 6))
    resumed = logged_losses(tmp_path, after=3)
    assert list(resumed) == [("tra", 4), ("val", 4), ("tra", 5), ("tra", 6), ("val", 6)]
    assert resumed == logged_losses(straight, after=3)


def test_resume_with_two_ranks_keeps_every_ranks_muon_momentum(straight_two_ranks, tmp_path):
    saved = torch.load(checkpoint(straight_two_ranks, 3), weights_only=True)
    assert saved["world_size"] == 2
    muon_params = [i for group in saved["muon"]["param_groups"] for i in group["params"]]
    assert sorted(saved["muon"]["state"]) == sorted(muon_params)  # rank 1's buffers too
    result = torchrun("train", tmp_path, SIX + [f"--resume={checkpoint(straight_two_ranks, 3)}",
                                                "--save_checkpoint"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_state(checkpoint(straight_two_ranks, 6), checkpoint(tmp_path, 6))
    assert logged_losses(tmp_path, after=3) == logged_losses(straight_two_ranks, after=3)


def test_torchrun_restart_resumes_from_the_newest_checkpoint(straight_two_ranks, tmp_path):
    result = torchrun("crash", tmp_path, SIX + ["--checkpoint_every=2"],
                      launcher_args=["--max-restarts=1"])
    assert result.returncode == 0, result.stderr[-3000:]
    text = next(tmp_path.glob("*.txt")).read_text()
    assert re.search(r"resuming from \S+state_step000004\.pt: step 4 of run", text)
    assert len(re.findall(r"^step:4/6 val_loss:", text, re.MULTILINE)) == 2  # one log, appended
    assert_same_state(checkpoint(straight_two_ranks, 6), checkpoint(tmp_path, 6))


def run_worker(mode, out, argv, timeout=120):
    """training_worker.py in one process, without torchrun."""
    out.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, WORKER, mode, str(out), *argv, f"--log_dir={out}"],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("sig", ["sigint", "sigterm"])
def test_a_signal_stops_after_the_step_with_a_checkpoint(sig, straight, tmp_path):
    """Asked for in step 3, the stop is read with the line of step 3, once step 4 is queued:
    the run stops after step 4."""
    result = run_worker(f"{sig}:3", tmp_path, SIX + ["--checkpoint_every=100"])
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == (f"interrupted at step 4; continue with "
                                              f"--resume={checkpoint(tmp_path, 4)}")
    lines = next(tmp_path.glob("*.txt")).read_text().splitlines()
    assert lines[-3].startswith("step:4/6 train_time:")
    assert lines[-2].startswith("checkpoint: step 4 written to ")
    assert lines[-1] == result.stderr.splitlines()[-1]
    main(SIX + [f"--log_dir={tmp_path / 'resumed'}", f"--resume={checkpoint(tmp_path, 4)}",
                "--save_checkpoint"])
    assert_same_state(checkpoint(straight, 6), checkpoint(tmp_path / "resumed", 6))


def test_a_signal_in_the_last_step_lets_the_run_finish(tmp_path):
    """Every step is done by the time the request is read: validate and end as usual."""
    result = run_worker("sigterm:6", tmp_path, SIX + ["--checkpoint_every=100"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(torch.load(tmp_path / "result.pt")) == [0, 2, 4, 6]
    lines = next(tmp_path.glob("*.txt")).read_text().splitlines()
    assert lines[-3].startswith("step:6/6 train_time:")
    assert lines[-2].startswith("step:6/6 val_loss:")
    assert lines[-1].startswith("peak memory consumption:")
    assert not any(line.startswith("interrupted") for line in lines)


def test_torchrun_interrupted_stops_every_rank_at_one_step(straight_two_ranks, tmp_path):
    """SIGTERM to torchrun reaches every worker; rank 0 has it in step 3, so both stop after 4."""
    result = torchrun("torchrun_sigterm:3", tmp_path, SIX + ["--checkpoint_every=100"])
    assert result.returncode != 0
    lines = next(tmp_path.glob("*.txt")).read_text().splitlines()
    assert lines[-1] == f"interrupted at step 4; continue with --resume={checkpoint(tmp_path, 4)}"
    # each rank's exit message: both ranks stopped after the same step
    assert re.findall(r"interrupted at step (\d+)", result.stderr) == ["4", "4"]
    resumed = tmp_path / "resumed"
    result = torchrun("train", resumed, SIX + [f"--resume={checkpoint(tmp_path, 4)}",
                                               "--save_checkpoint"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_state(checkpoint(straight_two_ranks, 6), checkpoint(resumed, 6))


def test_a_signal_to_one_rank_stops_every_rank(tmp_path):
    """The request travels with the loss: a rank stopping alone would leave the other waiting.

    Like the loss, it is read one step late: asked for in step 5, it stops both after step 6.
    """
    result = torchrun("sigterm", tmp_path, SIX + ["--num_iterations=8", "--checkpoint_every=100"],
                      timeout=120)
    assert result.returncode != 0
    lines = next(tmp_path.glob("*.txt")).read_text().splitlines()
    assert lines[-3].startswith("step:6/8 train_time:")
    assert lines[-2].startswith("checkpoint: step 6 written to ")
    assert lines[-1].startswith("interrupted at step 6; continue with --resume=")
    assert result.stderr.count("interrupted at step 6") == 2  # each rank's exit message
    assert torch.load(checkpoint(tmp_path, 6), weights_only=True)["step"] == 6


def wait_for(condition, seconds):
    """Whether `condition()` comes true within `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def processes(marker):
    """The processes whose command line holds `marker`, a test's own folder."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if str(marker).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
    return found


@contextlib.contextmanager
def started(command, tmp_path, **popen):
    """Popen(command); on leaving, every process that names tmp_path is killed, torchrun's
    workers too (they run in sessions of their own), whatever the test found."""
    try:
        yield subprocess.Popen(command, **popen)
    finally:
        for pid in processes(tmp_path):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


STOPPING = "stopping after this step; Ctrl-C again to quit now\n"


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_second_ctrl_c_ends_a_blocked_run_at_once(nproc, tmp_path):
    """The last rank blocks in step 3; with two ranks, rank 0 waits for it inside a collective,
    where Python runs no signal handler. The first Ctrl-C says what it does; the second ends
    the run, where torchrun alone would wait 30 s before killing its workers."""
    stderr = tmp_path / "stderr.txt"
    command = launcher(nproc) + [WORKER, "hang:3", str(tmp_path), *SIX, f"--log_dir={tmp_path}"]
    with open(stderr, "w") as err, started(command, tmp_path, stdout=subprocess.DEVNULL,
                                           stderr=err) as run:
        assert wait_for(lambda: "blocked" in stderr.read_text(), 120), stderr.read_text()[-3000:]
        time.sleep(1)  # rank 0 reaches the collective
        run.send_signal(signal.SIGINT)
        assert wait_for(lambda: STOPPING in stderr.read_text(), 10), stderr.read_text()[-3000:]
        time.sleep(2)  # a second within a second of the first would count as a copy of it
        assert run.poll() is None  # the first one ends nothing
        run.send_signal(signal.SIGINT)
        begun = time.monotonic()
        code = run.wait(timeout=60)
        assert time.monotonic() - begun < 10
    assert stderr.read_text().count(STOPPING) == 1  # rank 0 alone says it
    if nproc == 1:
        assert code == 128 + signal.SIGINT


def test_a_second_ctrl_c_ends_the_run_when_nobody_reads_its_output(tmp_path):
    """As when `./run.sh 2>&1 | tee log` is interrupted: the Ctrl-C ends tee as well."""
    command = [WORKER, "hang:3", str(tmp_path), *SIX, f"--log_dir={tmp_path}"]
    with started([sys.executable, *command], tmp_path, stdout=subprocess.DEVNULL,
                 stderr=subprocess.PIPE, text=True) as run:
        while "blocked" not in (line := run.stderr.readline()):
            assert line, "the worker ended before it blocked"
        run.stderr.close()
        run.send_signal(signal.SIGINT)
        time.sleep(2)
        assert run.poll() is None
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=10) == 128 + signal.SIGINT


def test_one_sigterm_to_every_process_is_one_stop(tmp_path):
    """A scheduler ending a job signals torchrun and each worker; torchrun passes its signal
    on, so a worker gets two within moments: one request, which writes a checkpoint."""
    argv = TINY + ["--num_iterations=300", "--val_every=0", "--checkpoint_every=1000"]
    command = launcher(2) + [WORKER, "train", str(tmp_path), *argv, f"--log_dir={tmp_path}"]
    with started(command, tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                 text=True) as run:
        assert wait_for(lambda: run.poll() is not None or any(
            "step:3/300 train" in log.read_text() for log in tmp_path.glob("*.txt")), 120)
        assert run.poll() is None
        for pid in processes(tmp_path):  # torchrun and its two workers
            os.kill(pid, signal.SIGTERM)
        _, stderr = run.communicate(timeout=60)
    (log,) = tmp_path.glob("*.txt")
    last = log.read_text().splitlines()[-1]
    step = int(re.fullmatch(r"interrupted at step (\d+); continue with --resume=\S+", last)[1])
    assert checkpoint(tmp_path, step).exists(), stderr[-3000:]
    assert re.findall(r"interrupted at step (\d+)", stderr) == [str(step)] * 2  # both ranks


def test_a_failed_write_stops_every_rank(tmp_path):
    """Rank 0 writes alone; its error, torch.save's as a file may grow no more, must reach rank
    1, which would otherwise wait. The message names the checkpoint written before."""
    result = torchrun("diskfull:2", tmp_path, SIX + ["--checkpoint_every=2"], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        stopped = (tmp_path / f"stopped_rank{rank}.txt").read_text()
        assert stopped == (f"cannot write the checkpoint {checkpoint(tmp_path, 2).parent}/"
                           f"state_step000004.pt (File too large); free "
                           f"space or change --log_dir; continue with "
                           f"--resume={checkpoint(tmp_path, 2)}")


def test_checkpoint_writes_are_atomic_and_keep_the_newest_two(tmp_path, monkeypatch):
    for step in range(1, 5):
        write_checkpoint({"step": step}, str(tmp_path / f"state_step{step:06d}.pt"))
    assert [Path(p).name for p in checkpoints_in(str(tmp_path))] == [
        "state_step000003.pt", "state_step000004.pt"]

    def crash_mid_write(state, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", crash_mid_write)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint({"step": 5}, str(tmp_path / "state_step000005.pt"))
    assert [Path(p).name for p in checkpoints_in(str(tmp_path))] == [
        "state_step000003.pt", "state_step000004.pt"]
    assert torch.load(checkpoints_in(str(tmp_path))[-1], weights_only=True) == {"step": 4}
    monkeypatch.undo()
    write_checkpoint({"step": 2}, str(tmp_path / "state_step000002.pt"))  # older than the rest
    assert (tmp_path / "state_step000002.pt").exists()  # what was just written is never deleted


def test_checkpoint_time_is_not_train_time(tmp_path, monkeypatch):
    """Each write takes 1,000 s by the clocks (the host clock jumps while it writes), far more
    than any step on a busy machine: none of it may reach train_time."""
    original, perf_counter, jumps = train_gpt.write_checkpoint, time.perf_counter, []

    def slow(state, path):
        original(state, path)
        jumps.append(1000.0)
    monkeypatch.setattr(train_gpt, "write_checkpoint", slow)
    monkeypatch.setattr(time, "perf_counter", lambda: perf_counter() + sum(jumps))
    main(TINY + ["--num_iterations=2", "--checkpoint_every=1", f"--log_dir={tmp_path}"])
    text = next(tmp_path.glob("*.txt")).read_text()
    times = [int(t) for t in re.findall(r"^step:\d/2 train_time:(\d+)ms", text, re.MULTILINE)]
    assert len(times) == 2 and times[1] - times[0] < 1_000_000, times
    written = re.findall(r"^checkpoint: step (\d) written to (\S+) in (\d+)ms", text, re.MULTILINE)
    assert [step for step, _, _ in written] == ["1", "2"]
    assert all(int(ms) >= 1_000_000 for _, _, ms in written)
    assert [Path(path).name for _, path, _ in written] == [
        Path(p).name for p in checkpoints_in(str(Path(written[0][1]).parent))]


def test_a_checkpoint_from_another_configuration_is_refused(straight, straight_two_ranks,
                                                           tmp_path):
    with pytest.raises(UserError, match=r"comes from a different configuration: model_dim "
                       r"\(checkpoint 64, now 128\); muon_lr \(checkpoint 0.05, now 0.1\)\."):
        main(SIX + [f"--log_dir={tmp_path}", f"--resume={checkpoint(straight, 3)}",
                    "--model_dim=128", "--muon_lr=0.1"])
    with pytest.raises(UserError, match=r"world_size \(checkpoint 2, now 1\)"):
        main(SIX + [f"--log_dir={tmp_path}", f"--resume={checkpoint(straight_two_ranks, 3)}"])
    # what does not change the weights may change; a folder stands for its newest checkpoint
    main(SIX + [f"--log_dir={tmp_path}", f"--resume={checkpoint(straight, 3).parent}",
                "--val_every=0"])
    text = next(tmp_path.glob("*.txt")).read_text()
    assert f"resuming from {checkpoint(straight, 6)}: step 6 of run" in text


def test_a_checkpoint_from_before_a_field_existed_holds_its_default(straight, tmp_path):
    """--softcap was 15, written into the code, before it was a hyperparameter."""
    state = torch.load(checkpoint(straight, 3), weights_only=True)
    del state["hyperparameters"]["softcap"]
    torch.save(state, tmp_path / "older.pt")
    with pytest.raises(UserError, match=r"configuration: softcap \(checkpoint 15.0, now 30.0\)"):
        main(SIX + [f"--log_dir={tmp_path}", f"--resume={tmp_path / 'older.pt'}",
                    "--softcap=30"])
    main(SIX + [f"--log_dir={tmp_path}", f"--resume={tmp_path / 'older.pt'}"])
    assert logged_losses(tmp_path, after=3) == logged_losses(straight, after=3)


def fail_at_call(monkeypatch, name, call, make_loss):
    """Let train_gpt.<name> return make_loss(its result) at its `call`-th call."""
    original, calls = getattr(train_gpt, name), []

    def wrapped(*args):
        calls.append(None)
        result = original(*args)
        return make_loss(result, *args) if len(calls) == call else result
    monkeypatch.setattr(train_gpt, name, wrapped)


def test_a_non_finite_training_loss_stops_the_run(tmp_path, monkeypatch):
    fail_at_call(monkeypatch, "forward_backward", 5, lambda loss, *_: loss * float("nan"))
    with pytest.raises(UserError, match=r"step 5: the training loss is nan, so the run "
                       r"stops here; continue with --resume=\S+state_step000004\.pt"):
        main(SIX + [f"--log_dir={tmp_path}", "--checkpoint_every=2"])
    last = next(tmp_path.glob("*.txt")).read_text().splitlines()[-1]
    assert last.startswith("step 5: the training loss is nan")


def test_a_non_finite_validation_loss_stops_the_run(tmp_path, monkeypatch):
    fail_at_call(monkeypatch, "evaluate", 2, lambda loss, *_: loss + float("inf"))
    with pytest.raises(UserError, match=r"step 2: the validation loss is inf, so the run"
                       r" stops here; no checkpoint was written \(--checkpoint_every=K"):
        main(SIX + [f"--log_dir={tmp_path}"])


def test_non_finite_weights_are_never_checkpointed(tmp_path, monkeypatch):
    def poison(loss, model, *_):
        with torch.no_grad():
            model.lm_head.weight[0, 0] = float("nan")
        return loss
    fail_at_call(monkeypatch, "forward_backward", 3, poison)
    with pytest.raises(UserError, match=r"step 3: the norm of the weights is nan, so "
                       r"the run stops here; continue with --resume=\S+state_step000002\.pt"):
        main(SIX + [f"--log_dir={tmp_path}", "--checkpoint_every=1"])
    assert [Path(p).name for p in checkpoints_in(str(next(tmp_path.glob("*/"))))] == [
        "state_step000001.pt", "state_step000002.pt"]


def test_a_non_finite_loss_on_one_rank_stops_all_ranks(tmp_path):
    """The workers exit cleanly after the error, so a rank left waiting would hang the test."""
    result = torchrun("nan", tmp_path, SIX + ["--checkpoint_every=2"], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        stopped = (tmp_path / f"stopped_rank{rank}.txt").read_text()
        assert stopped.startswith("step 5: the training loss is nan"), stopped
    last = next(tmp_path.glob("*.txt")).read_text().splitlines()[-1]
    assert re.fullmatch(r"step 5: the training loss is nan, so the run stops here; continue "
                        r"with --resume=\S+state_step000004\.pt", last)


def test_a_steps_loss_is_read_before_its_checkpoint_is_written(tmp_path, monkeypatch):
    """Each checkpoint follows its step's line: a NaN loss in step 3 stops the run before step
    3's weights are saved, naming step 2's checkpoint, the newest whose steps all had finite
    losses. A new run writes no checkpoint at step 0, before it has trained."""
    fail_at_call(monkeypatch, "forward_backward", 3, lambda loss, *_: loss * float("nan"))
    with pytest.raises(UserError, match=r"^step 3: the training loss is nan, so the run stops "
                       r"here; continue with --resume=\S+state_step000002\.pt$"):
        main(SIX + [f"--log_dir={tmp_path}", "--checkpoint_every=1"])
    assert [Path(p).name for p in checkpoints_in(str(next(tmp_path.glob("*/"))))] == [
        "state_step000001.pt", "state_step000002.pt"]
    lines = next(tmp_path.glob("*.txt")).read_text().splitlines()
    order = [line.split(" written")[0] for line in lines
             if re.match(r"step:\d/6 train_time|checkpoint: step", line)]
    assert [re.sub(r" train_time.*", "", line) for line in order] == [
        "step:1/6", "checkpoint: step 1", "step:2/6", "checkpoint: step 2", "step:3/6"]


def test_a_stop_without_checkpoints_writes_none_and_says_so(tmp_path):
    result = run_worker("sigint:3", tmp_path, SIX)
    assert result.returncode == 1, result.stderr[-3000:]
    message = ("interrupted at step 4; no checkpoint was written (--checkpoint_every=K writes one "
               "every K steps)")
    assert result.stderr.splitlines()[-1] == message
    assert next(tmp_path.glob("*.txt")).read_text().splitlines()[-1] == message
    assert not [path for path in tmp_path.iterdir() if path.is_dir()]  # no checkpoint folder


def test_a_resumed_run_that_meets_a_nan_names_the_checkpoint_it_resumed_from(straight, tmp_path,
                                                                             monkeypatch):
    fail_at_call(monkeypatch, "forward_backward", 1, lambda loss, *_: loss * float("nan"))
    with pytest.raises(UserError) as stopped:
        main(SIX + [f"--log_dir={tmp_path}", f"--resume={checkpoint(straight, 3)}"])
    assert str(stopped.value) == (f"step 4: the training loss is nan, so the run stops here; "
                                  f"continue with --resume={checkpoint(straight, 3)}")


def test_a_resumed_run_goes_on_from_the_checkpoints_train_time(straight, tmp_path):
    """A checkpoint's train_time_ms set to 10^7: the resumed run's lines count from there."""
    state = torch.load(checkpoint(straight, 3), weights_only=True)
    state["train_time_ms"] = 1e7
    torch.save(state, tmp_path / "later.pt")
    main(SIX + [f"--log_dir={tmp_path}", f"--resume={tmp_path / 'later.pt'}"])
    text = next(tmp_path.glob("*.txt")).read_text()
    lines = re.findall(r"^step:(\d)/6 .*train_time:(\d+)ms step_avg:([\d.]+)ms", text, re.MULTILINE)
    assert [step for step, _, _ in lines] == ["4", "4", "5", "6", "6"]  # train and val lines
    for step, ms, avg in lines:
        assert 1e7 < int(ms) < 1e7 + 60_000, (step, ms)
        assert float(avg) == pytest.approx(int(ms) / int(step), abs=0.5 / int(step) + 0.005)


def test_ctrl_c_in_the_compile_steps_stops_in_one_line_and_frees_the_run_id(tmp_path, monkeypatch):
    """Asked for in compile step 2 of 3, the stop ends the run after that step, as any stop: in
    one line, in the log as on standard error. The log holds no step, so a rerun under the same
    run id starts, and its log replaces the stopped one's."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "attempt1")  # as torchrun --rdzv-id=attempt1
    result = run_worker("sigint:2", tmp_path, SIX + ["--compile_steps=3"])
    assert result.returncode == 1, result.stderr[-3000:]
    message = ("interrupted in the compile steps, before training began (its run id stays free); "
               "no checkpoint was written (--checkpoint_every=K writes one every K steps)")
    assert result.stderr.splitlines()[-2:] == [STOPPING.strip(), message]
    lines = (tmp_path / "attempt1.txt").read_text().splitlines()
    assert lines[-1] == message and not [line for line in lines if line.startswith("step:")]
    main(SIX + [f"--log_dir={tmp_path}"])
    text = (tmp_path / "attempt1.txt").read_text()
    assert text.count("\nhyperparameters: {") == 1 and "\ninterrupted" not in text
    assert "step:6/6 val_loss:" in text
    with pytest.raises(UserError, match=r"the run id attempt1 is taken"):  # now it trained
        main(SIX + [f"--log_dir={tmp_path}"])


def test_ctrl_c_while_the_run_is_set_up_ends_it_in_one_line(tmp_path):
    """Before the loop notes Ctrl-C itself: here while reading a val shard that is a pipe with
    nothing written to it yet, so that the signal comes while the script waits in a read."""
    fifo = tmp_path / "val_000000.bin"
    os.mkfifo(fifo)
    command = [sys.executable, str(Path(train_gpt.__file__)), *SIX, f"--val_files={fifo}",
               f"--log_dir={tmp_path}"]
    # SIGINT as a terminal leaves it, where a shell that started the tests in the background
    # had it ignored: Python then never raises KeyboardInterrupt
    with started(command, tmp_path, stderr=subprocess.PIPE, text=True,
                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as run:
        deadline = time.monotonic() + 120
        while True:  # the script has the pipe open for reading once a writer can open it
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                assert time.monotonic() < deadline and run.poll() is None
                time.sleep(0.1)
        time.sleep(0.5)  # and waits in its read
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=60)
        os.close(writer)
    assert run.returncode == 1 and stderr == "interrupted\n", stderr[-3000:]


@pytest.fixture(params=["tmpfs", "file size limit"])
def small_disk(request, tmp_path):
    """make(size) -> (a folder that holds `size` bytes, the OSError a write past them meets): a
    tmpfs of that size where the test may mount one (as root); else a limit on the size of
    every file this process writes (RLIMIT_FSIZE), past which a write fails as on a full disk,
    only with EFBIG. Either way the write really fails, inside torch.save too."""
    folder = tmp_path / "small"
    folder.mkdir()
    undo = []

    def make(size):
        if request.param == "tmpfs":
            mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                      str(folder)], capture_output=True, text=True)
            if mounted.returncode:
                pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): the file "
                            f"size limit stands in for a full disk")
            # lazily: a run that stopped with an error may keep its log open until collected
            undo.append(lambda: subprocess.run(["umount", "--lazy", str(folder)], check=True))
            return folder, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, limits[1]))
        undo.append(lambda: (resource.setrlimit(resource.RLIMIT_FSIZE, limits),
                             signal.signal(signal.SIGXFSZ, handler)))
        return folder, OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    yield make
    for step in reversed(undo):
        step()


def test_a_disk_that_fills_with_a_checkpoint_stops_the_run_in_one_line(small_disk):
    """The log fits, the checkpoint does not: torch.save's error (a RuntimeError, raised as the
    disk's OSError unwinds) ends the run like any failed write, with no partial file left."""
    folder, error = small_disk(300_000)
    with pytest.raises(UserError) as stopped:
        main(TINY + ["--num_iterations=2", "--val_every=0", "--checkpoint_every=1",
                     f"--log_dir={folder}"])
    (run,) = [path for path in folder.iterdir() if path.is_dir()]
    assert str(stopped.value) == (
        f"cannot write the checkpoint {run}/state_step000001.pt ({error.strerror}); free space or "
        f"change --log_dir; no checkpoint was written (--checkpoint_every=K writes one every K "
        f"steps)")
    assert not list(run.iterdir())  # no .partial
    lines = (folder / f"{run.name}.txt").read_text().splitlines()
    assert lines[-2].startswith("step:1/2 train_time:") and lines[-1] == str(stopped.value)


def test_a_disk_that_fills_with_the_logs_header_stops_the_run_in_one_line(small_disk):
    """The script's source alone is more than the disk holds: the run stops before it trains,
    and leaves no log."""
    folder, error = small_disk(40_000)
    with pytest.raises(UserError, match=rf"^cannot write the log {folder}/[0-9a-f-]{{36}}\.txt "
                       rf"\({error.strerror}\); free space or change --log_dir$"):
        main(TINY + [f"--log_dir={folder}"])
    assert not list(folder.iterdir())


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_log_that_cannot_be_written_stops_every_rank_after_the_same_step(nproc, tmp_path):
    """Its header written, the log takes 100 bytes more: step 0's line, not step 1's. Rank 0
    asks to stop as a Ctrl-C would, read a step late: all stop after step 4, each with rank 0's
    line, and the log ends with its last whole line."""
    command = [*launcher(nproc), WORKER, "logfull:100", str(tmp_path), *SIX,
               f"--log_dir={tmp_path}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    (log,) = tmp_path.glob("*-*.txt")  # not the worker's stopped_rank<r>.txt
    lines = log.read_text().splitlines()
    assert lines[-1].startswith("step:0/6 val_loss:10.8258 ")
    message = (f"step 4: cannot write the log {log} (File too large), so the run stops here; "
               f"free space or change --log_dir; no checkpoint was written (--checkpoint_every=K "
               f"writes one every K steps)")
    for rank in range(nproc):  # rank 0's line, on every rank
        assert (tmp_path / f"stopped_rank{rank}.txt").read_text() == message
    assert result.stdout.splitlines()[-1] == message  # printed, as the log cannot take it


def test_a_log_that_fails_in_the_last_step_ends_every_rank_with_rank_0s_error(tmp_path):
    """One step, validated at its end alone: the log takes the step's line, not its validation's,
    and no stop is read after the last step. The run ends, every rank with rank 0's error."""
    result = torchrun("logfull:100", tmp_path, SIX + ["--num_iterations=1", "--val_every=0"],
                      timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    (log,) = tmp_path.glob("*-*.txt")
    assert log.read_text().splitlines()[-1].startswith("step:1/1 train_time:")
    for rank in (0, 1):
        assert (tmp_path / f"stopped_rank{rank}.txt").read_text() == (
            f"cannot write the log {log} (File too large): it lacks the lines printed after "
            f"that; free space or change --log_dir")


def test_a_checkpoint_keeps_its_steps_train_time_and_a_resumed_run_goes_on_with_it(tmp_path,
                                                                                   monkeypatch):
    """A stand-in clock that moves 1 s in each step's forward and backward, and nowhere else:
    step s ends at s x 1000 ms. The checkpoint after step 3 holds 3000 ms, as its line says, and
    the run resumed from it logs the times of the run that went straight on."""
    seconds, forward_backward = [0.0], train_gpt.forward_backward

    def one_second(*args):
        seconds[0] += 1
        return forward_backward(*args)
    monkeypatch.setattr(train_gpt, "forward_backward", one_second)
    monkeypatch.setattr(time, "perf_counter", lambda: seconds[0])
    main(SIX + [f"--log_dir={tmp_path}", "--checkpoint_every=3"])
    saved = torch.load(checkpoint(tmp_path, 3), weights_only=True)
    assert saved["train_time_ms"] == 3000.0
    straight = (tmp_path / f"{saved['run_id']}.txt").read_text()
    assert re.search(r"^step:3/6 train_time:3000ms step_avg:1000.00ms ", straight, re.MULTILINE)
    resumed = tmp_path / "resumed"
    main(SIX + [f"--log_dir={resumed}", f"--resume={checkpoint(tmp_path, 3)}"])
    times = r"^(step:\d/6 .*train_time:\d+ms step_avg:[\d.]+ms)"
    assert re.findall(times, next(resumed.glob("*.txt")).read_text(), re.MULTILINE) == \
        re.findall(times, straight, re.MULTILINE)[-5:]  # steps 4 to 6, and the val lines


# What a resumed run may change: none of them changes the batches or the math
MAY_CHANGE = {"val_files", "val_tokens", "val_every", "compile_steps", "log_dir",
              "checkpoint_every", "save_checkpoint", "resume", "kernels"}


def another_value(value):
    """A value of the type of `value` that differs from it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, tuple):
        return (*value, 1)
    return value + ("x" if isinstance(value, str) else 1)


def test_a_resume_refuses_every_other_field_changed(tmp_path):
    """Each field but those that may change, changed alone, is refused by name."""
    args = train_gpt.parse_args(SIX)
    saved = dict(hyperparameters=dataclasses.asdict(args), world_size=1)
    torch.save(saved, tmp_path / "state.pt")
    assert train_gpt.MAY_CHANGE_ON_RESUME == MAY_CHANGE
    for field in dataclasses.fields(train_gpt.Hyperparameters):
        changed = dataclasses.replace(args, **{field.name: another_value(getattr(args,
                                                                                 field.name))})
        if field.name in MAY_CHANGE:
            assert train_gpt.load_checkpoint(str(tmp_path / "state.pt"), changed, 1) == saved
        else:
            with pytest.raises(UserError, match=rf"different configuration: {field.name} "
                                                r"\(checkpoint "):
                train_gpt.load_checkpoint(str(tmp_path / "state.pt"), changed, 1)
    with pytest.raises(UserError, match=r"configuration: world_size \(checkpoint 1, now 2\)\."):
        train_gpt.load_checkpoint(str(tmp_path / "state.pt"), args, 2)


def test_a_signal_to_one_rank_in_the_compile_steps_stops_every_rank(tmp_path):
    """Rank 1 alone has SIGTERM in compile step 2 of 3; both ranks read it after that step."""
    result = torchrun("sigterm:2", tmp_path, SIX + ["--compile_steps=3"], timeout=120)
    assert result.returncode != 0
    message = ("interrupted in the compile steps, before training began (its run id stays "
               "free); no checkpoint was written (--checkpoint_every=K writes one every K steps)")
    assert result.stderr.count(message) == 2, result.stderr[-3000:]  # each rank's exit message
    (log,) = tmp_path.glob("*-*.txt")
    assert log.read_text().splitlines()[-1] == message


def test_ctrl_c_in_the_compile_steps_of_a_resumed_run_names_its_checkpoint(straight, tmp_path):
    result = run_worker("sigint:2", tmp_path, SIX + [f"--resume={checkpoint(straight, 3)}",
                                                     "--compile_steps=3"])
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == (
        f"interrupted in the compile steps, before training began (its run id stays free); "
        f"continue with --resume={checkpoint(straight, 3)}")


def test_a_resume_under_other_code_says_so_with_each_codes_digest(straight, tmp_path):
    """A fix mid-run is allowed; the log names the code on each side, as sha256sum gives it."""
    digest = subprocess.run(["sha256sum", train_gpt.__file__], capture_output=True, text=True,
                            check=True).stdout[:12]
    state = torch.load(checkpoint(straight, 3), weights_only=True)
    assert state["code"] == digest
    main(SIX + [f"--log_dir={tmp_path / 'same'}", f"--resume={checkpoint(straight, 3)}"])
    assert "\nthe checkpoint's run ran other code" not in next(
        (tmp_path / "same").glob("*.txt")).read_text()
    state["code"] = "0123456789ab"
    torch.save(state, tmp_path / "edited.pt")
    main(SIX + [f"--log_dir={tmp_path / 'other'}", f"--resume={tmp_path / 'edited.pt'}"])
    lines = next((tmp_path / "other").glob("*.txt")).read_text().splitlines()
    at = lines.index(next(line for line in lines if line.startswith("resuming from ")))
    assert lines[at + 1] == (f"the checkpoint's run ran other code: its script's SHA-256 begins "
                             f"0123456789ab, this one's {digest}")


def test_a_resume_from_the_log_folder_names_the_run_folders_in_it(straight, tmp_path):
    """Checkpoints are kept in <log_dir>/<run id>/: given <log_dir>, the script names those."""
    older = tmp_path / "older"
    older.mkdir()
    (older / "state_step000002.pt").write_bytes(b"")
    os.utime(older / "state_step000002.pt", (0, 0))  # 1970: older than the straight run's
    (tmp_path / "notes").mkdir()  # holds no checkpoint: not named
    runs = checkpoint(straight, 6).parent
    os.symlink(runs, tmp_path / "straight")
    with pytest.raises(UserError) as refused:
        main(SIX + [f"--log_dir={tmp_path / 'logs'}", f"--resume={tmp_path}"])
    assert str(refused.value) == (
        f"--resume={tmp_path}: the folder holds no checkpoint (state_step*.pt); a run keeps its "
        f"checkpoints in <log_dir>/<run id>/; here, the newest first: "
        f"--resume={tmp_path / 'straight'}, --resume={older}")
