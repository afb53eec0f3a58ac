"""records/summarize.py: the Student-t CDF and the per-folder summary."""
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "records"))
from summarize import final_result, main, student_t_cdf, summarize  # noqa: E402


@pytest.mark.parametrize("t", [-30, -3.1, -1.0, -0.2, 0.0, 0.5, 2.7])
def test_t_cdf_matches_closed_forms(t):
    assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


@pytest.mark.parametrize("t, dof, p", [  # one-sided critical values from published t tables
    (-2.015, 5, 0.05), (-3.365, 5, 0.01), (-2.764, 10, 0.01), (-1.729, 19, 0.05),
    (-2.374, 79, 0.01), (-1.960, 10**7, 0.025)])
def test_t_cdf_matches_tables(t, dof, p):
    assert student_t_cdf(t, dof) == pytest.approx(p, abs=2e-4)


def write_log(folder, name, final_loss, train_ms, steps=1390):
    lines = [f"step:0/{steps} val_loss:10.8258 train_time:0ms",
             f"step:{steps}/{steps} train_time:{train_ms}ms step_avg:1.00ms train_loss:3.3",
             f"step:{steps}/{steps} val_loss:{final_loss:.4f} train_time:{train_ms}ms "
             f"step_avg:1.00ms", "peak memory consumption: 31563 MiB"]
    (folder / name).write_text("print('source code of the run')\n" + "\n".join(lines) + "\n")


def test_summary_of_a_folder(tmp_path, capsys):
    for i, loss in enumerate([3.2780, 3.2790, 3.2770, 3.2785]):
        write_log(tmp_path, f"run{i}.txt", loss, 200_000 + 1000 * i)
    (tmp_path / "unfinished.txt").write_text("step:0/1390 val_loss:10.8258 train_time:0ms\n")
    s = summarize(tmp_path)
    # by hand: mean 3.278125, deviations (-.125, .875, -1.125, .375)e-3, sum of squares
    # 2.1875e-6, sample std sqrt(2.1875e-6 / 3) = 8.539e-4, t = -1.875e-3 / 4.2696e-4 = -4.391
    assert s["runs"] == 4 and s["mean"] == pytest.approx(3.278125)
    assert s["std"] == pytest.approx(math.sqrt(2.1875e-6 / 3))
    assert s["p"] == pytest.approx(student_t_cdf(-4.3915, 3), rel=1e-3)
    assert 0.01 < s["p"] < 0.025  # t(3): 3.182 < 4.39 < 4.541
    assert s["time_s"] == pytest.approx(201.5)
    assert s["step_ms"] == pytest.approx(201_500 / 1390)
    main([str(tmp_path)])
    assert "not shown" in capsys.readouterr().out  # p >= 0.01: no claim


def test_only_the_final_validation_counts(tmp_path):
    write_log(tmp_path, "a.txt", 3.2791, 204_345)
    assert final_result(tmp_path / "a.txt") == (3.2791, 204345.0, 1390)
    (tmp_path / "b.txt").write_text("step:125/1390 val_loss:4.3700 train_time:1ms step_avg:1ms\n")
    assert final_result(tmp_path / "b.txt") is None
