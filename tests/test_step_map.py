"""benchmarks/step_map.py: the map of a profiled step, on a trace whose every number is worked
by hand, and on the trace of a real H100 step (records/2026-11-23_h100_1gpu), against the
families that record's own profile gave by the kernels' names."""
import gzip
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from step_map import ProfiledWork, map_report, step_map  # noqa: E402

HEAD, MLP, ATTENTION = 2 * 65536 * 768 * 50304, 2 * 65536 * 768 * 3072, 2 * 65536 * 768 * 768


def events(*pairs):
    """A Chrome trace of (kernel, operator) pairs, one after another, times in us. Each kernel
    is linked by its External id to its operator, or, where that is a number, to the operator
    of that pair."""
    trace, ts = [], 0
    for i, (kernel, op) in enumerate(pairs):
        if isinstance(op, dict):
            trace.append(dict(ph="X", cat="cpu_op", ts=ts, dur=1, name=op["name"],
                              args=dict(op["args"], **{"External id": i})))
        launcher = op if isinstance(op, int) else i
        trace.append(dict(kernel, ph="X", ts=ts,
                          args=dict(kernel["args"], **{"External id": launcher})))
        ts += kernel["dur"] + 10
    return trace


def kernel(name, dur, cat="kernel", **args):
    return dict(name=name, dur=dur, cat=cat, args=args)


def op(name, dims=None, **args):
    return dict(name=name, args=dict(args, **({"Input Dims": dims} if dims else {})))


def test_a_step_worked_by_hand():
    x, x_mlp, vocab = [65536, 768], [65536, 3072], 50304
    trace = events(
        # the head's product, forward and its two gradients: the vocabulary in n, k and m
        (kernel("nvjet_head_NNN", 6000), op("aten::mm", [x, [768, vocab]])),
        (kernel("nvjet_head_TNN", 7000), op("aten::mm", [[65536, vocab], [vocab, 768]])),
        (kernel("nvjet_head_NTN", 6000), op("aten::mm", [[vocab, 65536], x])),
        # the MLP's kernel, forward and backward (given `pre`), and a cuBLAS product
        (kernel("relu_square_matmul_kernel", 500),
         op("speedrun_0123::relu_square_matmul", [x, [768, 3072], []])),
        (kernel("relu_square_matmul_kernel", 500),
         op("speedrun_0123::relu_square_matmul", [x, [768, 3072], x_mlp])),
        (kernel("nvjet_mlp_TNN", 500), op("aten::mm", [x_mlp, [3072, 768], x])),
        # one product in three kernels, its bias first: the FLOPs once, the time of all
        (kernel("nvjet_q_splitK", 100), op("aten::addmm", [[768], x, [768, 768], x])),
        (kernel("cublasLt::splitKreduce_kernel", 20), 6),
        (kernel("Memset (Device)", 5, "gpu_memset", bytes=4), 6),
        (kernel("nvjet_bad", 30), op("aten::mm", [x, [512, 768]])),  # shapes that do not chain
        # two layers' attention: the family's FLOPs are those of all layers, counted once
        (kernel("triton_tem_fused_flex_attention_0", 400), op("triton_tem_fused_flex_0")),
        (kernel("triton_tem_fused_flex_attention_0", 400), op("triton_tem_fused_flex_0")),
        (kernel("triton_tem_fused_flex_attention_backward_1", 1000),
         op("triton_tem_fused_flex_attention_backward_1")),
        (kernel("softcapped_cross_entropy_kernel", 4500),
         op("speedrun_0123::head_loss_and_gradients")),
        (kernel("triton_per_fused_rms_norm_2", 300), op("triton_per_fused_rms_norm_2",
                                                          kernel_num_gb=0.6)),
        (kernel("triton_per_fused_rms_norm_2", 300), op("triton_per_fused_rms_norm_2",
                                                          kernel_num_gb=0.6)),
        (kernel("Memcpy DtoD (Device -> Device)", 2, "gpu_memcpy", bytes=3e6), None),
        (kernel("Memset (Device)", 1, "gpu_memset", bytes=1e6), None),
        (kernel("Memcpy HtoD (Pinned -> Device)", 1, "gpu_memcpy", bytes=2e6), None),
        (kernel("void at::native::vectorized_elementwise_kernel", 10), None),
        (kernel("triton_poi_fused_lerp_3", 50), op("triton_poi_fused_lerp_3")))
    muon = next(e for e in trace if e["name"] == "triton_poi_fused_lerp_3" and e["cat"] == "kernel")
    trace.append(dict(ph="X", cat="gpu_user_annotation", name="Optimizer.step#Muon.step",
                      ts=muon["ts"], dur=60))  # its kernel is the optimizer's: not on the map
    work = ProfiledWork(model_dim=768, hidden=3072, vocab_size=vocab, tokens=2 * 65536,
                        attention_pairs=10**9, micro_batches=2)
    table, rate = step_map(dict(traceEvents=trace), work, 2.5e12)  # bytes per second
    rate_per_us = 3 * HEAD / 19000  # the head's products are the fastest
    assert rate == pytest.approx(rate_per_us * 1e6 / 1e12)
    rows = {row["family"]: row for row in table}

    def expect(family, launches, ms, tflop, gb, floor_ms):  # over the 2 micro-batches
        row = rows.pop(family)
        assert (row["launches"], row["ms"]) == pytest.approx((launches / 2, ms / 2)), family
        assert row["tflop"] == (None if tflop is None else pytest.approx(tflop / 2)), family
        assert row["gb"] == (None if gb is None else pytest.approx(gb / 2)), family
        if floor_ms is None:
            assert row["floor_ms"] is None and row["gap_ms"] is None, family
        else:
            assert row["floor_ms"] == pytest.approx(floor_ms / 2), family
            assert row["gap_ms"] == pytest.approx((ms - floor_ms) / 2), family

    expect("products: head", 3, 19.0, 3 * HEAD / 1e12, None, 19.0)
    expect("products: MLP's ReLU^2 kernel", 2, 1.0, 2 * MLP / 1e12, None,
           2 * MLP / rate_per_us / 1e3)
    expect("products: MLP", 1, 0.5, MLP / 1e12, None, MLP / rate_per_us / 1e3)
    expect("products: attention's projections", 3, 0.125, ATTENTION / 1e12, None,
           ATTENTION / rate_per_us / 1e3)
    expect("products, shapes not recorded", 1, 0.03, None, None, None)
    expect("FlexAttention forward", 2, 0.8, 4 * 768 * 1e9 / 1e12, None,
           4 * 768 * 1e9 / rate_per_us / 1e3)
    expect("FlexAttention backward", 1, 1.0, 10 * 768 * 1e9 / 1e12, None,
           10 * 768 * 1e9 / rate_per_us / 1e3)
    logits = 4 * 2 * 65536 * vocab  # read once and written once, in bf16
    expect("head's loss kernel", 1, 4.5, None, logits / 1e9, logits / 2.5e12 * 1e3)
    expect("compiled elementwise, norms, reductions", 2, 0.6, None, 1.2, 1.2e9 / 2.5e12 * 1e3)
    # a copy within the GPU reads and writes its bytes; one from the host, a memset, write them
    expect("copies and memsets", 3, 0.004, None, 9e-3, 9e6 / 2.5e12 * 1e3)
    expect("other", 1, 0.01, None, None, None)
    assert rows == {}
    assert [row["ms"] for row in table] == sorted((row["ms"] for row in table), reverse=True)
    lines = map_report(table, rate, 2.5e12)
    assert lines[0] == (f"Per micro-batch. Floors: products and attention at {rate:.0f} "
                        "TFLOP/s (the fastest products here), the rest at 2.5 TB/s.")
    assert lines[4] == f"| products: head | 1.5 | 9.50 | {3 * HEAD / 2e12:.2f} |  | 9.50 | 0.00 |"
    assert lines[-1] == f"| all | 10 | {27.569 / 2:.2f} | | | | |"


