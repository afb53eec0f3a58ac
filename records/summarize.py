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
continues) is named with that log, which counts it once. The 2025-01-04 record's figures, from
reference_2025-01-04.json beside this file, come last, for comparison.

Only runs that are alike are averaged together: the same planned steps, the same hyperparameters
logged but for those that runs of one result may differ in (the seed; where checkpoints go or
come from and the log goes: log_dir, resume, checkpoint_every, save_checkpoint; what runs off the
clock and changes no step: val_every, compile_steps) and with the data's file names for their
paths, and the same code at the top of the log. A log without a hyperparameters line or without
the code (the record format's) compares by what it has. Where a folder's finished runs are of
several configurations, each has its row of figures, the one with the most runs first; then a
line for each of the others says what sets it apart from the first (the hyperparameters that
differ, with both values, and "the code" where the code differs) and names its logs.
benchmarks/alike.py, which compare.py shares, reads these.

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

# what makes runs alike, read as compare.py reads it, from beside compare.py
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from alike import code, described, differing, hyperparameters  # noqa: E402

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


def configuration(path, steps):
    """What a finished run's log says makes it the run it is: its planned steps, its
    hyperparameters (less those that may differ between runs of one result, alike.MAY_DIFFER)
    and its code; the last two None where the log does not give them."""
    text = Path(path).read_text(errors="replace")
    return dict(steps=steps, hyperparameters=hyperparameters(text), code=code(text))


def differences(a, b):
    """What sets configuration b apart from a, in words ("num_layers 4 -> 8", "the code");
    empty where they are alike: the same planned steps, and the same hyperparameters and code
    where both logs give them. A log without them compares by what it has."""
    changed = differing(a["hyperparameters"], b["hyperparameters"])
    words = described(changed)
    if a["steps"] != b["steps"] and "num_iterations" not in changed:  # else said by that
        words.insert(0, f"the planned steps {a['steps']} -> {b['steps']}")
    if None not in (a["code"], b["code"]) and a["code"] != b["code"]:
        words.append("the code")
    return words


def configurations(finished):
    """The finished runs, {log name: configuration}, grouped into alike runs: a list of
    (configuration, log names), the most runs first. The logs that give the most are grouped
    first, so that a log that gives less (a record-format log has no hyperparameters line) joins
    the first group it is alike with as far as it goes; it fills in what that group lacked."""
    groups = []
    for name in sorted(finished, key=lambda n: (list(finished[n].values()).count(None), n)):
        config = finished[name]
        group = next((g for g in groups if not differences(g[0], config)), None)
        if group is None:
            groups.append((dict(config), [name]))
            continue
        group[0].update({key: value for key, value in config.items() if group[0][key] is None})
        group[1].append(name)
    return sorted(((config, sorted(names)) for config, names in groups), key=lambda g: -len(g[1]))


def figures(results):
    """Over finished runs, a list of (final val loss, train time in ms, steps): the mean and
    standard deviation of the final loss, its p-value against 3.28, the mean training time and
    the mean time per step; NaN where there are no runs (or, for the std, one)."""
    losses = np.array([loss for loss, _, _ in results])
    nan = float("nan")
    return dict(mean=losses.mean() if results else nan,
                std=losses.std(ddof=1) if len(losses) > 1 else nan,
                p=p_below_target(losses),
                time_s=np.mean([ms for _, ms, _ in results]) / 1e3 if results else nan,
                step_ms=np.mean([ms / steps for _, ms, steps in results]) if results else nan)


def summarize(folder):
    """Per-folder numbers as a dict: the number of finished runs; the logs of runs that did not
    finish; the logs of runs that did not finish but that a later log continues (with --resume,
    in a run of its own that names the one it continues); the finished runs' `configurations`,
    each a dict of its logs, its figures and how it `differs` from the first (the one with the
    most runs); and the figures over all finished runs, which are NaN where they are of several
    configurations: such runs are not averaged together. None when the folder holds no run log."""
    logs = run_logs(folder)
    if not logs:
        return None
    results = {path.name: final_result(path) for path in logs}
    continued = {f"{run_id}.txt": path.name for path in logs
                 for run_id in RESUMED.findall(path.read_text(errors="replace"))
                 if f"{run_id}.txt" != path.name}  # a restart by torchrun goes on in its own log
    stopped = [name for name, result in results.items() if result is None]
    finished = {name: result for name, result in results.items() if result}
    groups = configurations({path.name: configuration(path, finished[path.name][2])
                             for path in logs if path.name in finished})
    configs = [dict(logs=names, runs=len(names), differs=differences(groups[0][0], config),
                    **figures([finished[name] for name in names])) for config, names in groups]
    return dict(folder=str(folder), runs=len(finished),
                unfinished=[name for name in stopped if name not in continued],
                continued={name: continued[name] for name in stopped if name in continued},
                configurations=configs,
                **figures(list(finished.values()) if len(configs) == 1 else []))


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


def print_figures(label, s):
    """One row of the table: the figures of `s`, a folder's or a configuration's."""
    verdict = "met" if s["p"] < 0.01 else "not shown"
    print(f"{label:<40} {s['runs']:>4} {s['mean']:>9.4f} {s['std']:>7.4f} {s['p']:>9.2g} "
          f"{s['time_s']:>10.1f}s {s['step_ms']:>7.2f}ms  {verdict}")


def listed(words):
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def print_configurations(name, s):
    """A folder whose finished runs are of several configurations: a row for each, then for each
    but the first (the most runs; the rest), what sets it apart from the first and its logs."""
    configs = s["configurations"]
    print(f"{name:<40} {s['runs']:>4}  finished runs of {len(configs)} configurations, not "
          f"averaged together:")
    for i, config in enumerate(configs, 1):
        print_figures(f"  config {i}", config)
    for i, config in enumerate(configs[1:], 2):
        print(f"  config {i} differs from config 1 in {listed(config['differs'])}: "
              f"{', '.join(config['logs'])}")


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
        if len(s["configurations"]) == 1:
            print_figures(folder.name, s)
        elif s["configurations"]:
            print_configurations(folder.name, s)
        else:
            print(f"{folder.name:<40} {0:>4}  no finished runs")
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
