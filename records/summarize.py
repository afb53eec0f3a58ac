"""Summarize the runs of each record folder: is the 3.28 target met?

    python records/summarize.py                 # every folder under records/
    python records/summarize.py records/FOLDER  # some folders

For each folder it reads the log files (*.txt, as train_gpt.py writes them) and prints the number
of runs, the mean and standard deviation of the final validation loss, the p-value of a
one-sided one-sample t-test of "mean < 3.28", the mean training time and the mean time per step.
Compare the time per step with other scripts' records: the 2025-01-04 record's clock left out its
first 10 steps (148.08 ms = 204,345 ms / 1,380 steps), train_gpt.py's counts all of them. A
result claims the target only with p < 0.01. Needs only numpy and the standard library.
"""
import math
import re
import sys
from pathlib import Path

import numpy as np

TARGET = 3.28
VAL_LINE = re.compile(r"^step:(\d+)/(\d+) val_loss:([\d.]+) train_time:(\d+)ms")


def final_result(path):
    """(final val loss, train time in ms, steps) of a finished run's log, or None if it did not
    finish."""
    result = None
    for line in Path(path).read_text(errors="replace").splitlines():
        match = VAL_LINE.match(line)
        if match and match[1] == match[2]:
            result = float(match[3]), float(match[4]), int(match[2])
    return result


def incomplete_beta(a, b, x):
    """The regularized incomplete beta function I_x(a, b), from its continued fraction."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    if x > (a + 1) / (a + b + 2):  # the fraction converges quickly only on this side
        return 1 - incomplete_beta(b, a, 1 - x)

    def clamp(v):  # keeps the modified Lentz recurrence away from division by zero
        return v if abs(v) > 1e-300 else 1e-300

    c, d = 1.0, 1 / clamp(1 - (a + b) * x / (a + 1))
    fraction = d
    for m in range(1, 300):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for coefficient in (even, odd):
            d = 1 / clamp(1 + coefficient * d)
            c = clamp(1 + coefficient / c)
            fraction *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    return math.exp(log_front) * fraction / a


def student_t_cdf(t, dof):
    """P(T <= t) for Student's t distribution with `dof` degrees of freedom."""
    tail = 0.5 * incomplete_beta(dof / 2, 0.5, dof / (dof + t * t))
    return tail if t < 0 else 1 - tail


def summarize(folder):
    """Per-folder numbers as a dict, or None when the folder holds no finished run."""
    results = [r for r in map(final_result, sorted(Path(folder).glob("*.txt"))) if r]
    if not results:
        return None
    losses = np.array([loss for loss, _, _ in results])
    summary = dict(folder=str(folder), runs=len(losses), mean=losses.mean(),
                   std=losses.std(ddof=1) if len(losses) > 1 else float("nan"),
                   p=float("nan"), time_s=np.mean([ms for _, ms, _ in results]) / 1e3,
                   step_ms=np.mean([ms / steps for _, ms, steps in results]))
    if len(losses) > 1 and summary["std"] > 0:
        t = (summary["mean"] - TARGET) / (summary["std"] / math.sqrt(len(losses)))
        summary["p"] = student_t_cdf(t, len(losses) - 1)
    return summary


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    root = Path(__file__).resolve().parent
    folders = [Path(a) for a in argv] or sorted(p for p in root.iterdir() if p.is_dir())
    print(f"{'folder':<40} {'runs':>4} {'mean val':>9} {'std':>7} {'p(<3.28)':>9} "
          f"{'train time':>11} {'per step':>9}  target")
    for folder in folders:
        s = summarize(folder)
        if s is None:
            print(f"{folder.name:<40} no finished runs")
            continue
        verdict = "met" if s["p"] < 0.01 else "not shown"
        print(f"{Path(s['folder']).name:<40} {s['runs']:>4} {s['mean']:>9.4f} {s['std']:>7.4f} "
              f"{s['p']:>9.2g} {s['time_s']:>10.1f}s {s['step_ms']:>7.1f}ms  {verdict}")


if __name__ == "__main__":
    main()
