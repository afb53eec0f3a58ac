"""Is my change faster? Time two training scripts, whole, as users run them.

    python benchmarks/compare.py BASELINE.py ATTEMPT.py [--runs=N] [--nproc_per_node=G]
                                 [--out=DIR] [-- --name=value ...]

Runs BASELINE and ATTEMPT in alternation, A B A B ..., N times each (default 3), every run with
the same overrides (the arguments after `--`) and a --log_dir of its own under DIR; with G > 1
through `torchrun --standalone --nproc_per_node=G`. From each run's log it reads the final
step_avg, the mean time of a training step as the script itself measured it, and prints per
script the mean and the spread (largest minus smallest) over its runs, then the ratio
ATTEMPT / BASELINE of the means and whether their difference exceeds the larger spread. The
same goes to DIR/compare.json. A run that fails stops the comparison, with its last lines.

The whole script is timed, not a copy of its parts, because an attempt may change anything,
the loop included. Alternating gives a slow drift of the machine (clocks, heat, neighbours)
to both scripts alike. A short run is enough to compare steps, e.g. on the synthetic shards:

    python benchmarks/compare.py train_gpt.py attempt.py -- --num_iterations=100 --val_every=0 \\
        --train_files='data/synthetic/synthetic_train_*.bin' \\
        --val_files='data/synthetic/synthetic_val_*.bin'

Its step_avg compares only with runs of the same length: the attention window grows over a run.
"""
import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

# The final step's line: step:N/N ... step_avg:12.34ms (a train line, then the val line).
FINAL_STEP_AVG = re.compile(r"^step:(\d+)/\1 .*step_avg:([\d.]+)ms", re.MULTILINE)


def final_step_avg(log):
    """The step_avg of the last step's last line in a train_gpt.py log, in ms."""
    found = FINAL_STEP_AVG.findall(Path(log).read_text(errors="replace"))
    if not found:
        raise SystemExit(f"{log} has no line of the last step with a step_avg: did the run end?")
    return float(found[-1][1])


def command(script, nproc, log_dir, overrides):
    launcher = [sys.executable] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return launcher + [str(script), *overrides, f"--log_dir={log_dir}"]


def run_once(script, nproc, log_dir, overrides):
    """Run the script to its end and return its final step_avg; its output goes to log_dir."""
    log_dir.mkdir(parents=True)
    output = log_dir / "output.txt"
    with open(output, "w") as out:
        code = subprocess.run(command(script, nproc, log_dir, overrides), stdout=out,
                              stderr=subprocess.STDOUT).returncode
    if code:
        tail = "\n".join(output.read_text(errors="replace").splitlines()[-20:])
        raise SystemExit(f"{script} failed (exit status {code}) in {log_dir}; its last lines:\n"
                         f"{tail}")
    logs = [path for path in log_dir.glob("*.txt") if path != output]
    if len(logs) != 1:
        raise SystemExit(f"{script} left {len(logs)} log files in {log_dir}, not 1")
    return final_step_avg(logs[0])


def summary(step_avgs):
    return dict(step_avg_ms=step_avgs, mean_ms=sum(step_avgs) / len(step_avgs),
                spread_ms=max(step_avgs) - min(step_avgs))


def compare(baseline, attempt, runs, nproc, out, overrides):
    """Time both scripts `runs` times each, alternating, and return the comparison as a dict."""
    scripts = dict(baseline=baseline, attempt=attempt)
    step_avgs = {label: [] for label in scripts}
    for i in range(1, runs + 1):
        for label, script in scripts.items():
            started = time.perf_counter()
            step_avgs[label].append(run_once(script, nproc, out / f"{label}_{i}", overrides))
            print(f"{label} run {i}/{runs} ({script}): step_avg {step_avgs[label][-1]:.2f}ms, "
                  f"{time.perf_counter() - started:.0f}s in all", flush=True)
    result = dict(baseline=dict(script=str(baseline), **summary(step_avgs["baseline"])),
                  attempt=dict(script=str(attempt), **summary(step_avgs["attempt"])),
                  runs=runs, nproc_per_node=nproc, overrides=overrides)
    a, b = result["baseline"], result["attempt"]
    result["ratio"] = b["mean_ms"] / a["mean_ms"]
    result["exceeds_spread"] = abs(b["mean_ms"] - a["mean_ms"]) > max(a["spread_ms"],
                                                                      b["spread_ms"])
    return result


def report(result):
    for label in ("baseline", "attempt"):
        r = result[label]
        print(f"{label:<8} {r['script']}: step_avg {r['mean_ms']:.2f}ms, spread "
              f"{r['spread_ms']:.2f}ms over {len(r['step_avg_ms'])} runs "
              f"({', '.join(f'{v:.2f}' for v in r['step_avg_ms'])})")
    a, b = result["baseline"], result["attempt"]
    print(f"attempt / baseline: {result['ratio']:.4f} ({b['mean_ms'] - a['mean_ms']:+.2f}ms per "
          f"step); " + ("larger than" if result["exceeds_spread"] else "within") +
          f" the larger spread, {max(a['spread_ms'], b['spread_ms']):.2f}ms")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("baseline", type=Path)
    parser.add_argument("attempt", type=Path)
    parser.add_argument("--runs", type=int, default=3, help="runs of each script")
    parser.add_argument("--nproc_per_node", type=int, default=1, help="GPUs (or processes)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the runs' logs and compare.json "
                             "(default: logs/compare_<date>_<time>)")
    args, overrides = parser.parse_args(argv[:split]), argv[split + 1:]
    for script in (args.baseline, args.attempt):
        if not script.is_file():
            parser.error(f"{script}: no such file")
    if args.runs < 1 or args.nproc_per_node < 1:
        parser.error(f"--runs={args.runs} and --nproc_per_node={args.nproc_per_node} must be "
                     f"1 or more")
    if any(o.startswith("--log_dir") for o in overrides):
        parser.error("each run gets a --log_dir of its own under --out; leave --log_dir out")
    out = args.out or Path("logs") / time.strftime("compare_%Y%m%d_%H%M%S")
    if out.exists() and any(out.iterdir()):
        parser.error(f"--out={out} is not empty; name a new folder")
    result = compare(args.baseline, args.attempt, args.runs, args.nproc_per_node, out, overrides)
    report(result)
    (out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {out / 'compare.json'}")
    return result


if __name__ == "__main__":
    main()
