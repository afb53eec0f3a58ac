"""Model section: the GPT and its document-causal sliding-window attention mask, on CPU in fp32."""
import math

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from train_gpt import GPT, UserError, build_block_mask, dense_attention_mask

EOT = 50256


def token_mask(inputs, window_blocks, block_size=128):
    """The mask per token: the key is not in the future, in the query's document (the one
    opened by the latest end-of-text at or before it) and at most window_blocks - 1 blocks back."""
    tokens = np.asarray(inputs)
    latest_eot = np.maximum.accumulate(np.where(tokens == EOT, np.arange(len(tokens)), -1))
    q, k = np.arange(len(tokens))[:, None], np.arange(len(tokens))[None, :]
    return ((k <= q) & (latest_eot[q] == latest_eot[k])
            & (q // block_size - k // block_size < window_blocks))


def random_documents(rng, num_blocks, layout):
    """Token sequences with documents laid out in one of several shapes."""
    n = num_blocks * 128
    tokens = rng.integers(0, 50000, size=n)
    if layout == "many_short":
        tokens[rng.random(n) < 0.02] = EOT
    elif layout == "few_long":  # documents spanning many blocks
        tokens[rng.choice(n, size=2, replace=False)] = EOT
    elif layout == "block_edges":  # boundaries exactly on block edges
        tokens[128 * rng.choice(num_blocks, size=max(1, num_blocks // 3), replace=False)] = EOT
    elif layout == "starts_with_eot":
        tokens[0] = EOT
        tokens[rng.random(n) < 0.005] = EOT
    # "no_eot": one document that began before the sequence
    return torch.tensor(tokens)


LAYOUTS = ["many_short", "few_long", "block_edges", "starts_with_eot", "no_eot"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dense_mask_matches_per_token_rule(layout):
    rng = np.random.default_rng(LAYOUTS.index(layout))
    for trial in range(8):
        num_blocks = int(rng.integers(1, 12))
        inputs = random_documents(rng, num_blocks, layout)
        for window in [1, 2, 3, num_blocks, num_blocks + 5]:
            expected = token_mask(inputs, window)
            got = dense_attention_mask(inputs, torch.tensor(window)).numpy()
            assert np.array_equal(got, expected), (layout, trial, window)


def block_mask_to_dense(block_mask, inputs):
    """Expand a BlockMask from its kv lists: full blocks allowed, partial ones through mask_mod."""
    n = len(inputs)
    dense = torch.zeros(n, n, dtype=torch.bool)
    q_idx, kv_idx = torch.arange(n)[:, None], torch.arange(n)[None, :]
    per_token = block_mask.mask_mod(0, 0, q_idx, kv_idx)
    kinds = [(block_mask.kv_num_blocks, block_mask.kv_indices, False),
             (block_mask.full_kv_num_blocks, block_mask.full_kv_indices, True)]
    seen = set()
    for counts, indices, full in kinds:
        for q in range(n // 128):
            for kv in indices[0, 0, q, :counts[0, 0, q]].tolist():
                assert (q, kv) not in seen, "a block pair is both full and partial"
                seen.add((q, kv))
                rows, cols = slice(128 * q, 128 * (q + 1)), slice(128 * kv, 128 * (kv + 1))
                dense[rows, cols] = True if full else per_token[rows, cols]
    return dense


@pytest.mark.parametrize("layout", LAYOUTS)
def test_block_mask_matches_per_token_rule(layout):
    rng = np.random.default_rng(10 + LAYOUTS.index(layout))
    for trial in range(4):
        num_blocks = int(rng.integers(1, 10))
        inputs = random_documents(rng, num_blocks, layout)
        for window in [1, 2, num_blocks + 3]:
            block_mask = build_block_mask(inputs, torch.tensor(window))
            expected = torch.from_numpy(token_mask(inputs, window))
            assert torch.equal(block_mask_to_dense(block_mask, inputs), expected)


def test_full_blocks_are_exactly_the_blocks_inside_one_document():
    inputs = torch.full((6 * 128,), 7)
    inputs[0], inputs[3 * 128 + 5] = EOT, EOT  # document 1: blocks 0..3 (part), document 2 after
    block_mask = build_block_mask(inputs, torch.tensor(3))
    counts, indices = block_mask.full_kv_num_blocks[0, 0], block_mask.full_kv_indices[0, 0]
    full = {(q, kv) for q in range(6) for kv in indices[q, :counts[q]].tolist()}
    assert full == {(1, 0), (2, 0), (2, 1), (5, 4)}


def test_compiled_flex_attention_matches_dense_sdpa():
    torch.manual_seed(0)
    rng = np.random.default_rng(3)
    flex = torch.compile(flex_attention, dynamic=False)  # eager flex ignores the block lists
    for layout, window in [("many_short", 2), ("few_long", 3), ("block_edges", 1)]:
        inputs = random_documents(rng, 8, layout)
        q, k, v = torch.randn(3, 1, 2, 8 * 128, 64).unbind(0)
        got = flex(q, k, v, block_mask=build_block_mask(inputs, torch.tensor(window)))
        expected = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=dense_attention_mask(inputs, torch.tensor(window)))
        assert (got - expected).abs().max() < 1e-4, layout


# ----------------------------------------------------------------------------- the model


def perturbed(model, seed=0, scale=0.05):
    """Give every parameter, the zero-initialised ones included, random nonzero values."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return model


def rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)


def reference_loss(model, inputs, targets, window, num_layers, num_heads):
    """The model written out plainly, reading the model's parameters by name."""
    p = dict(model.named_parameters())
    T, D = len(inputs), p["embed.weight"].size(1)
    hd = D // num_heads
    k_ve = min(3, num_layers // 2)
    freq = torch.cat([(1 / 1024) ** torch.linspace(0, 1, hd // 4), torch.zeros(hd // 4)])
    angle = torch.arange(T, dtype=torch.float32)[:, None] * freq  # (T, hd/2)
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]

    def rope(x):  # (T, heads, hd)
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)

    allowed = torch.from_numpy(token_mask(inputs, window))
    x0 = rms(p["embed.weight"][inputs])
    x, stack = x0, []
    for i in range(num_layers):
        if i >= num_layers // 2:
            x = x + p["skip_weights"][i - num_layers // 2] * stack.pop()
        lam = p[f"blocks.{i}.lambdas"]
        x = lam[0] * x + lam[1] * x0
        if i != 7:
            a = f"blocks.{i}.attn."
            h = rms(x)
            q, k, v = (h @ p[a + n + ".weight"].T for n in ("c_q", "c_k", "c_v"))
            v = p[a + "lambdas"][0] * v
            table = i if i < k_ve else i - (num_layers - k_ve) if i >= num_layers - k_ve else None
            if table is not None:
                v = v + p[a + "lambdas"][1] * p[f"value_embeds.{table}.weight"][inputs]
            q, k, v = (t.view(T, num_heads, hd) for t in (q, k, v))
            q, k = rope(rms(q)), rope(rms(k))
            scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
            weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
            y = torch.einsum("hqk,khd->qhd", weights, v).reshape(T, D)
            x = x + y @ p[a + "c_proj.weight"].T
        m = f"blocks.{i}.mlp."
        x = x + torch.relu(rms(x) @ p[m + "c_fc.weight"].T).square() @ p[m + "c_proj.weight"].T
        if i < num_layers // 2:
            stack.append(x)
    logits = rms(x) @ p["lm_head.weight"].T
    logits = 15 * torch.tanh(logits / 15)
    return torch.nn.functional.cross_entropy(logits, targets)


@pytest.mark.parametrize("num_layers", [12, 4])
def test_forward_matches_the_spec_written_out(num_layers):
    torch.manual_seed(0)
    model = perturbed(GPT(vocab_size=50257, num_layers=num_layers, num_heads=2, model_dim=64,
                          max_seq_len=1024))
    rng = np.random.default_rng(0)
    tokens = torch.tensor(np.where(rng.random(513) < 0.01, EOT, rng.integers(0, 50257, 513)))
    inputs, targets = tokens[:-1], tokens[1:]
    for window in [1, 3]:
        got = model(inputs, targets, torch.tensor(window))
        expected = reference_loss(model, inputs, targets, window, num_layers, 2)
        assert abs(got.item() - expected.item()) < 1e-5, window


def test_loss_at_initialisation_is_log_of_padded_vocab():
    torch.manual_seed(0)
    model = GPT(vocab_size=50257, num_layers=12, num_heads=6, model_dim=768, max_seq_len=1024)
    tokens = torch.randint(0, 50257, (257,))
    loss = model(tokens[:-1], tokens[1:], torch.tensor(1))
    assert model.lm_head.weight.size(0) == 50304
    assert abs(loss.item() - math.log(50304)) < 1e-4


def test_reference_config_parameter_count():
    with torch.device("meta"):
        model = GPT(vocab_size=50257, num_layers=12, num_heads=6, model_dim=768)
    sizes = {name: p.numel() for name, p in model.named_parameters()}
    assert sum(sizes.values()) == 275_742_772
    assert sizes["embed.weight"] == 38_633_472 and sizes["lm_head.weight"] == 38_633_472
    assert sum(n for k, n in sizes.items() if k.startswith("value_embeds")) == 115_900_416
    assert sum(n for k, n in sizes.items() if model.get_parameter(k).ndim < 2) == 52
    assert [i for i, block in enumerate(model.blocks) if block.attn is None] == [7]
    block_matrices = sum(n for k, n in sizes.items() if k.startswith("blocks") and ".c_" in k)
    assert block_matrices + sizes["lm_head.weight"] == 121_208_832


def test_initialisation_follows_pytorch_defaults():
    torch.manual_seed(0)
    model = GPT(vocab_size=50257, num_layers=12, num_heads=6, model_dim=768, max_seq_len=128)
    bound = 1 / math.sqrt(768)
    for i, block in enumerate(model.blocks):
        linears = [block.mlp.c_fc] + ([] if block.attn is None else
                                      [block.attn.c_q, block.attn.c_k, block.attn.c_v])
        for linear in linears:
            w = linear.weight
            assert w.dtype == torch.float32 and w.abs().max() <= bound
            assert w.abs().max() > 0.99 * bound and abs(w.std().item() - bound / math.sqrt(3)) < 1e-3
        zeros = [block.mlp.c_proj] + ([] if block.attn is None else [block.attn.c_proj])
        assert all(not z.weight.any() for z in zeros)
        assert block.lambdas.tolist() == [1.0, 0.0]
        if block.attn is not None:
            assert block.attn.lambdas.tolist() == [0.5, 0.5]
    assert not model.lm_head.weight.any() and model.skip_weights.tolist() == [1.0] * 6
    for table in [model.embed, *model.value_embeds]:
        assert abs(table.weight.std().item() - 1) < 1e-2 and abs(table.weight.mean().item()) < 1e-3
    assert len(model.value_embeds) == 3
    assert model.blocks[0].attn.rotary is model.blocks[11].attn.rotary  # one table for all layers
    assert all(name not in model.state_dict() for name, _ in model.named_buffers())


def test_embeddings_in_bf16_keep_the_stream_in_bf16():
    torch.manual_seed(0)
    model = perturbed(GPT(vocab_size=1000, num_layers=4, num_heads=2, model_dim=64,
                          max_seq_len=256, embed_dtype=torch.bfloat16))
    assert model.embed.weight.dtype == torch.bfloat16
    assert all(t.weight.dtype == torch.bfloat16 for t in model.value_embeds)
    assert model.blocks[0].mlp.c_fc.weight.dtype == torch.float32  # fp32 master weights
    seen = []
    for block in model.blocks:
        block.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    tokens = torch.randint(0, 1000, (257,))
    loss = model(tokens[:-1], tokens[1:], torch.tensor(2))
    assert seen == [torch.bfloat16] * 4 and loss.dtype == torch.float32


N = None
SHAPES = [  # (layers, layers without attention, the value table of each layer)
    (12, (7,), [0, 1, 2, N, N, N, N, N, N, 0, 1, 2]),  # the reference
    (12, (0, 9), [N, 0, 1, N, N, N, N, N, N, N, 0, 1]),  # the first table's layers have none
    (5, (1,), [0, N, N, 0, 1]),  # the second table feeds one layer
    (2, (0, 1), [N, N]),  # no attention at all
    (1, (), [N]),  # and no decoder layer, so no skip weight
]


@pytest.mark.parametrize("num_layers, no_attention_layers, tables", SHAPES,
                         ids=[f"{n}-layers-without-{a}" for n, a, _ in SHAPES])
def test_every_parameter_gets_a_finite_gradient(num_layers, no_attention_layers, tables):
    """DDP stops at the second step when a parameter has no gradient, so the model holds only
    what its layers use."""
    torch.manual_seed(0)
    model = perturbed(GPT(vocab_size=50257, num_layers=num_layers, num_heads=2, model_dim=64,
                          max_seq_len=512, no_attention_layers=no_attention_layers))
    assert model.ve_index == tables and len(model.value_embeds) == len(set(tables) - {N})
    assert (model.skip_weights is None) == (num_layers == 1)
    tokens = torch.randint(0, 50257, (257,))
    tokens[[0, 100, 200]] = EOT
    model(tokens[:-1], tokens[1:], torch.tensor(2)).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all() and p.grad.abs().max() > 0, name


def test_each_value_embedding_table_is_looked_up_once():
    """Both layers of a table take one lookup: a second would add a dense embedding backward."""
    torch.manual_seed(0)
    model = perturbed(GPT(vocab_size=1000, num_layers=12, num_heads=2, model_dim=64,
                          max_seq_len=256))
    calls = []
    for index, table in enumerate(model.value_embeds):
        table.register_forward_hook(lambda module, args, out, index=index: calls.append(index))
    tokens = torch.randint(0, 1000, (257,))
    model(tokens[:-1], tokens[1:], torch.tensor(2)).backward()
    assert sorted(calls) == [0, 1, 2]
    for table in model.value_embeds:  # and the shared lookup still trains both of its layers
        assert table.weight.grad is not None and table.weight.grad.abs().max() > 0


@pytest.mark.parametrize("length, message", [(200, "multiple of 128"), (1024 + 128, "at most 1024")])
def test_bad_sequence_length_is_refused(length, message):
    model = GPT(vocab_size=1000, num_layers=2, num_heads=2, model_dim=64, max_seq_len=1024)
    tokens = torch.zeros(length, dtype=torch.long)
    with pytest.raises(UserError, match=message):
        model(tokens, tokens, torch.tensor(1))


@pytest.mark.parametrize("bad", [1000, 5000, -1])
def test_tokens_outside_the_vocab_are_refused(bad):
    model = GPT(vocab_size=1000, num_layers=2, num_heads=2, model_dim=64, max_seq_len=1024)
    tokens = torch.zeros(128, dtype=torch.long)
    tokens[5] = bad
    with pytest.raises(UserError, match=r"token ids must lie in \[0, 1000\)"):
        model(tokens, tokens, torch.tensor(1))


def test_heads_that_do_not_divide_the_width_are_refused():
    with pytest.raises(UserError, match="--model_dim=100 must split into --num_heads=3 heads"):
        GPT(vocab_size=1000, num_layers=2, num_heads=3, model_dim=100)


def test_compiles_whole_without_graph_breaks_or_recompiles():
    torch.manual_seed(0)
    model = perturbed(GPT(vocab_size=50257, num_layers=4, num_heads=2, model_dim=64,
                          max_seq_len=512))
    tokens = torch.randint(0, 50257, (513,))
    tokens[[0, 300]] = EOT
    inputs, targets = tokens[:-1], tokens[1:]
    window = torch.tensor(1)
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    losses = []
    for w in [1, 3]:
        window.fill_(w)  # in place, as the training loop does
        with torch.compiler.set_stance("fail_on_recompile" if w == 3 else "default"):
            losses.append((compiled(inputs, targets, window).item(),
                           model(inputs, targets, window).item()))
    for compiled_loss, eager_loss in losses:
        assert abs(compiled_loss - eager_loss) < 1e-5
    assert abs(losses[0][0] - losses[1][0]) > 1e-4  # the window really changed the result


def test_vocab_is_padded_to_a_multiple_of_128():
    model = GPT(vocab_size=1050, num_layers=2, num_heads=2, model_dim=64, max_seq_len=128)
    assert model.embed.weight.size(0) == model.lm_head.weight.size(0) == 1152
    assert model.value_embeds[0].weight.size(0) == 1152
