"""records/summarize.py: the t-test against closed forms and tables, the per-folder summary, its
configurations of alike runs, the reference data, and the plot, read back pixel by pixel."""
import math
import re
import sys
from pathlib import Path

import matplotlib.colors
import matplotlib.image
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "records"))
from summarize import (COLOURS, HERE, code, final_result, hyperparameters,  # noqa: E402
                       load_reference, main, p_below_target, plot, summarize, val_curve)


def losses_with_t(t, n):
    """n losses whose one-sample t statistic against 3.28 is t."""
    spread = np.linspace(-1e-3, 1e-3, n)
    return 3.28 + spread + t * spread.std(ddof=1) / math.sqrt(n)


@pytest.mark.parametrize("t", [-30, -3.1, -1.0, -0.2, 0.5, 2.7])
def test_p_value_matches_closed_forms(t):
    """Student's t CDF in closed form for 1 and 2 degrees of freedom."""
    assert p_below_target(losses_with_t(t, 2)) == pytest.approx(0.5 + math.atan(t) / math.pi,
                                                                abs=1e-9)
    assert p_below_target(losses_with_t(t, 3)) == pytest.approx(
        0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-9)


@pytest.mark.parametrize("t, dof, p", [  # one-sided critical values from published t tables
    (-2.015, 5, 0.05), (-3.365, 5, 0.01), (-2.764, 10, 0.01), (-1.729, 19, 0.05),
    (-2.374, 79, 0.01)])
def test_p_value_matches_tables(t, dof, p):
    assert p_below_target(losses_with_t(t, dof + 1)) == pytest.approx(p, abs=2e-4)


def test_no_p_value_without_a_spread():
    assert math.isnan(p_below_target([3.27])) and math.isnan(p_below_target([3.27, 3.27]))


def write_log(folder, name, final_loss, train_ms, steps=1390, code=None):
    """A record-format log: step lines, no hyperparameters line; `code` above a line of 100 "="
    where given (as the record's own logs have it), else a line of code alone."""
    lines = [f"step:0/{steps} val_loss:10.8258 train_time:0ms step_avg:0.00ms",
             f"step:{steps}/{steps} train_time:{train_ms}ms step_avg:1.00ms train_loss:3.3",
             f"step:{steps}/{steps} val_loss:{final_loss:.4f} train_time:{train_ms}ms "
             f"step_avg:1.00ms", "peak memory consumption: 31563 MiB"]
    folder.mkdir(exist_ok=True)
    head = "print('source code of the run')\n" if code is None else code + "=" * 100 + "\n"
    (folder / name).write_text(head + "\n".join(lines) + "\n")


# train_gpt.py's smoke preset as its log gives the hyperparameters (a dict's repr)
SMOKE = dict(train_files="data/shakespeare/shakespeare_train_*.bin",
             val_files="data/shakespeare/shakespeare_val_*.bin", val_tokens=8192, batch_size=1024,
             micro_batch_size=512, vocab_size=50257, num_layers=4, num_heads=2, model_dim=128,
             no_attention_layers=(), softcap=15.0, num_iterations=150, cooldown_frac=0.4,
             embed_lr=0.6, head_lr=0.008, scalar_lr=0.04, muon_lr=0.05, val_every=50,
             compile_steps=0, seed=0, log_dir="logs", checkpoint_every=0, save_checkpoint=False,
             resume="", kernels=True)
SCRIPT = "import torch\nprint('the training script')\n"


def log_header(code=SCRIPT, **changes):
    """The top of a log as train_gpt.py writes it: the script's code, the line of 100 "=", then
    the header with the hyperparameters, the smoke preset's but for `changes`."""
    return (f"{code}{'=' * 100}\nPython 3.11.7, PyTorch 2.11.0+cu130, CUDA none (CPU run)\n"
            f"hyperparameters: {dict(SMOKE, **changes)}\n"
            f"world size 1: 2 sequence(s) of 512 tokens per rank per step\n")


