"""Time the training step of train_gpt.py: compile and warm-up, the step and its parts, memory.

    python benchmarks/bench_step.py [--script attempt.py] [--steps 20] [--json bench_step.json]
                                    [--name=value ...]
    torchrun --standalone --nproc_per_node=8 benchmarks/bench_step.py [...]

Builds the model, optimizers and train loader exactly as the script does (train_gpt.py, or a
copy of it given with --script; any hyperparameter can be overridden as --name=value), runs
--warmup steps (compilation happens here), then times
--steps steps. The steps run at the schedule of --at_step onwards (default: the middle of the
run, where the attention window is half-grown, so a step costs about the run's average).

It reports compile and warm-up time, ms per step, ms of forward+backward per micro-batch, ms of
the optimizer step (Adam and Muon), tokens per second per GPU, the model FLOPs utilisation
against --peak_tflops, peak memory, and which code ran the head's loss and the MLPs (a kernel
or the recipe's torch function); prints a table and writes the numbers as JSON. On a GPU
the parts are timed with CUDA events, so timing adds no synchronisation to the steps.

Model FLOPs per step and rank: 6 x the matrix parameters a token passes through (those of the
blocks and the head, not the embedding tables) x the rank's tokens, plus 12 x model_dim x the
(query, key) pairs the attention mask allows, per attention layer, counted on the real batches
(by train_gpt.py's mask, whatever the script's).
The loop's log lines and loss reduction are not part of the timed step.

With --profile N, N more steps run under torch.profiler: their Chrome trace (gzipped), the kernels
that took the most GPU time, the GPU's idle gaps (time with no kernel, copy or memset running)
and the map of forward+backward (step_map.py: each family of kernels against its floor, the
memory-bound ones at the rate of a copy within this device's memory, measured first) go
beside the JSON, as <json stem>_trace.json.gz and <json stem>_profile.txt; the map also goes
into the JSON. Such a run compiles with Inductor's byte counts in its kernels, which the map
reads: a compile of its own (its own cache entries), so compare its timings with a profiled
run's only. Recording the shapes adds to the host's time, so the profiled steps' idle time is
not comparable with that of profiles written before the map.

For machines without FineWeb, make shards of the same shape with data/synthetic_fineweb.py:
    python data/synthetic_fineweb.py 1 --val-tokens 11000000
    python benchmarks/bench_step.py --train_files='data/synthetic/synthetic_train_*.bin'
"""
import argparse
import collections
import dataclasses
import gzip
import json
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
import torch.distributed as dist

from step_map import ProfiledWork, map_report, step_map
from training_script import TRAIN_GPT, load_script, run_tool

sys.path.insert(0, str(TRAIN_GPT.parent))
from train_gpt import BLOCK_SIZE, EOT_TOKEN  # noqa: E402


