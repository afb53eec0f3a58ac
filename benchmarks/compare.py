"""Is my change faster? Time two training scripts, whole, as users run them.

    python benchmarks/compare.py BASELINE.py ATTEMPT.py [--runs=N] [--nproc_per_node=G]
                                 [--out=DIR] [-- --name=value ...]

Runs BASELINE and ATTEMPT in alternation, A B A B ..., N times each (default 3), every run with
the same overrides (the arguments after `--`) and a --log_dir of its own under DIR; with G > 1
through `torchrun --standalone --nproc_per_node=G`. From each run's log it reads the final
step_avg, the mean time of a training step as the script itself measured it, and the final val
loss, which says what the change did to the training. It prints per script the mean and the
spread (largest minus smallest) of each over its runs, then the ratio ATTEMPT / BASELINE of the
mean step_avg and whether their difference exceeds the larger spread (with --runs=1 there is no
spread, and no verdict). The same goes to DIR/compare.json. A run that fails stops the
comparison, with its last lines (before torchrun's own report). Without a CUDA GPU the runs
get the memory allocator setting that run.sh gives the CPU smoke run: without it, the time a
CPU step takes depends more on the allocator than on the math.

The whole script is timed, not a copy of its parts, because an attempt may change anything,
the loop included. Alternating gives a slow drift of the machine (clocks, heat, neighbours)
to both scripts alike. A short run is enough to compare steps, e.g. on the synthetic shards:

    python benchmarks/compare.py train_gpt.py attempt.py -- --num_iterations=100 --val_every=0 \\
        --train_files='data/synthetic/synthetic_train_*.bin' \\
        --val_files='data/synthetic/synthetic_val_*.bin'

A step_avg compares only with runs of the same length, since the attention window grows with a
run's progress: if the two scripts run different numbers of steps, a warning says so.

Comparing code is its job, and the code may change a default or a preset, so that the same
overrides give the two scripts other hyperparameters: a line names those that their logs give
differently (e.g. "model_dim 128 -> 64", baseline -> attempt), and compare.json holds them as
hyperparameters_differ, {"model_dim": [128, 64]}, empty where they are alike or where a log has
no hyperparameters line. The seed and where a run's files go (log_dir, which compare.py sets per
run, among them) do not count, as records/summarize.py does not count them: benchmarks/alike.py
reads them for both.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from alike import described, differing, hyperparameters

# The final step's lines: step:N/N ... step_avg:12.34ms (the train line, then the val line).
FINAL_STEP = re.compile(r"^step:(\d+)/\1 .*step_avg:([\d.]+)ms", re.MULTILINE)
FINAL_VAL = re.compile(r"^step:(\d+)/\1 val_loss:(\S+)", re.MULTILINE)
# run.sh's setting for the CPU smoke run: freed memory stays in the process, where fresh pages
# for every step's tensors would cost more than the math
CPU_MALLOC = "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184"


def final_step(log):
    """(step_avg in ms, steps, final val loss) from the last step's lines in a train_gpt.py
    log."""
    text = Path(log).read_text(errors="replace")
    found, val = FINAL_STEP.findall(text), FINAL_VAL.findall(text)
    if not found or not val:
        raise SystemExit(f"{log} has no val line of the last step with a step_avg: did the run "
                         f"end?")
    steps, step_avg = found[-1]
    return float(step_avg), int(steps), float(val[-1][1])


def before_torchrun_report(text, n=20):
    """The last n lines of a run's output before torchrun's own report of a failed worker (its
    lines come from torch/distributed/elastic), which would otherwise hide the worker's error."""
    lines = text.splitlines()
    end = next((i for i, line in enumerate(lines) if "torch/distributed/elastic" in line),
               len(lines))
    return lines[max(0, end - n):end]


def command(script, nproc, log_dir, overrides):
    launcher = [sys.executable] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return launcher + [str(script), *overrides, f"--log_dir={log_dir}"]


def run_once(script, nproc, log_dir, overrides, env):
    """Run the script to its end and return (its final step_avg, its steps, its final val loss,
    its logged hyperparameters or None); its output goes to log_dir/output.txt."""
    log_dir.mkdir(parents=True)
    output = log_dir / "output.txt"
    with open(output, "w") as out:
        code = subprocess.run(command(script, nproc, log_dir, overrides), stdout=out,
                              stderr=subprocess.STDOUT, env=env).returncode
    if code:
        tail = "\n".join(before_torchrun_report(output.read_text(errors="replace")))
        raise SystemExit(f"{script} failed (exit status {code}); all its output is in {output}, "
                         f"its last lines:\n{tail}")
    logs = [path for path in log_dir.glob("*.txt") if path != output]
    if len(logs) != 1:
        raise SystemExit(f"{script} left {len(logs)} log files in {log_dir}, not 1 (was it "
                         f"given --log_dir?); its output is in {output}")
    return (*final_step(logs[0]), hyperparameters(logs[0].read_text(errors="replace")))


def spread(values):
    """Largest minus smallest; None for one value, which measures no spread (a 0 would read as
    runs that agreed)."""
    return max(values) - min(values) if len(values) > 1 else None


def summary(step_avgs, steps, val_losses):
    return dict(step_avg_ms=step_avgs, steps=steps, mean_ms=sum(step_avgs) / len(step_avgs),
                spread_ms=spread(step_avgs), val_loss=val_losses,
                val_loss_mean=sum(val_losses) / len(val_losses),
                val_loss_spread=spread(val_losses))


def run_environment():
    """The runs' environment: this one, with run.sh's allocator setting where there is no GPU."""
    return dict(os.environ, **({} if torch.cuda.is_available() else
                               dict(GLIBC_TUNABLES=CPU_MALLOC)))


