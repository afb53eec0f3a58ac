"""benchmarks/bench_step.py: its FLOP counts against independent ones, and a run on the CPU;
benchmarks/bench_kernels.py, which needs a GPU, says so."""
import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from test_model import LAYOUTS, random_documents
from test_training import TINY
import train_gpt
from train_gpt import GPT, DistributedDataLoader, dense_attention_mask

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_step  # noqa: E402
from bench_step import (attention_pairs, copy_rate, gpu_timeline, main,  # noqa: E402
                        matrix_parameters, throughput)
from step_map import step_map  # noqa: E402
from training_script import TRAIN_GPT, load_script  # noqa: E402


@pytest.mark.parametrize("layout", LAYOUTS)
def test_attention_pairs_count_the_dense_mask(layout):
    rng = np.random.default_rng(20 + LAYOUTS.index(layout))
    for num_blocks in [1, 3, 8]:
        inputs = random_documents(rng, num_blocks, layout)
        for window in [1, 2, 5, 20]:
            expected = int(dense_attention_mask(inputs, window).sum())
            assert attention_pairs(inputs, window) == expected, (num_blocks, window)


def test_matrix_parameters_of_the_reference_model():
    with torch.device("meta"):
        model = GPT(vocab_size=50257, num_layers=12, num_heads=6, model_dim=768)
    assert matrix_parameters(model) == 121_208_832  # blocks + head: no embedding tables


def test_throughput_of_a_step_worked_by_hand():
    matrix, attention = 48.296e12, 15e12
    tokens_per_s, mfu = throughput(65_536, 128.0, matrix + attention, 989.0)
    assert tokens_per_s == pytest.approx(512_000, rel=1e-9)  # 65,536 / 0.128 s
    # 48.296 + 15 = 63.296 TFLOP / 0.128 s = 494.5 TFLOP/s, half of 989
    assert mfu == pytest.approx(0.5, rel=1e-9)


class HalfSecondTimer:
    """Marks half a second apart, however long the work between them took."""

    def __init__(self):
        self.now = 0.0

    def mark(self):
        self.now += 0.5
        return self.now

    def ms(self, start, end):
        return 1e3 * (end - start)


def test_the_copy_rate_counts_the_bytes_read_and_written():
    # 4 copies of 1 MiB between two marks: 4 MiB read and 4 MiB written in half a second
    rate = copy_rate(torch.device("cpu"), HalfSecondTimer(), nbytes=2**20, repeats=4)
    assert rate == 2 * 4 * 2**20 / 0.5


def test_a_run_on_the_cpu_reports_consistent_numbers(tmp_path, monkeypatch):
    rates = []  # the map's memory-bound rate, as profile_steps hands it on
    monkeypatch.setattr(bench_step, "step_map", lambda trace, work, bandwidth: (
        rates.append(bandwidth) or step_map(trace, work, bandwidth)))
    out = tmp_path / "bench.json"
    results = main(["--steps=2", "--warmup=1", "--at_step=2", "--profile=1", f"--json={out}"]
                   + TINY)
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["runs"] == dict(head="head_loss (torch code)",  # a CPU's: the recipe
                                   mlp="relu_square_mlp (torch code)")
    with gzip.open(tmp_path / "bench_trace.json.gz") as trace:  # the profiled step's CPU ops
        events = json.load(trace)["traceEvents"]
    assert any(e.get("name") == "Optimizer.step#Muon.step" for e in events)
    # the shapes of the products, for the map (which has no GPU kernels to show on a CPU)
    assert any(e.get("name") == "aten::mm" and [64, 50304] in e["args"].get("Input Dims", [])
               for e in events)
    profile = (tmp_path / "bench_profile.txt").read_text()
    assert profile.startswith("1 step(s): GPU busy 0.00 ms")
    assert "The map of forward+backward" in profile and results["map"] == []
    # its memory-bound floors at this machine's copy rate: a CPU's, between 0.1 GB/s and 1 TB/s
    # (2 cores measured 13 GB/s idle and 3.7 busy), so that a slip of 1000 in the units shows
    assert 1e-4 < results["map_copy_tb_per_s"] < 1
    assert rates == [pytest.approx(results["map_copy_tb_per_s"] * 1e12)]
    assert f"the rest at {results['map_copy_tb_per_s']:.3g} TB/s." in profile
    assert results["device"] == "cpu" and results["micro_batches_per_step"] == 2
    assert results["tokens_per_step_per_rank"] == 512 and results["peak_tflops"] == 989
    assert results["window_blocks"] == [7, 11]  # steps 2 and 3 of 4: ((1 - x) 128 + x 1856) // 128
    # 2 blocks of 64 wide (attention 4 x 64 x 64, MLP 2 x 64 x 256) and the 50304 x 64 head
    matrices = 2 * (4 * 64 * 64 + 2 * 64 * 256) + 50304 * 64
    assert results["matrix_tflop_per_step"] * 1e12 == pytest.approx(6 * matrices * 512)
    # the batches of steps 2 and 3 come after the warm-up step's, as 256-token sequences
    loader = DistributedDataLoader(TINY[0].partition("=")[2], 0, 1)
    loader.next_batch(512)
    pairs = sum(int(dense_attention_mask(inputs[i:i + 256], window).sum())
                for window in (7, 11) for inputs in [loader.next_batch(512)[0]] for i in (0, 256))
    assert results["attention_tflop_per_step"] * 1e12 == pytest.approx(12 * 64 * pairs * 2 / 2)
    assert results["ms_per_step"] > results["ms_optimizer_step"] > 0
    assert results["ms_forward_backward_per_micro_batch"] > 0
    flops = 1e12 * (results["matrix_tflop_per_step"] + results["attention_tflop_per_step"])
    assert (results["tokens_per_s_per_gpu"], results["mfu"]) == pytest.approx(throughput(
        results["tokens_per_step_per_rank"], results["ms_per_step"], flops, results["peak_tflops"]))
    assert results["peak_memory_mib"] > 0 and results["compile_and_warmup_s"] > 0


