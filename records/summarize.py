"""Summarize the runs of each record folder (is the 3.28 target met?) and draw their loss curves.

    python records/summarize.py                          # every folder under records/
    python records/summarize.py FOLDER ...               # some (paths, or names under records/)
    python records/summarize.py --plot curves.png [...]  # and draw them

For each folder it reads the run logs in it (the *.txt files that train_gpt.py wrote; other text
files are not runs) and prints the number of finished runs, the mean and standard deviation of their
final validation loss, the p-value of a one-sided one-sample t-test of "mean < 3.28", the mean
training time and the mean time per step. A result claims the target only with p < 0.01. These
statistics cover the finished runs alone: a log without its final validation (a run that diverged,
crashed or was killed) is counted and named under its folder, and left out of them, which favours
the runs that survived. A stopped run that a later log continues (--resume, which logs the run it
continues) is named with that log, which counts it once; runs of different lengths in one folder are
said to mix configurations. The 2025-01-04 record's figures, from reference_2025-01-04.json beside
this file, come last, for comparison.

Compare the time per step with the record's: its clock left out its first 10 steps (148.08 ms =
204,345 ms / 1,380 steps), train_gpt.py's counts all of them.

--plot draws the val loss of every run, finished or not, against train time and against step,
one colour per folder, with the record's curve and the 3.28 line. Needs numpy, scipy and
matplotlib.
"""
import argparse
import json
import re
import sys
from pathlib import Path

import matplotlib
import matplotlib.backend_bases
import matplotlib.ticker
import numpy as np
from scipy import stats

matplotlib.use("Agg")  # draws to files; no display needed
import matplotlib.pyplot as plt  # noqa: E402 (after the backend is chosen)

TARGET = 3.28
HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "reference_2025-01-04.json"
# Matplotlib's ten colours but its grey, which is the target line's; then again, dashed.
COLOURS = [f"C{i}" for i in range(10) if i != 7]
VAL_LINE = re.compile(r"^step:(\d+)/(\d+) val_loss:([\d.]+) train_time:(\d+)ms", re.MULTILINE)
# A run's log has train_gpt.py's header line or the record format's step lines.
RUN_LINE = re.compile(r"^(hyperparameters: |step:\d+/\d+ )", re.MULTILINE)
RESUMED = re.compile(r"^resuming from \S+: step \d+ of run (\S+)$", re.MULTILINE)


def val_curve(path):
    """The validation points of a log: a dict of lists (step, train_time_ms, val_loss) and the
    run's planned steps, or None if the log has none."""
    points = VAL_LINE.findall(Path(path).read_text(errors="replace"))
    if not points:
        return None
    return dict(step=[int(p[0]) for p in points], train_time_ms=[float(p[3]) for p in points],
                val_loss=[float(p[2]) for p in points], steps=int(points[-1][1]))


def final_result(path):
    """(final val loss, train time in ms, steps) of a finished run's log, or None if it did not
    finish."""
    curve = val_curve(path)
    if curve is None or curve["step"][-1] != curve["steps"]:
        return None
    return curve["val_loss"][-1], curve["train_time_ms"][-1], curve["steps"]


def run_logs(folder):
    """The logs of runs in `folder`, finished or not (a test's output, say, is not one)."""
    return sorted(path for path in Path(folder).glob("*.txt")
                  if RUN_LINE.search(path.read_text(errors="replace")))


def p_below_target(losses):
    """The p-value of a one-sided t-test of "the mean of these losses is below 3.28"."""
    if len(losses) < 2 or np.std(losses) == 0:
        return float("nan")
    return float(stats.ttest_1samp(losses, TARGET, alternative="less").pvalue)


def summarize(folder):
    """Per-folder numbers as a dict: over the finished runs; the logs of runs that did not
    finish; and the logs of runs that did not finish but that a later log continues (with
    --resume, in a run of its own that names the one it continues); and the numbers of steps the
    finished runs planned (`lengths`). None when the folder holds no run log."""
    logs = run_logs(folder)
    if not logs:
        return None
    results = {path.name: final_result(path) for path in logs}
    continued = {f"{run_id}.txt": path.name for path in logs
                 for run_id in RESUMED.findall(path.read_text(errors="replace"))
                 if f"{run_id}.txt" != path.name}  # a restart by torchrun goes on in its own log
    stopped = [name for name, result in results.items() if result is None]
    finished = [result for result in results.values() if result]
    losses = np.array([loss for loss, _, _ in finished])
    nan = float("nan")
    return dict(folder=str(folder), runs=len(losses),
                unfinished=[name for name in stopped if name not in continued],
                continued={name: continued[name] for name in stopped if name in continued},
                mean=losses.mean() if finished else nan,
                std=losses.std(ddof=1) if len(losses) > 1 else nan,
                p=p_below_target(losses),
                lengths=sorted({steps for _, _, steps in finished}),
                time_s=np.mean([ms for _, ms, _ in finished]) / 1e3 if finished else nan,
                step_ms=np.mean([ms / steps for _, ms, steps in finished]) if finished else nan)