def compare(baseline, attempt, runs, nproc, out, overrides):
    """Time both scripts `runs` times each, alternating, and return the comparison as a dict."""
    scripts, env = dict(baseline=baseline, attempt=attempt), run_environment()
    measured = {label: dict(step_avgs=[], steps=set(), val_losses=[]) for label in scripts}
    for i in range(1, runs + 1):
        for label, script in scripts.items():
            started = time.perf_counter()
            step_avg, n, val_loss, logged = run_once(script, nproc, out / f"{label}_{i}",
                                                     overrides, env)
            measured[label]["step_avgs"].append(step_avg)
            measured[label]["steps"].add(n)
            measured[label]["val_losses"].append(val_loss)
            measured[label].setdefault("hyperparameters", logged)  # a script's runs log alike
            print(f"{label} run {i}/{runs} ({script}): step_avg {step_avg:.2f}ms over {n} "
                  f"steps, val loss {val_loss:.4f}, {time.perf_counter() - started:.0f}s in all",
                  flush=True)
    result = {label: dict(script=str(script),
                          **summary(measured[label]["step_avgs"], sorted(measured[label]["steps"]),
                                    measured[label]["val_losses"]))
              for label, script in scripts.items()}
    result.update(runs=runs, nproc_per_node=nproc, overrides=overrides)
    # the same overrides for both: what differs comes from the scripts' defaults and presets
    result["hyperparameters_differ"] = differing(measured["baseline"]["hyperparameters"],
                                                 measured["attempt"]["hyperparameters"])
    a, b = result["baseline"], result["attempt"]
    result["ratio"] = b["mean_ms"] / a["mean_ms"]
    # one run each has no spread to measure a difference against
    result["larger_spread_ms"] = None if runs < 2 else max(a["spread_ms"], b["spread_ms"])
    result["exceeds_spread"] = None if runs < 2 else bool(
        abs(b["mean_ms"] - a["mean_ms"]) > result["larger_spread_ms"])
    return result


def shown_spread(value, form, unit=""):
    return "no spread" if value is None else f"spread {value:{form}}{unit}"


def report(result):
    for label in ("baseline", "attempt"):
        r, n = result[label], len(result[label]["step_avg_ms"])
        print(f"{label:<8} {r['script']}: step_avg {r['mean_ms']:.2f}ms, "
              f"{shown_spread(r['spread_ms'], '.2f', 'ms')} over {n} "
              f"run{'' if n == 1 else 's'} ({', '.join(f'{v:.2f}' for v in r['step_avg_ms'])}); "
              f"final val loss {r['val_loss_mean']:.4f}, "
              f"{shown_spread(r['val_loss_spread'], '.4f')} "
              f"({', '.join(f'{v:.4f}' for v in r['val_loss'])})")
    a, b = result["baseline"], result["attempt"]
    verdict = {None: "one run each: no spread to compare with (--runs=2 or more)",
               True: "larger than the larger spread", False: "within the larger spread"}[
        result["exceeds_spread"]]
    larger = "" if result["larger_spread_ms"] is None else f", {result['larger_spread_ms']:.2f}ms"
    print(f"attempt / baseline: {result['ratio']:.4f} ({b['mean_ms'] - a['mean_ms']:+.2f}ms per "
          f"step); {verdict}{larger}")
    if result["hyperparameters_differ"]:
        print(f"the scripts ran with other hyperparameters, baseline -> attempt: "
              f"{', '.join(described(result['hyperparameters_differ']))}")
    if a["steps"] != b["steps"]:
        print(f"warning: the runs took {a['steps']} and {b['steps']} steps; the attention window "
              f"grows with a run's progress, so their step_avg differ by that too")


def usage():
    """The usage that the module's docstring gives (less its `python benchmarks/compare.py`), for
    argparse's usage line: argparse's own line would not show the scripts' options after `--`,
    since main splits them off before argparse sees the rest."""
    return " ".join(["%(prog)s"] + __doc__.split("\n\n")[1].split()[2:])


def syntax_error(script):
    """Where the script does not compile, a line that says so; else None. Checked before any
    run, so that a typo in the attempt does not wait for the baseline's runs to be found."""
    try:
        compile(script.read_bytes(), str(script), "exec")
    except SyntaxError as error:
        return f"{script}, line {error.lineno}: {error.msg}"
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], usage=usage())
    parser.add_argument("baseline", type=Path, metavar="BASELINE.py")
    parser.add_argument("attempt", type=Path, metavar="ATTEMPT.py")
    parser.add_argument("--runs", type=int, default=3, help="runs of each script")
    parser.add_argument("--nproc_per_node", type=int, default=1, help="GPUs (or processes)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the runs' logs and compare.json "
                             "(default: logs/compare_<date>_<time>)")
    args, overrides = parser.parse_args(argv[:split]), argv[split + 1:]
    for script in (args.baseline, args.attempt):
        if not script.is_file():
            parser.error(f"{script}: no such file")
        if error := syntax_error(script):
            parser.error(error)
    if args.runs < 1 or args.nproc_per_node < 1:
        parser.error(f"--runs={args.runs} and --nproc_per_node={args.nproc_per_node} must be "
                     f"1 or more")
    if any(o.startswith("--log_dir") for o in overrides):
        parser.error("each run gets a --log_dir of its own under --out; leave --log_dir out")
    out = args.out or Path("logs") / time.strftime("compare_%Y%m%d_%H%M%S")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        parser.error(f"--out={out} exists and is not an empty folder; name a new folder")
    result = compare(args.baseline, args.attempt, args.runs, args.nproc_per_node, out, overrides)
    report(result)
    (out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {out / 'compare.json'}")
    return result


if __name__ == "__main__":
    main()
