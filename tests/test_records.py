"""records/summarize.py: the t-test against closed forms and tables, the per-folder summary, the
reference data, and the plot, read back pixel by pixel."""
import math
import re
import sys
from pathlib import Path

import matplotlib.colors
import matplotlib.image
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "records"))
from summarize import (COLOURS, HERE, final_result, load_reference, main,  # noqa: E402
                       p_below_target, plot, summarize, val_curve)


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


def write_log(folder, name, final_loss, train_ms, steps=1390):
    lines = [f"step:0/{steps} val_loss:10.8258 train_time:0ms step_avg:0.00ms",
             f"step:{steps}/{steps} train_time:{train_ms}ms step_avg:1.00ms train_loss:3.3",
             f"step:{steps}/{steps} val_loss:{final_loss:.4f} train_time:{train_ms}ms "
             f"step_avg:1.00ms", "peak memory consumption: 31563 MiB"]
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("print('source code of the run')\n" + "\n".join(lines) + "\n")


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


def test_runs_of_different_lengths_are_said_to_mix(tmp_path, capsys):
    write_log(tmp_path, "short.txt", 6.2, 1_000, steps=10)
    write_log(tmp_path, "long.txt", 5.5, 70_000, steps=150)
    main([str(tmp_path)])
    assert "\n  the finished runs planned 10 and 150 steps: the mean mixes configurations\n" in \
        capsys.readouterr().out


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