def write_run(folder, name, final_loss, train_ms, code=SCRIPT, **changes):
    """A finished run's log as train_gpt.py writes it, of num_iterations steps (the preset's 150
    unless changed)."""
    steps = changes.get("num_iterations", SMOKE["num_iterations"])
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(
        log_header(code, **changes) + f"step:0/{steps} val_loss:10.8258 train_time:0ms "
        f"step_avg:0.00ms\nstep:{steps}/{steps} train_time:{train_ms}ms step_avg:1.00ms "
        f"train_loss:3.3\nstep:{steps}/{steps} val_loss:{final_loss:.4f} train_time:{train_ms}ms "
        f"step_avg:1.00ms\npeak memory consumption: 1503 MiB\n")


def test_summary_of_a_folder(tmp_path, capsys):
    for i, loss in enumerate([3.2780, 3.2790, 3.2770, 3.2785]):
        write_log(tmp_path, f"run{i}.txt", loss, 200_000 + 1000 * i)
    (tmp_path / "unfinished.txt").write_text("step:0/1390 val_loss:10.8258 train_time:0ms\n")
    s = summarize(tmp_path)
    # by hand: mean 3.278125, deviations (-.125, .875, -1.125, .375)e-3, sum of squares
    # 2.1875e-6, sample std sqrt(2.1875e-6 / 3) = 8.539e-4, t = -1.875e-3 / 4.2696e-4 = -4.3915;
    # t(3) in closed form: F(t) = 1/2 + (1/pi) (atan(t/sqrt3) + sqrt3 t / (3 + t^2))
    assert s["runs"] == 4 and s["mean"] == pytest.approx(3.278125)
    assert s["std"] == pytest.approx(math.sqrt(2.1875e-6 / 3))
    t = -4.3915
    assert s["p"] == pytest.approx(0.5 + (math.atan(t / math.sqrt(3)) + math.sqrt(3) * t / (
        3 + t * t)) / math.pi, rel=1e-3)
    assert 0.01 < s["p"] < 0.025  # t(3): 3.182 < 4.39 < 4.541
    assert s["time_s"] == pytest.approx(201.5)
    assert s["step_ms"] == pytest.approx(201_500 / 1390)
    assert s["unfinished"] == ["unfinished.txt"]
    main([str(tmp_path)])
    assert "not shown" in capsys.readouterr().out  # p >= 0.01: no claim