def attention_pairs(inputs, window_blocks):
    """How many (query, key) pairs the document-causal sliding-window mask of `inputs` allows.

    A query sees the keys from the later of its document's start and its window's first block,
    up to itself: counted per query, so no T x T mask is made.
    """
    docs = (inputs == EOT_TOKEN).cumsum(0)
    positions = torch.arange(len(inputs), device=inputs.device)
    doc_start = torch.searchsorted(docs, docs)  # first position of each position's document
    window_start = (positions // BLOCK_SIZE - window_blocks + 1).clamp(min=0) * BLOCK_SIZE
    return int((positions - torch.maximum(doc_start, window_start) + 1).sum())


def matrix_parameters(model):
    """Parameters of the matrices every token passes through: the blocks' and the head's."""
    blocks = sum(p.numel() for p in model.blocks.parameters() if p.ndim == 2)
    return blocks + model.lm_head.weight.numel()


def layer_attention_pairs(model, inputs, window_blocks, seq_len):
    """The (query, key) pairs the mask allows over `inputs` (this rank's slice of a step), in
    all of the model's attention layers together."""
    attention_layers = sum(block.attn is not None for block in model.blocks)
    return attention_layers * sum(attention_pairs(inputs[i:i + seq_len], window_blocks)
                                  for i in range(0, len(inputs), seq_len))


def step_flops(model, args, inputs, window_blocks, seq_len):
    """Model FLOPs of one forward+backward over `inputs` (this rank's slice of a step)."""
    return (6 * matrix_parameters(model) * len(inputs),
            12 * args.model_dim * layer_attention_pairs(model, inputs, window_blocks, seq_len))


def profiled_work(model, args, batches, seq_len):
    """The map's ProfiledWork of `batches`: the profiled steps' (inputs, window blocks)."""
    tokens = sum(len(inputs) for inputs, _ in batches)
    return ProfiledWork(
        model_dim=args.model_dim, hidden=model.blocks[0].mlp.c_fc.weight.size(0),
        vocab_size=model.lm_head.weight.size(0), tokens=tokens,
        attention_pairs=sum(layer_attention_pairs(model, inputs, blocks, seq_len)
                            for inputs, blocks in batches), micro_batches=tokens // seq_len)


def throughput(tokens, step_ms, flops, peak_tflops):
    """Tokens per second and model FLOPs utilisation of one rank's step.

    `tokens` and `flops` (matrix + attention) are the rank's per step, `step_ms` the step's time
    in ms and `peak_tflops` the GPU's peak in TFLOP/s. Returns (tokens per second, MFU as a
    fraction of the peak).
    """
    return tokens / step_ms * 1e3, flops / (step_ms / 1e3) / (peak_tflops * 1e12)


def gpu_timeline(trace, top=25):
    """What the GPU did, from a Chrome trace of torch.profiler (times in us).

    The GPU is busy while any kernel, copy or memset runs; a gap is a stretch between the first
    and the last of them with none running. Returns the span, busy and idle time, the `top`
    kernels and gaps, and for each annotated range on the GPU its total span and busy time.
    """
    events = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"
                     and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                    key=lambda e: e["ts"])
    annotations = [e for e in trace["traceEvents"] if e.get("cat") == "gpu_user_annotation"]
    totals = collections.defaultdict(lambda: [0, 0.0])
    gaps, busy, previous = [], [], None  # busy: disjoint (start, end) intervals
    for e in events:
        totals[e["name"]][0] += 1
        totals[e["name"]][1] += e["dur"]
        start, end = e["ts"], e["ts"] + e["dur"]
        if busy and start <= busy[-1][1]:
            busy[-1] = (busy[-1][0], max(busy[-1][1], end))
        else:
            if busy:
                gaps.append((start - busy[-1][1], previous["name"], e["name"]))
            busy.append((start, end))
        if end >= busy[-1][1]:
            previous = e

    def busy_between(a, b):
        return sum(max(0.0, min(b, end) - max(a, start)) for start, end in busy)

    ranges = collections.defaultdict(lambda: [0.0, 0.0])
    for e in annotations:
        ranges[e["name"]][0] += e["dur"]
        ranges[e["name"]][1] += busy_between(e["ts"], e["ts"] + e["dur"])
    span = busy[-1][1] - busy[0][0] if busy else 0.0
    busy_us = sum(end - start for start, end in busy)
    kernels = sorted(((t, n, name) for name, (n, t) in totals.items()), reverse=True)[:top]
    return dict(span_us=span, busy_us=busy_us, idle_us=span - busy_us, kernels=kernels,
                gaps=sorted(gaps, reverse=True)[:top], ranges=dict(ranges))


def timeline_report(timeline, steps):
    """The lines of a gpu_timeline() of `steps` steps, per step."""
    per_step = lambda us: us / 1e3 / steps  # noqa: E731
    lines = [f"{steps} step(s): GPU busy {per_step(timeline['busy_us']):.2f} ms per step, idle "
             f"{per_step(timeline['idle_us']):.2f} ms per step"]
    lines += ["", "annotated ranges: ms per step on the GPU's timeline, of which busy"]
    lines += [f"{per_step(span):9.2f} {per_step(busy):9.2f}  {name}"
              for name, (span, busy) in sorted(timeline["ranges"].items())]
    lines += ["", "kernels by GPU time: ms per step, launches per step, name"]
    lines += [f"{per_step(t):9.3f} {count / steps:7.1f}  {name[:120]}"
              for t, count, name in timeline["kernels"]]
    lines += ["", "largest idle gaps: us, the kernel before, the kernel after"]
    lines += [f"{gap:9.1f}  {before[:60]}  ->  {after[:60]}"
              for gap, before, after in timeline["gaps"]]
    return lines


def copy_rate(device, timer, nbytes=2**28, repeats=10):
    """Bytes read and written per second by a copy within `device`'s memory: the map's floor
    for memory-bound work, measured on the card in hand. The default 256 MiB, read and written,
    is several times any GPU's L2 cache, so the copy goes through the memory itself."""
    source = torch.randint(256, (nbytes,), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # the first copy pays for its launch's setup
    start = timer.mark()
    for _ in range(repeats):
        target.copy_(source)
    return 2 * nbytes * repeats / (timer.ms(start, timer.mark()) / 1e3)


def profile_steps(run_step, steps, stem, cuda, work, bandwidth):
    """Run `steps` under torch.profiler; write the trace and a summary next to `stem`.
    `work(batches)` is the ProfiledWork of the steps' (inputs, window blocks), for the map, whose
    memory-bound floors are at `bandwidth` bytes per second."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda
    with profile(activities=activities, record_shapes=True) as prof:  # shapes: for the map
        batches = [run_step(step)[1] for step in steps]
        if cuda:
            torch.cuda.synchronize()
    prof.export_chrome_trace(f"{stem}_trace.json.gz")  # the .gz name makes it compress
    with gzip.open(f"{stem}_trace.json.gz") as trace:
        trace = json.load(trace)
    timeline, (table, rate) = gpu_timeline(trace), step_map(trace, work(batches), bandwidth)
    lines = timeline_report(timeline, len(steps)) + [
        "", "The map of forward+backward: GPU time by family, against its floor"] + map_report(
        table, rate, bandwidth) + [
        "", "CPU and GPU time per operator",
        prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else
                                  "self_cpu_time_total", row_limit=40)]
    Path(f"{stem}_profile.txt").write_text("\n".join(lines) + "\n")
    return timeline, table, rate


class Timer:
    """Marks on the timeline: CUDA events on a GPU (marking never waits; reading a time waits for
    its end mark), the host clock on a CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, start, end):
        if self.cuda:
            end.synchronize()  # an event's time is known once the GPU has reached it
            return start.elapsed_time(end)
        return 1e3 * (end - start)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Other --name=value arguments set hyperparameters.")
    parser.add_argument("--script", default=TRAIN_GPT,
                        help="the training script to time (default: train_gpt.py)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--at_step", type=int, help="schedule step of the first timed step "
                        "(default: half of --num_iterations)")
    parser.add_argument("--peak_tflops", type=float, default=989.0,
                        help="the GPU's peak, for the utilisation (default 989: H100 SXM, bf16 "
                        "dense)")
    parser.add_argument("--json", default="bench_step.json", help="where to write the results")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="then profile N more steps (default 0: none)")
    own, overrides = parser.parse_known_args(argv)
    if own.steps < 1 or own.warmup < 0 or own.profile < 0:
        parser.error("--steps must be 1 or more, --warmup and --profile 0 or more")
    script = load_script(own.script)
    args = script.parse_args(overrides)
    if own.at_step is not None and not 0 <= own.at_step < args.num_iterations:
        parser.error(f"--at_step={own.at_step}: the run's steps are 0 to {args.num_iterations - 1}")
    return own, script, args