def test_a_copy_of_the_script_is_measured_as_it_is(tmp_path):
    """--script: the attempt's model, here with an MLP of 3 x dim hidden units whose forward
    computes GELU itself, not the file's; the results say what ran."""
    source = TRAIN_GPT.read_text()
    for part in ("self.c_fc = CastedLinear(dim, 4 * dim)",
                 "self.c_proj = CastedLinear(4 * dim, dim, zero_init=True)"):
        assert source.count(part) == 1
        source = source.replace(part, part.replace("4 * dim", "3 * dim"))
    call = "return self.relu_square_mlp(x[0], self.c_fc.weight.type_as(x),"
    assert source.count(call) == 1
    source = source.replace(call, "return F.linear(F.gelu(F.linear(x[0], "
                                  "self.c_fc.weight.type_as(x))),")
    attempt = tmp_path / "attempt.py"
    attempt.write_text(source)
    results = main([f"--script={attempt}", "--steps=1", "--warmup=0",
                    f"--json={tmp_path / 'bench.json'}"] + TINY)
    assert results["script"] == str(attempt)
    assert results["runs"]["mlp"] == ("MLP.forward's own code (it does not call "
                                      "self.relu_square_mlp)")
    matrices = 2 * (4 * 64 * 64 + 2 * 64 * 192) + 50304 * 64  # 192 hidden units, not 256
    assert results["matrix_tflop_per_step"] * 1e12 == pytest.approx(6 * matrices * 512)
    assert load_script(attempt).__file__ == str(attempt) and load_script() is train_gpt
    with pytest.raises(SystemExit, match="--script=.*nowhere.py: no such file"):
        load_script(tmp_path / "nowhere.py")


def test_gpu_timeline_counts_busy_time_gaps_and_ranges():
    def kernel(name, ts, dur, cat="kernel"):
        return dict(ph="X", cat=cat, name=name, ts=ts, dur=dur)
    trace = dict(traceEvents=[  # in us; out of order, as a trace may be
        kernel("triton_poi_fused_mul", 30, 1),
        kernel("nvjet_sm90_tst_192x192", 0, 10),
        kernel("triton_per_fused__fused_rms_norm_add", 5, 7),  # overlaps the product
        kernel("nvjet_small", 6, 2),  # inside both: the busy stretch still ends with the norm
        kernel("Memcpy HtoD (Pinned -> Device)", 20, 5, cat="gpu_memcpy"),
        kernel("Memset (Device)", 25, 1, cat="gpu_memset"),  # starts where the copy ends
        kernel("aten::mm", 0, 40, cat="cpu_op"),  # CPU side: not GPU time
        dict(ph="X", cat="gpu_user_annotation", name="Optimizer.step#Muon.step", ts=8, dur=20)])
    timeline = gpu_timeline(trace)
    # busy [0, 12), [20, 26), [30, 31): 19 of a 31 us span
    assert (timeline["span_us"], timeline["busy_us"], timeline["idle_us"]) == (31, 19, 12)
    assert timeline["gaps"] == [(8, "triton_per_fused__fused_rms_norm_add",
                                 "Memcpy HtoD (Pinned -> Device)"),
                                (4, "Memset (Device)", "triton_poi_fused_mul")]
    assert timeline["ranges"] == {"Optimizer.step#Muon.step": [20, 4 + 6]}  # busy in [8, 28)
    assert timeline["kernels"][0] == (10, 1, "nvjet_sm90_tst_192x192")


def test_bench_kernels_says_it_needs_a_gpu():
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_kernels.py"
    result = subprocess.run([sys.executable, str(script)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip() == "error: bench_kernels.py times GPU kernels and needs a CUDA GPU"


def test_bench_kernels_refuses_a_copy_whose_kernel_no_longer_computes_its_recipe(tmp_path):
    """It would time a kernel against torch code that computes something else."""
    root = Path(__file__).resolve().parent.parent
    attempt = tmp_path / "attempt.py"
    attempt.write_text((root / "train_gpt.py").read_text().replace(
        "F.relu(F.linear(x, w_fc)).square()", "F.gelu(F.linear(x, w_fc))"))
    result = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_kernels.py"),
                             f"--script={attempt}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith("error: attempt.py: relu_square_mlp is not the code that "
                                    "the mlp kernel computes"), result.stderr