def test_a_micro_batch_as_long_as_the_mlp_is_wide():
    """The smoke preset on a GPU: 512 tokens a micro-batch, model_dim 128, MLP 512 wide. Every
    product of a layer has the 512 tokens among its dims, so a product's family comes from the
    two dims left without them, its weight's shape; the attention's are not the MLP's."""
    x, h, vocab = [512, 128], [512, 512], 50304
    trace = events(
        # the attention's projections: forward, the input's gradient, the weight's gradient
        (kernel("nvjet_qkv_NNN", 1), op("aten::mm", [x, [128, 128]])),
        (kernel("nvjet_qkv_TNN", 2), op("aten::mm", [x, [128, 128]])),
        (kernel("nvjet_qkv_NTN", 4), op("aten::mm", [[128, 512], x])),
        # the MLP's way up (128 to 512) and down (512 to 128), each forward and its two gradients
        (kernel("nvjet_fc_NNN", 10), op("aten::mm", [x, [128, 512]])),
        (kernel("nvjet_fc_TNN", 20), op("aten::mm", [h, [512, 128]])),
        (kernel("nvjet_fc_NTN", 40), op("aten::mm", [[512, 512], x])),
        (kernel("nvjet_proj_NNN", 80), op("aten::mm", [h, [512, 128]])),
        (kernel("nvjet_proj_TNN", 160), op("aten::mm", [x, [128, 512]])),
        (kernel("nvjet_proj_NTN", 320), op("aten::mm", [[128, 512], h])),
        # the head, whole and in a chunk of 256 tokens: without the 512, by all three dims
        (kernel("nvjet_head_NNN", 1000), op("aten::mm", [x, [128, vocab]])),
        (kernel("nvjet_head_chunk", 2000), op("aten::mm", [[256, 128], [128, vocab]])))
    work = ProfiledWork(model_dim=128, hidden=512, vocab_size=vocab, tokens=512,
                        attention_pairs=0, micro_batches=1)
    table, _ = step_map(dict(traceEvents=trace), work, 2.5e12)
    # each family's launches, its kernels' time (which of them it holds), its FLOPs, 2 m k n each
    assert {row["family"]: (row["launches"], row["ms"], row["tflop"]) for row in table} == {
        "products: attention's projections": (3, pytest.approx(0.007),
                                              pytest.approx(3 * 2 * 512 * 128 * 128 / 1e12)),
        "products: MLP": (6, pytest.approx(0.63), pytest.approx(6 * 2 * 512 * 128 * 512 / 1e12)),
        "products: head": (2, pytest.approx(3.0), pytest.approx(3 * 2 * 256 * 128 * vocab / 1e12))}