def load_reference(path=REFERENCE):
    return json.loads(Path(path).read_text())


def plot(folders, path, reference):
    """Draw the val loss of every run in `folders` against train time and against step, and
    save it as `path`: the folders that have runs in COLOURS, in order, the reference in black,
    the target as a grey dashed line."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True, layout="constrained")
    lines = dict(marker="o", markersize=4, linewidth=1.5)
    drawn = [(folder, curves) for folder in folders
             if (curves := [c for c in map(val_curve, run_logs(folder)) if c])]
    for i, (folder, curves) in enumerate(drawn):
        style = dict(color=COLOURS[i % len(COLOURS)],
                     linestyle=["-", "--", ":", "-."][i // len(COLOURS) % 4], **lines)
        for j, curve in enumerate(curves):
            label = (f"{Path(folder).name} ({len(curves)} run{'s' * (len(curves) > 1)})"
                     if j == 0 else None)
            axes[0].plot(np.array(curve["train_time_ms"]) / 1e3, curve["val_loss"], label=label,
                         **style)
            axes[1].plot(curve["step"], curve["val_loss"], **style)
    axes[0].plot(np.array(reference["train_time_ms"]) / 1e3, reference["val_loss"], color="black",
                 label=f"{reference['name']} (its clock from step 11)", **lines)
    axes[1].plot(reference["step"], reference["val_loss"], color="black", **lines)
    for ax, xlabel in zip(axes, ["train time (s)", "step"]):
        ax.axhline(TARGET, color="0.5", linestyle="--", linewidth=1, label="3.28" if ax is
                   axes[0] else None)
        ax.set(xlabel=xlabel, yscale="log", yticks=[3.28, 3.5, 4, 5, 6, 8, 10])
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(True, which="both", color="0.9")
    axes[0].set_ylabel("val loss")
    fig.legend(loc="outside lower center", ncol=3, frameon=False)  # the axes make room for it
    fig.savefig(path)
    return fig


def find_folder(folder, parser):
    """`folder` as given, or else the folder of that name under records/ (as the listing names
    them); a bad name is refused before anything is read."""
    for path in (folder, HERE / folder):
        if path.is_dir():
            return path
    parser.error(f"{folder}: no such folder, here or under {HERE}")


def check_plot_path(path, parser):
    """Refuse a --plot file of a format that matplotlib does not write, before the logs are
    read."""
    formats = matplotlib.backend_bases.FigureCanvasBase.get_supported_filetypes()
    if path.suffix and path.suffix.lstrip(".").lower() not in formats:  # none: a png
        parser.error(f"--plot={path}: matplotlib writes {', '.join(sorted(formats))}; end the "
                     f"name with one of them, e.g. curves.png")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="*", type=Path,
                        help="paths, or names of folders under records/ (default: all of those)")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="draw the curves to this file")
    args = parser.parse_args(argv)
    folders = [find_folder(folder, parser) for folder in args.folders] or sorted(
        p for p in HERE.iterdir() if p.is_dir())
    if args.plot:
        check_plot_path(args.plot, parser)
    reference = load_reference()
    print("Over the finished runs of each folder; logs of runs that did not finish are named "
          "below it and left out.")
    print(f"{'folder':<40} {'runs':>4} {'mean val':>9} {'std':>7} {'p(<3.28)':>9} "
          f"{'train time':>11} {'per step':>9}  target")
    for folder in folders:
        s = summarize(folder)
        if s is None:
            print(f"{folder.name:<40} no run logs")
            continue
        if s["runs"]:
            verdict = "met" if s["p"] < 0.01 else "not shown"
            print(f"{folder.name:<40} {s['runs']:>4} {s['mean']:>9.4f} {s['std']:>7.4f} "
                  f"{s['p']:>9.2g} {s['time_s']:>10.1f}s {s['step_ms']:>7.2f}ms  {verdict}")
        else:
            print(f"{folder.name:<40} {0:>4}  no finished runs")
        if len(s["lengths"]) > 1:
            print(f"  the finished runs planned {' and '.join(map(str, s['lengths']))} steps: "
                  f"the mean mixes configurations")
        if s["unfinished"]:
            print(f"  {len(s['unfinished'])} of {s['runs'] + len(s['unfinished'])} runs did "
                  f"not finish, left out: {', '.join(s['unfinished'])}")
        for earlier, later in s["continued"].items():
            print(f"  {earlier} stopped, and {later} continues it")
    ms = reference["train_time_ms"][-1]
    print(f"{reference['name'] + ' (its log)':<40} {reference['runs']:>4} "
          f"{reference['mean']:>9.4f} {reference['std']:>7.4f} {'':>9} {ms / 1e3:>10.1f}s "
          f"{ms / reference['timed_steps']:>7.2f}ms")
    if args.plot:
        try:
            plot(folders, args.plot, reference)
        except (OSError, RuntimeError) as error:  # a folder that is not there; pgf's LaTeX
            sys.exit(f"error: --plot={args.plot}: {getattr(error, 'strerror', None) or error}")
        print(f"curves drawn to {args.plot}")


if __name__ == "__main__":
    main()