def main(argv=None):
    own, script, args = parse(sys.argv[1:] if argv is None else argv)
    if not own.profile:
        return measure(own, script, args)
    # the map needs each compiled kernel's bytes: this adds them to the generated code
    with inductor_config.patch(benchmark_kernel=True):
        return measure(own, script, args)


def measure(own, script, args):
    """bench_step.py's run, with the options `own` and the hyperparameters `args` of `script`."""
    rank, world_size, device = script.setup_device()
    script.check_config(args, world_size, val_shard_tokens=float("inf"))  # no validation here
    seq_len = script.sequence_length(args, world_size)
    loader = script.DistributedDataLoader(args.train_files, rank, world_size, device,
                                          args.vocab_size)
    model, _, ddp_model = script.build_model(args, device)
    adam, muon = script.build_optimizers(model, args)
    window = torch.tensor(1, dtype=torch.int32, device=device)
    timer = Timer(device)
    first = args.num_iterations // 2 if own.at_step is None else own.at_step

    def run_step(step):
        """One training step, as the script's loop runs it; returns its marks and batch."""
        blocks = script.window_schedule(step, args.num_iterations)
        window.fill_(blocks)
        begin = timer.mark()
        inputs, targets = loader.next_batch(args.batch_size)
        script.forward_backward(ddp_model, inputs, targets, window, seq_len)
        backward_done = timer.mark()
        script.optimizer_step(adam, muon, step, args)
        return (begin, backward_done, timer.mark()), (inputs, blocks)

    started = time.perf_counter()
    for step in range(first - own.warmup, first):
        run_step(step)
    if device.type == "cuda":
        torch.cuda.synchronize()
    warmup_s = time.perf_counter() - started
    marks, batches = zip(*[run_step(step) for step in range(first, first + own.steps)])
    if device.type == "cuda":
        torch.cuda.synchronize()

    tokens, micro_batches = args.batch_size // world_size, args.batch_size // world_size // seq_len
    step_ms = timer.ms(marks[0][0], marks[-1][2]) / own.steps
    flops = [sum(part) / own.steps for part in zip(*(
        step_flops(model, args, inputs, blocks, seq_len) for inputs, blocks in batches))]
    tokens_per_s, mfu = throughput(tokens, step_ms, sum(flops), own.peak_tflops)
    results = dict(
        script=str(Path(own.script).resolve()),
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__, world_size=world_size, timed_steps=own.steps, first_step=first,
        runs=script.what_runs(model),  # a kernel that gave way would show in the times alone
        window_blocks=sorted({blocks for _, blocks in batches}),
        tokens_per_step_per_rank=tokens, micro_batches_per_step=micro_batches,
        compile_and_warmup_s=warmup_s,
        ms_per_step=step_ms,
        ms_forward_backward_per_micro_batch=sum(timer.ms(b, m) for b, m, _ in marks)
        / own.steps / micro_batches,
        ms_optimizer_step=sum(timer.ms(m, e) for _, m, e in marks) / own.steps,
        tokens_per_s_per_gpu=tokens_per_s,
        matrix_tflop_per_step=flops[0] / 1e12,
        attention_tflop_per_step=flops[1] / 1e12,
        peak_tflops=own.peak_tflops,
        mfu=mfu,
        peak_memory_mib=script.peak_memory_mib(device),
        hyperparameters=dataclasses.asdict(args))
    if own.profile:
        stem = str(Path(own.json).with_suffix("")) + (f"_rank{rank}" if rank else "")
        after, bandwidth = first + own.steps, copy_rate(device, timer)
        timeline, table, rate = profile_steps(
            run_step, range(after, after + own.profile), stem, device.type == "cuda",
            lambda batches: profiled_work(model, args, batches, seq_len), bandwidth)
        results.update(profiled_steps=own.profile, map_copy_tb_per_s=bandwidth / 1e12,
                       profile_gpu_idle_ms_per_step=timeline["idle_us"] / 1e3 / own.profile,
                       map_products_tflops=rate, map=table)
    if rank == 0:
        for name, value in results.items():
            if name not in ("hyperparameters", "map"):
                print(f"{name:38s} {value:.4g}" if isinstance(value, float) else
                      f"{name:38s} {value}")
        Path(own.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"written to {own.json}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return results


if __name__ == "__main__":
    run_tool(main)