def test_a_compiled_kernel_without_its_bytes_has_no_floor():
    trace = events((kernel("triton_poi_fused_add_0", 100), op("triton_poi_fused_add_0",
                                                                 kernel_num_gb=0.1)),
                   (kernel("triton_poi_fused_add_1", 100), op("triton_poi_fused_add_1")))
    work = ProfiledWork(768, 3072, 50304, 65536, 0, 1)
    [row], rate = step_map(dict(traceEvents=trace), work, 3e12)
    assert rate is None and row["ms"] == 0.2 and row["floor_ms"] is None and row["gb"] is None


def test_the_map_of_a_real_h100_step_keeps_the_families_of_its_record():
    """The step recorded on an H100 before the kernels (no shapes recorded, no compiled kernel's
    bytes): the map's families hold the time that record's profile gave each family by the
    kernels' names, outside the optimizers' ranges."""
    folder = ROOT / "records" / "2026-11-23_h100_1gpu"
    with gzip.open(folder / "bench_1micro_trace.json.gz") as f:
        trace = json.load(f)
    sections = (folder / "bench_1micro_profile.txt").read_text().split("\n\n")
    steps = int(sections[0].split(" step(s)")[0])
    families, kernels = (next(s for s in sections if s.startswith(title)).splitlines()[1:]
                         for title in ("GPU time by kernel family", "kernels by GPU time"))
    # "   all   outside  family" and "   ms  launches  kernel", per step
    by_name = {m[2]: float(m[1]) for m in map(re.compile(r" +[\d.]+ +([\d.]+)  (.+)").fullmatch,
                                               families)}
    per_kernel = {m[2]: float(m[1]) for m in map(re.compile(r" +([\d.]+) +[\d.]+  (.+)").fullmatch,
                                                  kernels)}
    table, rate = step_map(trace, ProfiledWork(768, 3072, 50304, steps * 65536, 10**9, steps),
                           3e12)
    rows = {row["family"]: row for row in table}
    # cuBLAS's memsets before a split-K product: the record's copies, the map's products
    products = {e["args"]["External id"] for e in trace["traceEvents"]
                if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"}
    ranges = [(e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
              if e.get("cat") == "gpu_user_annotation"]
    memsets = sum(e["dur"] for e in trace["traceEvents"] if e.get("cat") == "gpu_memset"
                  and e["args"].get("External id") in products
                  and not any(a <= e["ts"] < b for a, b in ranges)) / 1e3 / steps
    assert 0.1 < memsets < 0.2
    assert rate is None and rows["products, shapes not recorded"]["floor_ms"] is None
    assert rows["products, shapes not recorded"]["ms"] == pytest.approx(
        by_name["matrix products"] + memsets, abs=0.006)
    assert rows["FlexAttention forward"]["ms"] == pytest.approx(
        by_name["FlexAttention forward"], abs=0.006)
    # the record counted the backward's small compiled kernel as attention; the map, as compiled
    small = per_kernel["triton_per_fused_flex_attention_backward_transpose_view_7"]
    assert rows["FlexAttention backward"]["ms"] == pytest.approx(
        by_name["FlexAttention backward"] - small, abs=0.006)
    compiled = sum(by_name[f] for f in ("RMS norms, with what the compiler fused into them",
                                        "other compiled kernels", "softmax and cross-entropy"))
    assert rows["compiled elementwise, norms, reductions"]["ms"] == pytest.approx(
        compiled + small, abs=0.02)
    assert rows["copies and memsets"]["ms"] == pytest.approx(
        by_name["copies and memsets"] - memsets, abs=0.006)
    assert sum(row["ms"] for row in table) == pytest.approx(sum(by_name.values()), abs=0.05)
