"""Time the training step of train_gpt.py: compile and warm-up, the step and its parts, memory.

    python benchmarks/bench_step.py [--steps 20] [--json bench_step.json] [--name=value ...]
    torchrun --standalone --nproc_per_node=8 benchmarks/bench_step.py [...]

Builds the model, optimizers and train loader exactly as train_gpt.py does (any hyperparameter
can be overridden as --name=value), runs --warmup steps (compilation happens here), then times
--steps steps. The steps run at the schedule of --at_step onwards (default: the middle of the
run, where the attention window is half-grown, so a step costs about the run's average).

It reports compile and warm-up time, ms per step, ms of forward+backward per micro-batch, ms of
the optimizer step (Adam and Muon), tokens per second per GPU, the model FLOPs utilisation
against --peak_tflops, and peak memory; prints a table and writes the numbers as JSON. On a GPU
the parts are timed with CUDA events, so timing adds no synchronisation to the steps.

Model FLOPs per step and rank: 6 x the matrix parameters a token passes through (those of the
blocks and the head, not the embedding tables) x the rank's tokens, plus 12 x model_dim x the
(query, key) pairs the attention mask allows, per attention layer, counted on the real batches.
The loop's log lines and loss reduction are not part of the timed step.

For machines without FineWeb, make shards of the same shape with data/synthetic_fineweb.py:
    python data/synthetic_fineweb.py 1 --val-tokens 11000000
    python benchmarks/bench_step.py --train_files='data/synthetic/synthetic_train_*.bin'
"""
import argparse
import dataclasses
import json
import resource
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train_gpt  # noqa: E402
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


def step_flops(model, args, inputs, window_blocks, seq_len):
    """Model FLOPs of one forward+backward over `inputs` (this rank's slice of a step)."""
    attention_layers = sum(block.attn is not None for block in model.blocks)
    pairs = sum(attention_pairs(inputs[i:i + seq_len], window_blocks)
                for i in range(0, len(inputs), seq_len))
    return (6 * matrix_parameters(model) * len(inputs),
            12 * args.model_dim * pairs * attention_layers)


class Timer:
    """Marks on the timeline: CUDA events on a GPU (no waiting), the host clock on a CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, start, end):
        return start.elapsed_time(end) if self.cuda else 1e3 * (end - start)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Other --name=value arguments set hyperparameters.")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--at_step", type=int, help="schedule step of the first timed step "
                        "(default: half of --num_iterations)")
    parser.add_argument("--peak_tflops", type=float, default=989.0,
                        help="the GPU's peak, for the utilisation (default 989: H100 SXM, bf16 "
                        "dense)")
    parser.add_argument("--json", default="bench_step.json", help="where to write the results")
    own, overrides = parser.parse_known_args(argv)
    if own.steps < 1 or own.warmup < 0:
        parser.error("--steps must be 1 or more and --warmup 0 or more")
    return own, train_gpt.parse_args(overrides)


def main(argv=None):
    own, args = parse(sys.argv[1:] if argv is None else argv)
    rank, world_size, device = train_gpt.setup_device()
    train_gpt.check_config(args, world_size, val_shard_tokens=float("inf"))  # no validation here
    seq_len = train_gpt.sequence_length(args, world_size)
    loader = train_gpt.DistributedDataLoader(args.train_files, rank, world_size, device)
    model, _, ddp_model = train_gpt.build_model(args, device)
    adam, muon = train_gpt.build_optimizers(model, args)
    window = torch.tensor(1, dtype=torch.int32, device=device)
    timer = Timer(device)
    first = args.num_iterations // 2 if own.at_step is None else own.at_step

    def run_step(step):
        """One training step, as the script's loop runs it; returns its marks and batch."""
        blocks = train_gpt.window_blocks(step, args.num_iterations)
        window.fill_(blocks)
        begin = timer.mark()
        inputs, targets = loader.next_batch(args.batch_size)
        train_gpt.train_step(ddp_model, inputs, targets, window, seq_len)
        backward_done = timer.mark()
        train_gpt.optimizer_step(adam, muon, step, args)
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
    results = dict(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__, world_size=world_size, timed_steps=own.steps, first_step=first,
        window_blocks=sorted({blocks for _, blocks in batches}),
        tokens_per_step_per_rank=tokens, micro_batches_per_step=micro_batches,
        compile_and_warmup_s=warmup_s,
        ms_per_step=step_ms,
        ms_forward_backward_per_micro_batch=sum(timer.ms(b, m) for b, m, _ in marks)
        / own.steps / micro_batches,
        ms_optimizer_step=sum(timer.ms(m, e) for _, m, e in marks) / own.steps,
        tokens_per_s_per_gpu=tokens / step_ms * 1e3,
        matrix_tflop_per_step=flops[0] / 1e12,
        attention_tflop_per_step=flops[1] / 1e12,
        peak_tflops=own.peak_tflops,
        mfu=sum(flops) / (step_ms / 1e3) / (own.peak_tflops * 1e12),
        peak_memory_mib=(torch.cuda.max_memory_allocated(device) // 2**20 if device.type == "cuda"
                         else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024),
        hyperparameters=dataclasses.asdict(args))
    if rank == 0:
        for name, value in results.items():
            if name != "hyperparameters":
                print(f"{name:38s} {value:.4g}" if isinstance(value, float) else
                      f"{name:38s} {value}")
        Path(own.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"written to {own.json}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return results


if __name__ == "__main__":
    main()
