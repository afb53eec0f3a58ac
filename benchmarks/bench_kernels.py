"""Time each GPU kernel of train_gpt.py against the compiled pure-torch computation it replaces.

    python benchmarks/bench_kernels.py [--script attempt.py] [--json bench_kernels.json] [--sweep]
                                       [--part head|mlp]

At the reference shapes of one 65,536-token micro-batch: the head and its loss (768 -> 50,304
columns) and one MLP (768 -> 3,072 -> 768), forward and backward, in bf16. Each is timed with
CUDA events (median of --repeats calls after 3 warm-up calls), and its peak memory beyond its
inputs is read from the allocator. With --sweep, each kernel's launch configuration is swept
too (the one the file launches on this GPU is marked): the table says whether another one is
faster. A configuration that needs more registers or shared memory than the GPU has is named,
with the error, and skipped. --script times the kernels of a copy of train_gpt.py instead;
--part times one of the two alone.
"""
import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from training_script import TRAIN_GPT, load_script, run_tool

TOKENS, DIM, VOCAB = 65536, 768, 50304
# The last three read a row in 4, 2 or 1 iterations, 1,024 threads a program: one or two
# programs per SM of an H100, so few rows in flight.
HEAD_SWEEP = [dict(BLOCK=block, num_warps=warps) for block, warps in
              [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16), (16384, 32),
               (32768, 32), (65536, 32)]]
# The last four fit two programs on an H100's SM (64 to 96 KB of shared memory each, and 106 or
# about 250 registers a thread in the sm_90 build): one's stores of its tiles can then overlap
# the other's products, where one program alone leaves the tensor cores idle while it stores.
MLP_SWEEP = [dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=64, GROUP_M=8, num_warps=warps, num_stages=stages)
             for m, n, warps, stages in [(128, 256, 8, 3), (128, 256, 8, 4), (128, 128, 8, 4),
                                         (128, 128, 4, 4), (256, 128, 8, 3), (256, 128, 8, 4),
                                         (64, 256, 4, 4), (128, 128, 4, 3), (128, 128, 8, 3),
                                         (128, 128, 8, 2), (64, 256, 4, 2)]]


def time_ms(fn, inputs, extra, repeats):
    """Median ms of fn's forward and backward, and its peak memory in MiB beyond its inputs
    (the gradients it makes included)."""
    leaves = [t.detach().requires_grad_() for t in inputs]

    def step():
        for t in leaves:
            t.grad = None  # before the call, so that no gradient is counted twice
        out = fn(*leaves, *extra)
        out.backward(torch.ones_like(out) if out.ndim else None)

    for _ in range(3):
        step()
    for t in leaves:
        t.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--script", default=TRAIN_GPT,
                        help="the training script whose kernels to time (default: train_gpt.py)")
    parser.add_argument("--json", default="bench_kernels.json")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--part", choices=["head", "mlp"], help="time this kernel only")
    args = parser.parse_args()
    script = load_script(args.script)
    # a kernel that no longer computes its recipe function would be timed for nothing
    script.use_kernels(script.GPT(50257, num_layers=1, num_heads=1, model_dim=64),
                       torch.device("cpu"))
    if not torch.cuda.is_available():
        sys.exit("error: bench_kernels.py times GPU kernels and needs a CUDA GPU")
    from triton.runtime.errors import OutOfResources
    generator = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=generator) * scale).bfloat16()

    x = F.rms_norm(randn(TOKENS, DIM).float(), (DIM,)).bfloat16()
    head = randn(VOCAB, DIM, scale=0.5)
    targets = torch.randint(0, 50257, (TOKENS,), device="cuda", generator=generator)
    w_fc, w_proj = randn(4 * DIM, DIM, scale=DIM ** -0.5), randn(DIM, 4 * DIM, scale=0.02)
    softcap = script.Hyperparameters.softcap
    cases = [("head", script.head_loss, [x, head], [targets, softcap], HEAD_SWEEP),
             ("mlp", script.relu_square_mlp, [x, w_fc, w_proj], [], MLP_SWEEP)]
    results = []

    def record(**row):  # each row as it comes: a crash or a timeout keeps the rows before it
        results.append(row)
        print(f"{row['part']:<6}{row['ms']:>9.3f}{row['peak_mib']:>10.0f}  {row['version']}",
              flush=True)
        Path(args.json).write_text(json.dumps(dict(device=torch.cuda.get_device_name(),
                                                   torch=torch.__version__, results=results),
                                              indent=1))

    print(f"{'part':<6}{'ms':>9}{'peak MiB':>10}  version")
    scripts_own = script.HEAD_KERNEL_SETTING, script.MLP_TILES
    for name, reference, inputs, extra, sweep in cases:
        if args.part not in (None, name):
            continue
        ms, mib = time_ms(torch.compile(reference), inputs, extra, args.repeats)
        record(part=name, version="compiled pure torch", ms=ms, peak_mib=mib)
        chosen = launch_setting(script, name, x.device)  # None: the recipe runs on this GPU
        for candidate in (sweep if args.sweep else [chosen] if chosen else []):
            try:
                ms, mib = time_ms(kernel_with(script, name, candidate), inputs, extra,
                                  args.repeats)
            except (OutOfResources, ValueError) as error:  # more than the GPU has
                print(f"{name:<6}{'-':>9}{'-':>10}  kernel {candidate}: {error}", flush=True)
                continue
            mark = " (the file's)" if candidate == chosen else ""
            record(part=name, version=f"kernel {candidate}{mark}", ms=ms, peak_mib=mib)
        script.HEAD_KERNEL_SETTING, script.MLP_TILES = scripts_own


def launch_setting(script, part, device):
    """The launch setting the script gives `part`'s kernel on `device`, or None."""
    if part == "head":
        return dict(script.HEAD_KERNEL_SETTING)
    stages = script.mlp_pipeline_stages(device)
    return None if stages is None else dict(script.MLP_TILES, num_stages=stages)


def kernel_with(script, part, setting):
    """The script's kernel for `part`, launched with `setting`: the script's constants say it."""
    if part == "head":
        script.HEAD_KERNEL_SETTING = setting
        return script.triton_head_loss
    script.MLP_TILES = {key: value for key, value in setting.items() if key != "num_stages"}
    return functools.partial(script.triton_relu_square_mlp, num_stages=setting["num_stages"])


if __name__ == "__main__":
    run_tool(main)
