"""The map of a profiled training step: where the GPU time of forward+backward goes, family by
family, and how far each family is from its floor.

Made by bench_step.py --profile from torch.profiler's Chrome trace, with the operators' shapes
recorded. A kernel's family comes from the operator that launched it (the trace links the two by
their External id):
- a matrix product (aten::mm, aten::addmm) by its weight's shape, its three dims (m, k, n) less
  one that is a micro-batch's tokens: every product of a layer has that count once, and it may
  equal a width (512 tokens, an MLP 512 wide, in the smoke preset on a GPU). A weight as wide
  as the vocabulary is the head's, one as wide as the MLP's hidden layer the MLP's, any other
  the attention's projections; a product without a micro-batch's tokens among its dims goes by
  all three. The MLP's own kernel (ReLU^2 in its products) is a family of its own;
- FlexAttention's forward and backward by their template kernels;
- the head's loss by its kernel's name;
- the compiled elementwise work (norms, residual, rotary, mixing) by Inductor's name prefix;
- copies and memsets (but those a product launches, as cuBLAS does, are the product's); the
  rest is "other".

Floors:
- products: their FLOPs (2 m k n each, from the shapes) at the rate that the fastest family of
  products reaches in the same trace;
- attention: per allowed (query, key) pair, 4 x model_dim FLOPs forward and 10 x model_dim
  backward (its five products: the scores again, and the gradients of the probabilities, values,
  queries and keys), at that rate;
- the head's loss: the logits read once and written once, 4 bytes per token and vocabulary
  column, at `bandwidth`;
- compiled kernels: the bytes Inductor counts for each launch (`kernel_num_gb`, in the trace when
  the step was compiled with torch._inductor.config.benchmark_kernel on), at `bandwidth`;
- copies: the bytes read and written; memsets: the bytes written.
Kernels that start inside an annotated range (the optimizers' steps) are not on the map.
"""
import collections
import dataclasses

PRODUCT_OPS = ("aten::mm", "aten::addmm")  # and the MLP kernel's custom op, by its name


@dataclasses.dataclass
class ProfiledWork:
    """What the map needs to know of the model and of the profiled steps, all steps together."""
    model_dim: int
    hidden: int  # the MLP's width
    vocab_size: int
    tokens: int
    attention_pairs: int  # allowed (query, key) pairs, summed over sequences and layers
    micro_batches: int


def product_dims(op):
    """(m, k, n) of a product operator's recorded shapes; None where there are none."""
    dims = op.get("args", {}).get("Input Dims") or []
    a, b = (list(dims[1:3] if op["name"].endswith("addmm") else dims[:2]) + [[], []])[:2]
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return a[0], a[1], b[1]
    return None


def weight_dims(dims, work):
    """The dims of a product that are its weight's shape: all but one that is a micro-batch's
    tokens (m in the forward and the input's gradient, k in the weight's gradient), which could
    otherwise pass for a width; all three where none is."""
    tokens = work.tokens // work.micro_batches
    if tokens not in dims:
        return dims
    rest = list(dims)
    rest.remove(tokens)
    return tuple(rest)


def kernel_family(event, op, work):
    """(family, FLOPs, bytes) of one GPU event, given the operator that launched it (or None).
    FLOPs and bytes are None where the family's floor is not known; a product's FLOPs are given
    with its operator's first kernel only."""
    name, op_name = event["name"], op["name"] if op else ""
    if op_name in PRODUCT_OPS or op_name.endswith("::relu_square_matmul"):
        # each kernel of a product is the product's: cuBLAS's split-K reductions and memsets too
        dims = product_dims(op)
        if dims is None:
            return "products, shapes not recorded", None, 0
        weight = weight_dims(dims, work)
        role = ("head" if work.vocab_size in weight else
                "MLP's ReLU^2 kernel" if op_name.endswith("::relu_square_matmul") else
                "MLP" if work.hidden in weight else "attention's projections")
        return f"products: {role}", 2 * dims[0] * dims[1] * dims[2], 0
    if event.get("cat") == "gpu_memcpy":
        return "copies and memsets", 0, event["args"]["bytes"] * (2 if "DtoD" in name else 1)
    if event.get("cat") == "gpu_memset":
        return "copies and memsets", 0, event["args"]["bytes"]
    if name.startswith("triton_tem_") and "flex_attention" in name:
        backward = "backward" in name
        flops = (10 if backward else 4) * work.model_dim * work.attention_pairs
        return f"FlexAttention {'backward' if backward else 'forward'}", flops, 0
    if "softcapped_cross_entropy" in name:
        return "head's loss kernel", 0, 4 * work.tokens * work.vocab_size
    if name.startswith("triton_"):
        gb = op.get("args", {}).get("kernel_num_gb") if op else None
        return "compiled elementwise, norms, reductions", 0, None if gb is None else gb * 1e9
    return "other", None, None