def test_runs_that_did_not_finish_are_named_and_left_out(tmp_path, capsys):
    """A run stopped by a NaN (validations, but not the last) and one killed while compiling
    (the header alone) are counted and named; a text file that is no run log is not a run."""
    write_log(tmp_path / "a", "done1.txt", 3.2700, 200_000)
    write_log(tmp_path / "a", "done2.txt", 3.2800, 202_000)
    (tmp_path / "a" / "nan.txt").write_text("step:0/1390 val_loss:10.8258 train_time:0ms\n"
                                            "step:125/1390 val_loss:4.3700 train_time:1ms\n"
                                            "step:300/1390 the training loss is nan\n")
    (tmp_path / "a" / "killed.txt").write_text("print('source')\nhyperparameters: {'seed': 0}\n")
    (tmp_path / "a" / "test_output.txt").write_text("12 passed in 3.2s\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "nan.txt").write_text("step:0/1390 val_loss:10.8258 train_time:0ms\n")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("not a run\n")
    s = summarize(tmp_path / "a")
    assert (s["runs"], s["unfinished"]) == (2, ["killed.txt", "nan.txt"])
    assert s["mean"] == pytest.approx(3.275) and s["time_s"] == pytest.approx(201)
    assert summarize(tmp_path / "c") is None
    main([str(tmp_path / name) for name in "abc"])
    out = capsys.readouterr().out
    assert out.startswith("Over the finished runs of each folder; logs of runs that did not "
                          "finish are named below it and left out.\n")
    lines = out.splitlines()
    a = lines.index(next(line for line in lines if line.startswith("a ")))
    assert re.fullmatch(r"a +2 +3\.2750 +0\.0071 +\S+ +201\.0s +144\.60ms  not shown", lines[a])
    assert lines[a + 1] == "  2 of 4 runs did not finish, left out: killed.txt, nan.txt"
    assert re.fullmatch(r"b +0  no finished runs", lines[a + 2])
    assert lines[a + 3] == "  1 of 1 runs did not finish, left out: nan.txt"
    assert re.fullmatch(r"c +no run logs", lines[a + 4])


def test_a_stopped_run_that_another_log_continues_counts_once(tmp_path, capsys):
    """A new run with --resume logs the run it continues; a restart by torchrun, its own."""
    (tmp_path / "first.txt").write_text("hyperparameters: {}\n"
                                        "step:0/1390 val_loss:10.8258 train_time:0ms\n")
    write_log(tmp_path, "second.txt", 3.2790, 204_000)
    with open(tmp_path / "second.txt", "a") as f:
        f.write("resuming from logs/first/state_step000700.pt: step 700 of run first\n")
    write_log(tmp_path, "restarted.txt", 3.2770, 205_000)
    with open(tmp_path / "restarted.txt", "a") as f:
        f.write("resuming from logs/restarted/state_step000700.pt: step 700 of run restarted\n")
    s = summarize(tmp_path)
    assert (s["runs"], s["unfinished"], s["continued"]) == (2, [], {"first.txt": "second.txt"})
    main([str(tmp_path)])
    assert "  first.txt stopped, and second.txt continues it\n" in capsys.readouterr().out


def test_only_the_final_validation_counts(tmp_path):
    write_log(tmp_path, "a.txt", 3.2791, 204_345)
    assert final_result(tmp_path / "a.txt") == (3.2791, 204345.0, 1390)
    (tmp_path / "b.txt").write_text("step:125/1390 val_loss:4.3700 train_time:1ms step_avg:1ms\n")
    assert final_result(tmp_path / "b.txt") is None
    assert val_curve(tmp_path / "b.txt") == dict(step=[125], train_time_ms=[1.0],
                                                 val_loss=[4.37], steps=1390)


def test_the_reference_is_the_record_log(capsys):
    """The figures of the 2025-01-04 record, kept as data beside the tool."""
    ref = load_reference()
    assert (ref["runs"], ref["mean"], ref["std"], ref["timed_steps"]) == (80, 3.2791, 0.0019, 1380)
    assert ref["step"] == [0, *range(125, 1376, 125), 1390]
    assert len(ref["train_time_ms"]) == len(ref["val_loss"]) == 13
    assert (ref["train_time_ms"][-1], ref["val_loss"][0], ref["val_loss"][-1]) == (
        204345, 10.8258, 3.2785)
    assert np.all(np.diff(ref["train_time_ms"]) > 0) and np.all(np.diff(ref["val_loss"]) < 0)
    main([])  # its time per step: 204,345 ms over the 1,380 steps its clock saw
    assert re.search(r"^2025-01-04 record \(its log\) +80 +3\.2791 +0\.0019 +204\.3s +148\.08ms$",
                     capsys.readouterr().out, re.MULTILINE)


def colour_near(image, rgb, x, y, radius=2):
    """Whether a pixel within `radius` of display point (x, y) has colour `rgb`."""
    height = image.shape[0]
    row, col = int(round(height - y)), int(round(x))
    patch = image[row - radius:row + radius + 1, col - radius:col + radius + 1, :3]
    return bool((np.abs(patch - rgb).max(axis=-1) < 0.02).any())


def test_the_plot_draws_each_folder_in_its_colour(tmp_path):
    """Each folder's val points lie where the axes put them, in the folder's colour, on both
    panels; the reference's in black; and no other folder's colour appears."""
    a, b, empty = tmp_path / "a", tmp_path / "b", tmp_path / "empty"
    write_log(a, "run.txt", 3.40, 90_000, steps=600)
    write_log(b, "run1.txt", 3.90, 30_000, steps=300)
    write_log(b, "run2.txt", 4.10, 40_000, steps=300)
    empty.mkdir()
    reference = load_reference()
    fig = plot([a, empty, b], tmp_path / "curves.png", reference)
    image = matplotlib.image.imread(tmp_path / "curves.png")
    assert image.shape[:2] == (500, 1200)
    time_axes, step_axes = fig.axes
    assert COLOURS[:3] == ["C0", "C1", "C2"]
    expected = [(matplotlib.colors.to_rgb("C0"), [(600, 3.40, 90)]),  # step 0: under the rest
                (matplotlib.colors.to_rgb("C1"), [(300, 3.90, 30), (300, 4.10, 40)]),
                ((0, 0, 0), list(zip(reference["step"], reference["val_loss"],
                                     np.array(reference["train_time_ms"]) / 1e3)))]
    for rgb, points in expected:
        for step, loss, seconds in points:
            assert colour_near(image, rgb, *time_axes.transData.transform((seconds, loss))), (
                rgb, seconds, loss)
            assert colour_near(image, rgb, *step_axes.transData.transform((step, loss))), (
                rgb, step, loss)
    # a third colour would mean a colour for the empty folder or one per log
    c2 = np.abs(image[..., :3] - matplotlib.colors.to_rgb("C2")).max(axis=-1) < 0.02
    assert not c2.any()
    target = time_axes.transData.transform((150, 3.28))
    assert colour_near(image, matplotlib.colors.to_rgb("0.5"), *target, radius=6)


def test_many_folders_keep_apart(tmp_path):
    """Past the nine colours the lines turn dashed: no two folders share a style, and none takes
    the target's grey."""
    folders = [tmp_path / f"f{i:02d}" for i in range(12)]
    for i, folder in enumerate(folders):
        write_log(folder, "run.txt", 3.3 + 0.01 * i, 1000 * (i + 1), steps=10)
    fig = plot(folders, tmp_path / "curves.png", load_reference())
    styles = [(line.get_color(), line.get_linestyle()) for line in fig.axes[0].get_lines()[:12]]
    assert len(set(styles)) == 12 and ("C0", "--") in styles
    grey = matplotlib.colors.to_rgb("0.5")
    assert all(np.abs(np.subtract(matplotlib.colors.to_rgb(c), grey)).max() > 0.1
               for c, _ in styles)
    legend = fig.legends[0].get_window_extent()
    assert all(legend.y1 <= ax.get_tightbbox().y0 + 1 for ax in fig.axes)  # below the axes


def test_a_folder_is_found_by_its_listed_name_and_a_bad_one_refused(tmp_path, monkeypatch,
                                                                    capsys):
    """The listing names the folders under records/; those names work from any folder."""
    monkeypatch.chdir(tmp_path)
    main(["smoke_cpu"])
    assert re.search(r"^smoke_cpu +1 +5\.\d{4} ", capsys.readouterr().out, re.MULTILINE)
    with pytest.raises(SystemExit) as stopped:
        main(["smoke_cpu", "nothere"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.endswith(
        f"error: nothere: no such folder, here or under {HERE}\n")


def test_runs_of_different_lengths_are_not_averaged_together(tmp_path, capsys):
    """Record-format logs have their planned steps alone to compare by."""
    write_log(tmp_path, "short.txt", 6.2, 1_000, steps=10)
    write_log(tmp_path, "long.txt", 5.5, 70_000, steps=150)
    s = summarize(tmp_path)
    assert s["runs"] == 2 and math.isnan(s["mean"]) and math.isnan(s["time_s"])
    main([str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    at = lines.index(f"{tmp_path.name:<40}    2  finished runs of 2 configurations, not averaged "
                     f"together:")
    assert lines[at + 1:at + 4] == [  # by hand: 70 s / 150 steps, 1 s / 10 steps
        "  config 1                                  1    5.5000     nan       nan       70.0s "
        " 466.67ms  not shown",
        "  config 2                                  1    6.2000     nan       nan        1.0s "
        " 100.00ms  not shown",
        "  config 2 differs from config 1 in the planned steps 150 -> 10: short.txt"]


def test_runs_of_other_configurations_are_not_averaged_together(tmp_path, capsys):
    """Runs of 4 layers, of 8 layers and of other code (an extra loss term): each configuration
    has its own figures, and the line that names its logs says how it differs. Runs that differ
    in their seed, where their files go, what runs off the clock and the data's folder are
    alike."""
    write_run(tmp_path, "4layers_1.txt", 3.2770, 60_000)
    write_run(tmp_path, "4layers_2.txt", 3.2790, 61_000, seed=1, log_dir="logs/b",
              checkpoint_every=50, save_checkpoint=True, resume="logs/b/state_step000050.pt",
              val_every=0, compile_steps=10,
              train_files="/scratch/shakespeare/shakespeare_train_*.bin")
    write_run(tmp_path, "8layers_1.txt", 3.2850, 90_000, num_layers=8)
    write_run(tmp_path, "8layers_2.txt", 3.2810, 93_000, num_layers=8, seed=1)
    write_run(tmp_path, "extra_loss.txt", 3.2700, 75_000,
              code=SCRIPT + "loss = loss + 1e-4 * z_loss\n")
    (tmp_path / "killed.txt").write_text(log_header())  # killed while it compiled
    s = summarize(tmp_path)
    # by hand: 4 layers: mean 3.278, std sqrt(2e-6) = 1.4142e-3, t = -0.002 / 1e-3 = -2, with 1
    # degree of freedom p = 1/2 + atan(-2) / pi = 0.1476; 60.5 s; (400 + 406.67) / 2 ms a step.
    # 8 layers: mean 3.283, std 2.8284e-3, t = 0.003 / 2e-3 = 1.5, p = 1/2 + atan(1.5) / pi =
    # 0.8128; 91.5 s; 610 ms. The extra loss: one run, 3.27, 75 s, 500 ms.
    assert (s["runs"], s["unfinished"]) == (5, ["killed.txt"])
    assert math.isnan(s["mean"]) and math.isnan(s["p"])  # over all five: not computed
    one, two, three = s["configurations"]
    assert (one["logs"], one["differs"]) == (["4layers_1.txt", "4layers_2.txt"], [])
    assert (one["mean"], one["std"]) == (pytest.approx(3.278), pytest.approx(math.sqrt(2e-6)))
    assert one["p"] == pytest.approx(0.5 + math.atan(-2) / math.pi, abs=1e-9)
    assert (one["time_s"], one["step_ms"]) == (60.5, pytest.approx(60_500 / 150))
    assert (two["logs"], two["differs"]) == (["8layers_1.txt", "8layers_2.txt"],
                                             ["num_layers 4 -> 8"])
    assert (two["mean"], two["std"]) == (pytest.approx(3.283), pytest.approx(math.sqrt(8e-6)))
    assert two["p"] == pytest.approx(0.5 + math.atan(1.5) / math.pi, abs=1e-9)
    assert (two["time_s"], two["step_ms"]) == (91.5, pytest.approx(610))
    assert (three["logs"], three["differs"], three["mean"]) == (["extra_loss.txt"], ["the code"],
                                                                3.27)
    assert math.isnan(three["std"]) and math.isnan(three["p"])
    assert (three["time_s"], three["step_ms"]) == (75, pytest.approx(500))
    main([str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    at = lines.index(f"{tmp_path.name:<40}    5  finished runs of 3 configurations, not averaged "
                     f"together:")
    assert lines[at + 1:at + 7] == [
        "  config 1                                  2    3.2780  0.0014      0.15       60.5s "
        " 403.33ms  not shown",
        "  config 2                                  2    3.2830  0.0028      0.81       91.5s "
        " 610.00ms  not shown",
        "  config 3                                  1    3.2700     nan       nan       75.0s "
        " 500.00ms  not shown",
        "  config 2 differs from config 1 in num_layers 4 -> 8: 8layers_1.txt, 8layers_2.txt",
        "  config 3 differs from config 1 in the code: extra_loss.txt",
        "  1 of 6 runs did not finish, left out: killed.txt"]


def test_logs_without_hyperparameters_or_code_compare_by_what_they_have(tmp_path, capsys):
    """A record-format log with the code and one with its step lines alone join the first
    configuration they are alike with as far as they go; one of other planned steps, none."""
    write_run(tmp_path, "full.txt", 3.2770, 60_000)
    write_run(tmp_path, "wide.txt", 3.2850, 90_000, model_dim=256, kernels=False)
    write_log(tmp_path, "copied.txt", 3.2790, 61_000, steps=150, code=SCRIPT)
    write_log(tmp_path, "record.txt", 3.2810, 62_000, steps=150)
    write_log(tmp_path, "short.txt", 3.3000, 2_000, steps=10)
    write_log(tmp_path, "other_code.txt", 3.2900, 60_000, steps=150, code="print('another')\n")
    s = summarize(tmp_path)
    # by hand: mean 3.279, std 0.002, t = -0.001 / (0.002 / sqrt 3) = -0.8660, with 2 degrees of
    # freedom p = 1/2 + t / (2 sqrt(2 + t^2)) = 0.2389
    assert [(c["logs"], c["differs"]) for c in s["configurations"]] == [
        (["copied.txt", "full.txt", "record.txt"], []),
        (["wide.txt"], ["model_dim 128 -> 256", "kernels True -> False"]),
        (["other_code.txt"], ["the code"]),
        (["short.txt"], ["the planned steps 150 -> 10"])]
    first = s["configurations"][0]
    assert (first["mean"], first["std"], first["time_s"]) == (
        pytest.approx(3.279), pytest.approx(0.002), pytest.approx(61))
    t = -0.001 / (0.002 / math.sqrt(3))
    assert first["p"] == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-9)
    main([str(tmp_path)])
    out = capsys.readouterr().out
    assert ("\n  config 2 differs from config 1 in model_dim 128 -> 256 and kernels True -> "
            "False: wide.txt\n") in out
    assert "\n  config 1                                  3    3.2790  0.0020      0.24 " in out


def test_a_hyperparameter_that_one_log_lacks_is_said_not_logged(tmp_path):
    """A log of an older script, without a field that the newer one logs (and with one it
    dropped), differs in both."""
    write_run(tmp_path, "new.txt", 3.2770, 60_000)
    write_run(tmp_path, "new2.txt", 3.2780, 60_000)
    text = log_header().replace("'kernels': True", "'warmup_steps': 0")
    write_run(tmp_path, "old.txt", 3.2790, 61_000)
    (tmp_path / "old.txt").write_text((tmp_path / "old.txt").read_text().replace(
        log_header(), text))
    assert summarize(tmp_path)["configurations"][1]["differs"] == [
        "kernels True -> not logged", "warmup_steps not logged -> 0"]


def test_the_hyperparameters_of_a_real_log_are_read_less_those_that_may_differ():
    """records/smoke_cpu's log, of an older train_gpt.py: its dict, tuples and all, as logged."""
    (log,) = (HERE / "smoke_cpu").glob("*.txt")
    text = log.read_text()
    logged = hyperparameters(text)
    assert logged["no_attention_layers"] == () and logged["model_dim"] == 128
    assert logged["warmup_steps"] == 0 and "kernels" not in logged
    assert not set(logged) & {"seed", "log_dir", "resume", "checkpoint_every", "save_checkpoint",
                              "val_every", "compile_steps"}
    assert logged["train_files"] == "shakespeare_train_*.bin"  # the name, not the folder
    assert code(text).startswith('"""') and "def main(" in code(text)


def test_other_data_and_lines_that_are_not_plain_data_set_runs_apart(tmp_path):
    """Shards of other names are other data. A hyperparameters line in the code at the top of a
    log is code, not the run's. A float that repr() writes as inf (a copy's own field, say) reads
    as one."""
    write_run(tmp_path, "a.txt", 3.2770, 60_000)
    write_run(tmp_path, "b.txt", 3.2780, 60_000, val_files="data/other/other_val_*.bin")
    write_run(tmp_path, "c.txt", 3.2790, 60_000, code=SCRIPT + "hyperparameters: {'x': 1}\n")
    write_run(tmp_path, "d.txt", 3.2800, 60_000)
    (tmp_path / "d.txt").write_text((tmp_path / "d.txt").read_text().replace(
        "'softcap': 15.0", "'softcap': inf"))
    assert hyperparameters((tmp_path / "c.txt").read_text()) == hyperparameters(
        (tmp_path / "a.txt").read_text())
    differs = {tuple(config["logs"]): config["differs"]
               for config in summarize(tmp_path)["configurations"][1:]}
    assert differs[("b.txt",)] == ["val_files 'shakespeare_val_*.bin' -> 'other_val_*.bin'"]
    assert differs[("c.txt",)] == ["the code"]
    assert differs[("d.txt",)] == ["softcap 15.0 -> inf"]


def test_a_restarted_run_that_did_not_finish_is_not_continued_by_itself(tmp_path, capsys):
    """torchrun restarted the workers of run R, which went on in their own log R.txt and logged
    the checkpoint they resumed from, one of run R; then R stopped again. R.txt is a run that
    did not finish, not one that a later log continues."""
    write_run(tmp_path, "done.txt", 3.2790, 204_000, num_iterations=1390)
    before = ("step:0/1390 val_loss:10.8258 train_time:0ms step_avg:0.00ms\n"
              "step:700/1390 val_loss:3.9000 train_time:100000ms step_avg:142.86ms\n")
    after = ("resuming from logs/R/state_step000700.pt: step 700 of run R\n"
             "step:750/1390 val_loss:3.8000 train_time:107000ms step_avg:142.67ms\n")
    header = log_header(num_iterations=1390, checkpoint_every=100)
    (tmp_path / "R.txt").write_text(header + before + header + after)  # the restart's header too
    s = summarize(tmp_path)
    assert (s["runs"], s["unfinished"], s["continued"]) == (1, ["R.txt"], {})
    main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "\n  1 of 2 runs did not finish, left out: R.txt\n" in out
    assert "continues it" not in out


def test_a_plot_of_a_format_matplotlib_cannot_write_is_refused_first(tmp_path, capsys):
    write_log(tmp_path, "run.txt", 3.3, 1000, steps=10)
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path), f"--plot={tmp_path}/curves.jpgx"])
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""  # before any log is read
    assert re.fullmatch(r"\S+: error: --plot=\S+/curves\.jpgx: matplotlib writes avif, .*png.*; "
                        r"end the name with one of them, e\.g\. curves\.png",
                        err.splitlines()[-1])


def test_a_plot_named_without_a_format_is_a_png(tmp_path):
    write_log(tmp_path, "run.txt", 3.3, 1000, steps=10)
    main([str(tmp_path), f"--plot={tmp_path}/curves"])
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")


def test_a_plot_that_cannot_be_saved_ends_in_one_line(tmp_path):
    write_log(tmp_path, "run.txt", 3.3, 1000, steps=10)
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path), f"--plot={tmp_path}/nofolder/curves.png"])
    assert stopped.value.code == (f"error: --plot={tmp_path}/nofolder/curves.png: No such file "
                                  f"or directory")