def step_map(trace, work, bandwidth):
    """The map's rows, per micro-batch: family, launches, ms, TFLOP, GB, floor ms, gap ms (the
    floor and gap None where unknown), the slowest family first; and the products' rate, TFLOP/s.
    `bandwidth` is the memory-bound floors' rate, in bytes per second.

    Whole-family quantities (an attention family's FLOPs, the head's bytes) are counted once,
    however many kernels share them; a product's FLOPs once per operator."""
    events = trace["traceEvents"]
    ops = {e["args"]["External id"]: e for e in events
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    ranges = [(e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("cat") == "gpu_user_annotation"]
    rows = collections.defaultdict(lambda: dict(launches=0, us=0.0, flops=0, bytes=0))
    whole_family, counted_ops = {}, set()
    for e in events:
        if (e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")
                or any(start <= e["ts"] < end for start, end in ranges)):
            continue
        op_id = e.get("args", {}).get("External id")
        family, flops, nbytes = kernel_family(e, ops.get(op_id), work)
        row = rows[family]
        row["launches"] += 1
        row["us"] += e["dur"]
        if family.startswith("FlexAttention") or family == "head's loss kernel":
            whole_family[family] = (flops, nbytes)
            continue
        if family.startswith("products"):
            if op_id in counted_ops:
                continue
            counted_ops.add(op_id)
        for key, value in (("flops", flops), ("bytes", nbytes)):
            row[key] = None if value is None or row[key] is None else row[key] + value
    for family, (flops, nbytes) in whole_family.items():
        rows[family].update(flops=flops, bytes=nbytes)
    rate = max((row["flops"] / row["us"] * 1e6 for family, row in rows.items()
                if family.startswith("products:") and row["us"]), default=None)
    per = work.micro_batches
    table = []
    for family, row in rows.items():
        if row["flops"] is None or row["bytes"] is None or (row["flops"] and rate is None):
            floor = None
        else:
            floor = (row["flops"] / rate if row["flops"] else row["bytes"] / bandwidth) * 1e3
        ms = row["us"] / 1e3
        table.append(dict(family=family, launches=row["launches"] / per, ms=ms / per,
                          tflop=row["flops"] / 1e12 / per if row["flops"] else None,
                          gb=row["bytes"] / 1e9 / per if row["bytes"] else None,
                          floor_ms=None if floor is None else floor / per,
                          gap_ms=None if floor is None else (ms - floor) / per))
    table.sort(key=lambda row: row["ms"], reverse=True)
    return table, None if rate is None else rate / 1e12


def map_report(table, rate, bandwidth):
    """The map as the lines of a Markdown table."""
    show = lambda x, f: "" if x is None else format(x, f)  # noqa: E731
    lines = [f"Per micro-batch. Floors: products and attention at {show(rate, '.0f') or '?'} "
             f"TFLOP/s (the fastest products here), the rest at {bandwidth / 1e12:.3g} TB/s.", "",
             "| family | launches | ms | TFLOP | GB | floor ms | gap ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['family']} | {r['launches']:g} | {r['ms']:.2f} | {show(r['tflop'], '.2f')} "
              f"| {show(r['gb'], '.1f')} | {show(r['floor_ms'], '.2f')} "
              f"| {show(r['gap_ms'], '.2f')} |" for r in table]
    total = sum(r["ms"] for r in table)
    lines.append(f"| all | {sum(r['launches'] for r in table):g} | {total:.2f} | | | | |")
    return lines
