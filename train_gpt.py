"""The GPT-2 speedrun: train a GPT-2-small-sized model on FineWeb to a validation loss of 3.28.

Launch with `torchrun --standalone --nproc_per_node=8 train_gpt.py` (or `./run.sh`); `--help`
lists the hyperparameters. The file reads top to bottom: hyperparameters, Muon, model, data and
training with its loop; then what the loop needs around it, checkpoints and stops, and the GPU
kernels. Importing it has no side effects: all runs in `main()`.
"""
import argparse
import ast
import contextlib
import dataclasses
import functools
import glob
import hashlib
import inspect
import math
import os
import pickle
import re
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import typing
import uuid
import zipfile

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._pytree import tree_map_only
from tqdm import tqdm

# What newer PyTorch renamed, under the name the PyTorch at hand has: from 2.14 on the gather is
# all_gather_single, and DDP's flag for the buffers is forward_sync_buffers.
all_gather_into_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
DDP_BUFFER_SYNC = ("forward_sync_buffers" if "forward_sync_buffers"
                   in inspect.signature(DDP).parameters else "broadcast_buffers")

# ----------------------------------------------------------------------------- hyperparameters

def option(default, text):
    """A hyperparameter's default, and the line `--help` shows for it."""
    return dataclasses.field(default=default, metadata=dict(help=text))

@dataclasses.dataclass
class Hyperparameters:
    """The reference configuration; `--name=value` changes a field, `--help` lists them all."""
    # data
    train_files: str = option("data/fineweb10B/fineweb_train_*.bin", "shards, read in sorted order")
    val_files: str = option("data/fineweb10B/fineweb_val_*.bin", "validation uses the first shard")
    val_tokens: int = option(10_485_760, "validate on this many tokens from the val shard's start")
    batch_size: int = option(8 * 64 * 1024, "tokens per step, over all ranks")
    micro_batch_size: int = option(64 * 1024, "tokens per forward/backward: one flat sequence")
    # model
    vocab_size: int = option(50257, "GPT-2's tokens; embeddings and head are padded to 50304")
    num_layers: int = option(12, "transformer blocks")
    num_heads: int = option(6, "attention heads per block")
    model_dim: int = option(768, "width of the residual stream")
    no_attention_layers: tuple = option((7,), "layers with an MLP only, e.g. 1,3; the default's "
                                        "layer 7 is left out of models with fewer layers")
    softcap: float = option(15.0, "the head's logits are softcap * tanh(logits / softcap)")
    # optimization
    num_iterations: int = option(1390, "training steps")
    cooldown_frac: float = option(0.4, "the learning rates fall linearly to 0 over this last part")
    embed_lr: float = option(0.6, "Adam: token and value embeddings")
    head_lr: float = option(0.008, "Adam: the output head")
    scalar_lr: float = option(0.04, "Adam: the scalar mixing weights")
    muon_lr: float = option(0.05, "Muon: the matrices of the blocks")
    # run
    val_every: int = option(125, "validate every this many steps and after the last; 0: last only")
    compile_steps: int = option(10, "untimed steps that compile the model, then undone")
    seed: int = option(0, "seeds the initial weights")
    log_dir: str = option("logs", "log: <log_dir>/<run id>.txt; checkpoints: <log_dir>/<run id>/")
    checkpoint_every: int = option(0, "write the training state every this many steps; 0: never")
    save_checkpoint: bool = option(False, "write the training state after the last step")
    resume: str = option("", "continue from this checkpoint (a folder: its newest)")
    kernels: bool = option(True, "on a GPU, run the head's loss and the MLP through the Triton "
                           "kernels at the end of the file; false: through the recipe's torch code")

# A small model on the embedded Shakespeare sample: checks a setup on a CPU in about 2 minutes.
PRESETS = {
    "smoke": dict(train_files="data/shakespeare/shakespeare_train_*.bin",
                  val_files="data/shakespeare/shakespeare_val_*.bin", val_tokens=8 * 1024,
                  batch_size=1024, micro_batch_size=512, num_layers=4, num_heads=2,
                  model_dim=128, no_attention_layers=(), num_iterations=150, val_every=50,
                  compile_steps=0),
}

class UserError(Exception):
    """Bad input, or a run that cannot go on: shown as its message alone. Anything else is a
    bug, and keeps its traceback."""

class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # raise, so that a bad argument ends like any other bad input
        raise UserError(f"{message} (--help lists the hyperparameters)")

def parse_args(argv, config=Hyperparameters):
    """The `config` dataclass from `--name=value` arguments, on top of `--preset=NAME` if given.
    Each field is an option of its type, with its help; `--flag` alone is true."""
    parser = ArgumentParser(prog="train_gpt.py", allow_abbrev=False,
                            description=__doc__ and __doc__.split("\n")[0])  # -OO drops __doc__
    parser.add_argument("--preset", choices=PRESETS, default=argparse.SUPPRESS,
                        help="start from these values, e.g. smoke: " + str(PRESETS["smoke"]))
    types = typing.get_type_hints(config)  # types, where the annotations may be strings
    for field in dataclasses.fields(config):
        kind, text = types[field.name], field.metadata.get("help", "")
        parser.add_argument(f"--{field.name}", default=argparse.SUPPRESS, metavar=kind.__name__,
                            **(dict(nargs="?", const=True) if kind is bool else {}),
                            type={bool: true_or_false, tuple: comma_separated_ints}.get(kind, kind),
                            help=f"{text} (default: {field.default})".lstrip())
    given = vars(parser.parse_args(argv))
    return config(**{**PRESETS.get(given.pop("preset", None), {}), **given})

def true_or_false(text):
    values = {"true": True, "1": True, "false": False, "0": False}
    if text.lower() not in values:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return values[text.lower()]

def comma_separated_ints(text):
    return tuple(int(v) for v in text.split(",") if v.strip())

# ----------------------------------------------------------------------------- Muon

def zeropower_via_newtonschulz5(G, steps=5):
    """Approximately orthogonalize G (replace it by U V^T of its SVD) with a quintic iteration.

    The coefficients maximise the slope at zero rather than converge, so the singular values land
    roughly in (0.5, 1.5) instead of exactly 1, which does not hurt training. Runs in bf16 on a GPU
    and in fp32 on a CPU, where bf16 matrix products are slow."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16() if G.is_cuda else G.float()
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T
    X = X / (X.norm() + 1e-7)  # spectral norm at most 1
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.T if tall else X

class Muon(torch.optim.Optimizer):
    """MomentUm Orthogonalized by Newton-Schulz: SGD momentum whose update is orthogonalized.

    For 2-D hidden weights only (embeddings, the head and scalars belong to Adam). Parameters
    are grouped by size; in each group the ranks take chunks of world_size parameters, rank r
    orthogonalizes parameter r of the chunk, and an asynchronous all_gather shares the updates
    while the next chunk is computed. Every rank applies every update, so all keep identical
    weights. Rank and world size come from the process group (none: one process)."""

    def __init__(self, params, lr, momentum, nesterov=True, ns_steps=5):
        params = list(params)
        # Eager, one orthogonalization is ~45 kernels, each rounding to bf16; compiled, they are
        # fused, and each shape's are replayed as one CUDA graph, since launching them one by
        # one kept the GPU idle. On a CPU (fp32), compiling would only add start-up time.
        self.orthogonalize = (torch.compile(zeropower_via_newtonschulz5, dynamic=False,
                                            mode="reduce-overhead")
                              if any(p.is_cuda for p in params) else zeropower_via_newtonschulz5)
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world_size = dist.get_world_size() if distributed else 1
        sizes = sorted({p.numel() for p in params}, reverse=True)
        groups = [dict(params=[p for p in params if p.numel() == size]) for size in sizes]
        super().__init__(groups, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      ns_steps=ns_steps))
        self.update_buffers = {}  # per size: the updates of one chunk, one row per rank
        for size, group in zip(sizes, groups):
            p = group["params"][0]
            dtype = torch.bfloat16 if p.is_cuda else torch.float32
            self.update_buffers[size] = torch.empty(self.world_size * size, dtype=dtype,
                                                    device=p.device)

    def _orthogonalized_update(self, p, group):
        if p.grad is None:
            raise RuntimeError(f"a Muon parameter of shape {tuple(p.shape)} has no gradient")
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p.grad)
        buf = state["momentum_buffer"]
        buf.lerp_(p.grad, 1 - group["momentum"])
        g = p.grad.lerp_(buf, group["momentum"]) if group["nesterov"] else buf
        update = self.orthogonalize(g, steps=group["ns_steps"])
        # a copy: the next chunk's replay of the graph overwrites its output, with one process
        # before this update is applied, with several perhaps before the gather has read it
        return update.clone(memory_format=torch.contiguous_format).view(-1)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params, lr = group["params"], group["lr"]
            buffer = self.update_buffers[params[0].numel()]
            rows = buffer.view(self.world_size, -1)
            pending = None

            # every rank applies the whole chunk, in the same order
            def apply(handle, chunk, updates):
                if handle is not None:
                    handle.wait()
                for p, update in zip(chunk, updates):
                    p.add_(update.view_as(p), alpha=-lr * max(1, p.size(0) / p.size(1)) ** 0.5)

            for start in range(0, len(params), self.world_size):
                chunk = params[start:start + self.world_size]
                # a rank past the end of an uneven chunk sends a placeholder nobody applies
                update = (self._orthogonalized_update(chunk[self.rank], group)
                          if self.rank < len(chunk) else rows[self.rank])
                if pending is not None:
                    apply(*pending)
                if self.world_size == 1:  # nothing to gather: the update is applied as it is
                    pending = (None, chunk, [update])
                else:
                    handle = all_gather_into_tensor(buffer, update, async_op=True)
                    pending = (handle, chunk, rows)
            apply(*pending)

    def state_dict(self, gather=False):
        """The state, with the momentum buffers of the parameters this rank updates. For a
        checkpoint, gather=True: every rank calls it, and rank 0's result holds all the buffers."""
        state = super().state_dict()
        if gather and self.world_size > 1:
            mine = {i: {k: v.cpu() for k, v in s.items()} for i, s in state["state"].items()}
            parts = [None] * self.world_size if self.rank == 0 else None
            dist.gather_object(mine, parts, dst=0)
            if self.rank == 0:
                state["state"] = {i: s for part in parts for i, s in part.items()}
        return state

    def load_state_dict(self, state_dict):
        """Load a state_dict(), keeping copies of the buffers of the parameters this rank updates:
        the loaded tensors may be views of a larger one, or belong to the caller's snapshot."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for i, p in enumerate(group["params"]):
                if i % self.world_size != self.rank:
                    self.state.pop(p, None)
                elif "momentum_buffer" in self.state.get(p, {}):
                    self.state[p]["momentum_buffer"] = self.state[p]["momentum_buffer"].clone()

# ----------------------------------------------------------------------------- model
# GPT-2 small reshaped by the speedrun: RMS norm without weights, rotary positions, QK-norm,
# ReLU^2 MLPs, value embeddings, U-net skips, and attention only within each document and a
# window of recent 128-token blocks, which FlexAttention skips block by block.

EOT_TOKEN = 50256  # <|endoftext|>: every document starts with it
BLOCK_SIZE = 128  # FlexAttention block; the sliding window is counted in these

def norm(x):
    return F.rms_norm(x, (x.size(-1),))

class CastedLinear(nn.Linear):
    """A bias-free linear layer whose fp32 weight is cast to the activation dtype (bf16 on GPU)."""

    def __init__(self, in_features, out_features, zero_init=False):
        super().__init__(in_features, out_features, bias=False)
        if zero_init:
            with torch.no_grad():
                self.weight.zero_()

    def forward(self, x):
        return F.linear(x, self.weight.type_as(x))

class Rotary(nn.Module):
    """Half-truncated rotary embedding: half the head dims rotate, the other half do not."""

    def __init__(self, head_dim, max_seq_len):
        super().__init__()
        angular_freq = (1 / 1024) ** torch.linspace(0, 1, steps=head_dim // 4, dtype=torch.float32)
        angular_freq = torch.cat([angular_freq, angular_freq.new_zeros(head_dim // 4)])
        theta = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), angular_freq)
        self.cos = nn.Buffer(theta.cos(), persistent=False)
        self.sin = nn.Buffer(theta.sin(), persistent=False)

    def forward(self, x):  # x: (batch, seq, heads, head_dim)
        cos, sin = self.cos[None, :x.size(1), None, :], self.sin[None, :x.size(1), None, :]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1).type_as(x)

class CausalSelfAttention(nn.Module):
    def __init__(self, dim, num_heads, rotary):
        super().__init__()
        self.num_heads = num_heads
        self.c_q = CastedLinear(dim, dim)
        self.c_k = CastedLinear(dim, dim)
        self.c_v = CastedLinear(dim, dim)
        self.lambdas = nn.Parameter(torch.tensor([0.5, 0.5]))  # mix of v and the value embedding
        self.rotary = rotary  # one module, shared by every layer
        self.c_proj = CastedLinear(dim, dim, zero_init=True)

    def forward(self, x, ve, mask):
        B, T = x.size(0), x.size(1)
        q = self.c_q(x).view(B, T, self.num_heads, -1)
        k = self.c_k(x).view(B, T, self.num_heads, -1)
        v = self.c_v(x).view(B, T, self.num_heads, -1)
        v = self.lambdas[0] * v
        if ve is not None:
            v = v + self.lambdas[1] * ve.view_as(v)
        q, k = self.rotary(norm(q)), self.rotary(norm(k))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if isinstance(mask, BlockMask):
            y = flex_attention(q, k, v, block_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view_as(x))

def relu_square_mlp(x, w_fc, w_proj):
    """The MLP: ReLU^2 between two products, relu(x w_fc^T)^2 w_proj^T."""
    return F.linear(F.relu(F.linear(x, w_fc)).square(), w_proj)

class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.c_fc = CastedLinear(dim, 4 * dim)
        self.c_proj = CastedLinear(4 * dim, dim, zero_init=True)
        self.relu_square_mlp = relu_square_mlp  # or the Triton kernel that computes it

    def forward(self, x):  # the function takes the rows of the one sequence of the batch
        return self.relu_square_mlp(x[0], self.c_fc.weight.type_as(x),
                                    self.c_proj.weight.type_as(x))[None]

class Block(nn.Module):
    def __init__(self, dim, num_heads, rotary, has_attention):
        super().__init__()
        self.attn = CausalSelfAttention(dim, num_heads, rotary) if has_attention else None
        self.mlp = MLP(dim)
        self.lambdas = nn.Parameter(torch.tensor([1.0, 0.0]))  # mix of the stream and x0

    def forward(self, x, ve, x0, mask):
        x = self.lambdas[0] * x + self.lambdas[1] * x0
        if self.attn is not None:
            x = x + self.attn(norm(x), ve, mask)
        return x + self.mlp(norm(x))

def attention_blocks(inputs, window_blocks):
    """The document-causal sliding-window mask of `inputs`, block by block: (any_allowed,
    all_allowed, document_causal). The one definition of the mask, which both attention paths
    expand: FlexAttention on a GPU (`build_block_mask`), a dense mask on a CPU.

    A block pair (q, kv) is skipped when it lies in the future, beyond the window or between
    disjoint documents; it is "full" (all_allowed) when every entry is allowed (an earlier block
    in the window and both blocks inside one document), so the kernel needs no per-token check;
    the rest of any_allowed are "partial", and go through document_causal(b, h, q_idx, kv_idx)."""
    docs = (inputs == EOT_TOKEN).cumsum(0)
    doc_start = torch.searchsorted(docs, docs, out_int32=True)  # where a position's doc starts
    docs_low = docs.view(-1, BLOCK_SIZE)[:, 0].contiguous()
    docs_high = docs.view(-1, BLOCK_SIZE)[:, -1].contiguous()
    block_idx = torch.arange(len(docs_low), dtype=torch.int32, device=inputs.device)
    q_blk, kv_blk = block_idx[:, None], block_idx[None, :]
    in_window = q_blk - kv_blk < window_blocks
    low_q, high_q, low_kv, high_kv = docs_low[:, None], docs_high[:, None], docs_low, docs_high
    docs_overlap = (low_q <= high_kv) & (low_kv <= high_q)
    one_doc = (low_q == high_kv) & (low_kv == high_q)
    any_allowed = (q_blk >= kv_blk) & in_window & docs_overlap
    all_allowed = (q_blk > kv_blk) & in_window & one_doc

    def document_causal(b, h, q_idx, kv_idx):  # one lookup per entry, not two
        return (doc_start[q_idx] <= kv_idx) & (kv_idx <= q_idx)

    return any_allowed, all_allowed, document_causal

def build_block_mask(inputs, window_blocks):
    """The mask of `attention_blocks` as FlexAttention's BlockMask: per query block, the partial
    and the full kv blocks. No T x T tensor is ever made."""
    any_allowed, all_allowed, document_causal = attention_blocks(inputs, window_blocks)

    def as_kv_lists(block_pairs):  # per query block: how many kv blocks, and which, listed first
        counts = block_pairs.sum(dim=-1, dtype=torch.int32)
        indices = block_pairs.argsort(dim=-1, descending=True, stable=True).to(torch.int32)
        return counts[None, None].contiguous(), indices[None, None].contiguous()

    return BlockMask.from_kv_blocks(*as_kv_lists(any_allowed & ~all_allowed),
                                    *as_kv_lists(all_allowed),
                                    BLOCK_SIZE=BLOCK_SIZE, mask_mod=document_causal)

def dense_attention_mask(inputs, window_blocks):
    """The mask of `attention_blocks` as a T x T bool tensor (True = may attend), the entries
    FlexAttention computes: every entry of a full block pair, document_causal's in a partial one."""
    any_allowed, all_allowed, document_causal = attention_blocks(inputs, window_blocks)
    pos = torch.arange(len(inputs), device=inputs.device)

    def per_entry(block_pairs):
        return block_pairs.repeat_interleave(BLOCK_SIZE, 0).repeat_interleave(BLOCK_SIZE, 1)
    return per_entry(all_allowed) | (per_entry(any_allowed)
                                     & document_causal(0, 0, pos[:, None], pos[None, :]))

def head_loss(x, weight, targets, softcap):
    """The head and its loss: the mean cross-entropy of `targets` under the logits of `x` (rows:
    tokens), capped to (-softcap, softcap) in the activation dtype, then taken to fp32."""
    logits = F.linear(x, weight)
    logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits.float(), targets)

class GPT(nn.Module):
    """GPT-2 small with the speedrun's changes: value embeddings, U-net skips, x0 mixing, ReLU^2.

    Layers 0..L/2-1 are the encoder, the rest the decoder; each decoder block first adds a
    weighted encoder output, last in first out. Three value-embedding tables feed the value
    projections of the first three and the last three layers (pattern 012...012)."""

    def __init__(self, vocab_size, num_layers, num_heads, model_dim, max_seq_len=65536,
                 no_attention_layers=(7,), embed_dtype=torch.float32, softcap=15.0):
        super().__init__()
        check_heads(model_dim, num_heads)
        self.vocab_size, self.max_seq_len, self.softcap = vocab_size, max_seq_len, softcap
        padded_vocab = -(-vocab_size // 128) * 128  # aligned matrices run faster
        # DDP stops at the second step on a parameter without a gradient: a value table is built
        # only if one of its layers has attention, the skip weights only if a decoder layer does.
        attention = [i not in no_attention_layers for i in range(num_layers)]
        num_ve = min(3, num_layers // 2)  # value tables, each feeding an early and a late layer
        # 12 layers: tables [0, 1, 2, None, None, None, None, None, None, 0, 1, 2] by layer
        pattern = [*range(num_ve), *[None] * (num_layers - 2 * num_ve), *range(num_ve)]
        used = [table if attends else None for table, attends in zip(pattern, attention)]
        tables = sorted(set(used) - {None})
        self.ve_index = [None if table is None else tables.index(table) for table in used]
        self.embed = nn.Embedding(padded_vocab, model_dim)
        self.value_embeds = nn.ModuleList([nn.Embedding(padded_vocab, model_dim) for _ in tables])
        rotary = Rotary(model_dim // num_heads, max_seq_len)
        self.blocks = nn.ModuleList([Block(model_dim, num_heads, rotary, has_attention)
                                     for has_attention in attention])
        self.num_encoder_layers = num_layers // 2
        self.skip_weights = (nn.Parameter(torch.ones(self.num_encoder_layers))
                             if self.num_encoder_layers else None)
        self.lm_head = CastedLinear(model_dim, padded_vocab, zero_init=True)
        self.head_loss = head_loss  # or the Triton kernel that computes it
        for table in [self.embed, *self.value_embeds]:  # initialised in fp32, then cast in place:
            table.to(embed_dtype)  # with bf16 tables the whole residual stream runs in bf16

    def forward(self, inputs, targets, window_blocks):
        """Mean cross-entropy of `targets` given one flat sequence `inputs` of documents."""
        check_tokens(inputs, self.vocab_size, self.max_seq_len)
        make_mask = build_block_mask if inputs.is_cuda else dense_attention_mask
        mask = make_mask(inputs, window_blocks)
        x = x0 = norm(self.embed(inputs)[None])
        tables = [table(inputs) for table in self.value_embeds]  # once each, shared by its layers
        ve = [None if i is None else tables[i] for i in self.ve_index]
        skips = []
        for i, block in enumerate(self.blocks):
            if i >= self.num_encoder_layers and skips:
                x = x + self.skip_weights[i - self.num_encoder_layers] * skips.pop()
            x = block(x, ve[i], x0, mask)
            if i < self.num_encoder_layers:
                skips.append(x)
        return self.head_loss(norm(x)[0], self.lm_head.weight.type_as(x), targets, self.softcap)

def check_heads(model_dim, num_heads):
    if num_heads <= 0 or model_dim % num_heads or (model_dim // num_heads) % 4:
        raise UserError(f"--model_dim={model_dim} must split into --num_heads={num_heads} heads, "
                        f"each of a size that is a multiple of 4 (rotary)")

def check_tokens(inputs, vocab_size, max_seq_len):
    """Refuse inputs the model cannot take (their values only when eager; the loader checks)."""
    if inputs.ndim != 1 or len(inputs) % BLOCK_SIZE or len(inputs) > max_seq_len:
        raise UserError(f"inputs must be one flat sequence whose length is a multiple of "
                        f"{BLOCK_SIZE} and at most {max_seq_len}; got shape {tuple(inputs.shape)}")
    if not torch.compiler.is_compiling():  # a host sync, so eager calls only
        low, high = int(inputs.min()), int(inputs.max())
        if low < 0 or high >= vocab_size:
            raise UserError(f"token ids must lie in [0, {vocab_size}); got [{low}, {high}]")

# ----------------------------------------------------------------------------- data

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256  # little-endian int32: magic, version, token count, then zeros
HEADER_BYTES = HEADER_INTS * 4
DOWNLOAD_HINT = "download the shards with `python data/cached_fineweb10B.py 8`"

def write_shard(path, tokens):
    """Write GPT-2 token ids as one shard: a 1024-byte header, then the tokens as uint16."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**16):
        raise ValueError(f"{path}: token ids must lie in [0, 65535] to be stored as uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = SHARD_MAGIC, SHARD_VERSION, tokens.size
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())

def check_shard(path):
    """Validate a shard's header against its size on disk; return its token count."""
    if os.path.isdir(path):  # e.g. --train_files=data/fineweb10B
        patterns = sorted({os.path.join(path, re.sub(r"\d+(?=\D*$)", "*", name))
                           for name in os.listdir(path) if name.endswith(".bin")})
        fix = (f"name the shards, as a pattern such as {' or '.join(map(repr, patterns))}"
               if patterns else f"and holds no .bin file; {DOWNLOAD_HINT}")
        raise UserError(f"{path} is a folder, not a shard{': ' if patterns else ', '}{fix}")
    try:
        with open(path, "rb") as f:
            header = f.read(HEADER_BYTES)
    except PermissionError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror})") from None
    size = os.path.getsize(path)
    header = np.frombuffer(header, dtype="<i4") if len(header) == HEADER_BYTES else None
    expected = None if header is None else HEADER_BYTES + 2 * int(header[2])
    if header is None:
        problem = f"file is {size} bytes, shorter than the {HEADER_BYTES}-byte header: truncated"
    elif header[0] != SHARD_MAGIC:
        problem = f"magic number is {header[0]}, expected {SHARD_MAGIC}: not a token shard"
    elif header[1] != SHARD_VERSION:
        problem = f"shard version is {header[1]}, this script reads version {SHARD_VERSION}"
    elif size != expected:
        problem = (f"header claims {header[2]} tokens ({expected} bytes) but the file is {size} "
                   f"bytes, {'shorter' if size < expected else 'longer'} than that")
    else:
        return int(header[2])
    raise UserError(f"{path}: {problem}; {DOWNLOAD_HINT}")

def read_shard(path):
    """A shard's tokens as a uint16 tensor mapped from the file, after checking its header:
    pages are read as they are first used, and the ranks of a node share them."""
    num_tokens = check_shard(path)
    header_tokens = HEADER_BYTES // 2
    mapped = torch.from_file(str(path), shared=False, size=header_tokens + num_tokens,
                             dtype=torch.uint16)  # private: writes would never reach the file
    return mapped[header_tokens:]

def rank_share(batch_size, world_size):
    """How many tokens of a batch each rank takes; a batch that does not split is refused."""
    if batch_size % world_size:
        raise UserError(f"a batch of {batch_size} tokens does not split over {world_size} ranks; "
                        f"make --batch_size a multiple of {world_size}")
    return batch_size // world_size

class DistributedDataLoader:
    """Walks the sorted shards in order; each call hands every rank its slice of one batch.

    The stream is fixed by the speedrun rules: with global batch B and world size W, rank r takes
    tokens [p + r*B/W, p + (r+1)*B/W + 1) of the current shard, then p advances by B. A shard is
    left (wrapping around after the last) as soon as p + B + 1 would reach its end. Shards are
    memory-mapped (the kernel reads the next one ahead), and a slice goes to the GPU through a
    small pinned staging copy, so the copy does not block the CPU."""

    def __init__(self, filename_pattern, rank, world_size, device="cpu", vocab_size=50257):
        self.files = sorted(glob.glob(filename_pattern))
        if not self.files:
            raise UserError(f"no shard matches {filename_pattern!r}: check --train_files and "
                            f"--val_files, or {DOWNLOAD_HINT}")
        for path in self.files:
            check_shard(path)
        self.rank, self.world_size, self.vocab_size = rank, world_size, vocab_size
        self.device = torch.device(device)
        self.shard, self.tokens = None, None
        self.reset()

    def reset(self):  # to the first token of the first shard
        self._load(0)

    def state_dict(self):
        return dict(shard=self.shard, pos=self.pos)

    def load_state_dict(self, state):
        if not 0 <= state["shard"] < len(self.files):
            raise UserError(f"the saved position is in shard {state['shard']}, but only "
                            f"{len(self.files)} shards match this loader's pattern")
        self._load(state["shard"])
        self.pos = state["pos"]

    def _load(self, index):
        if index != self.shard:
            self.tokens, self.shard = read_shard(self.files[index]), index
            if hasattr(os, "posix_fadvise"):  # the kernel reads the next shard in the background
                with open(self.files[(index + 1) % len(self.files)], "rb") as f:
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
        self.pos = 0

    def next_batch(self, batch_size):
        """Return this rank's (inputs, targets): int32 inputs and int64 targets on the device."""
        local = rank_share(batch_size, self.world_size)
        if self.pos + batch_size + 1 >= len(self.tokens):
            if self.pos == 0:
                raise UserError(f"{self.files[self.shard]} holds {len(self.tokens)} tokens, too "
                                f"few for one batch of {batch_size} (it needs at least "
                                f"{batch_size + 2}); use a smaller batch or larger shards")
            self._load((self.shard + 1) % len(self.files))
            return self.next_batch(batch_size)
        # Ids past the vocabulary are refused here, since a compiled model cannot check them.
        # Every rank checks the whole batch (0.05 ms for the reference's), so that all stop.
        batch = self.tokens[self.pos:self.pos + batch_size + 1].numpy()
        if batch.max() >= self.vocab_size:
            at = int(np.argmax(batch >= self.vocab_size))
            raise UserError(f"{self.files[self.shard]}: token {self.pos + at} is {batch[at]}, not "
                            f"a GPT-2 id below {self.vocab_size}; {DOWNLOAD_HINT}")
        start = self.pos + self.rank * local
        self.pos += batch_size
        # A fresh block from PyTorch's pinned-memory cache: it is not reused until the copy
        # below has finished, however far the CPU runs ahead.
        staged = torch.empty(local + 1, dtype=torch.int32, pin_memory=self.device.type == "cuda")
        staged.copy_(self.tokens[start:start + local + 1])
        tokens = staged.to(self.device, non_blocking=True)
        return tokens[:-1], tokens[1:].to(torch.int64)

# ----------------------------------------------------------------------------- training
# One step: every rank takes its slice of the batch, runs forward and backward over it in
# sequences of micro_batch_size tokens, DDP averages the gradients over the ranks, then Adam and
# Muon step with the schedules below. The attention window widens from 128 to 1792 tokens.

def main(argv=None):
    """Train with these arguments (default: the command line); return {step: val loss}."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rank, world_size, device = setup_device()
    try:
        return train(args, rank, world_size, device)
    finally:
        if dist.is_initialized():
            # The group's destructor joins a gloo thread while holding the GIL, and that thread may
            # still wait for the GIL to free a collective's tensors: the pause lets it finish first.
            time.sleep(0.1)
            dist.destroy_process_group()

def train(args, rank, world_size, device):
    """The run on this rank: its set-up, the untimed compile steps, then the training loop."""
    train_loader = DistributedDataLoader(args.train_files, rank, world_size, device,
                                         args.vocab_size)
    val_loader = DistributedDataLoader(args.val_files, rank, world_size, device, args.vocab_size)
    check_config(args, world_size, val_shard_tokens=len(val_loader.tokens))
    model, compiled, ddp_model = build_model(args, device)  # may refuse kernels: see use_kernels
    seq_len = sequence_length(args, world_size)
    check_host_memory(model, seq_len)
    run_id, script = make_run_id(), read_script()  # the code as it starts, whatever edits come
    code = script_digest(script)
    resume = find_checkpoint(args, run_id, world_size)
    # every refusal of the configuration comes above: from here on, the run has a log
    log = make_logger(args.log_dir, run_id, rank)
    on_rank_0(log_run_header, log, args, world_size, train_loader.files, val_loader.files, model,
              script)
    adam, muon = build_optimizers(model, args)
    stateful = (model, adam, muon, train_loader)  # what holds the training state
    window = torch.tensor(1, dtype=torch.int32, device=device)  # changes without a recompile

    def train_one_step(step):
        window.fill_(window_schedule(step, args.num_iterations))
        inputs, targets = train_loader.next_batch(args.batch_size)
        loss = forward_backward(ddp_model, inputs, targets, window, seq_len)
        optimizer_step(adam, muon, step, args)
        return loss

    with stop_signals(print_notice=rank == 0) as signals:  # noted here, shared by all ranks
        # Compile on a few untimed steps, then put everything back as it was: the timed run is
        # the run without them. The snapshot waits in host memory, not beside the weights.
        initial = tree_map_only(torch.Tensor, lambda t: t.to("cpu", copy=True),
                                training_state(*stateful))
        if run_compile_steps(train_one_step, args.compile_steps, signals, log, rank == 0):
            stop_run("interrupted in the compile steps, before training began (its run id "
                     "stays free)", resume[0] if resume else None, log, error=SystemExit)
        restore_training_state(initial, *stateful)
        del initial
        clock = TrainClock(device)  # from here: the set-up above is no training
        first_step, newest = resume_from(resume, stateful, clock, code, log)  # (0, None): new
        del resume  # in the model and optimizers now: free its copy in host memory
        val_losses, in_flight, stop_requested = {}, [], set()
        for step in range(first_step, args.num_iterations + 1):  # step: the steps done so far
            last = step == args.num_iterations
            validate = last or (args.val_every > 0 and step % args.val_every == 0)
            checkpoint = step > first_step and ((last and args.save_checkpoint) or (
                args.checkpoint_every > 0 and step % args.checkpoint_every == 0))
            # the losses and stop requests of the steps before, on their way to the host: all
            # but the newest, so that the GPU always has a step queued; all where validation, a
            # checkpoint or a stop waits for the GPU anyway
            while in_flight and (len(in_flight) > 1 or validate or checkpoint or stop_requested):
                done, loss, asked, ms = receive_loss_and_stop(in_flight.pop(0), clock)
                report_loss(log, "training", done, loss, ms, args, newest)
                stop_requested |= asked
            # a checkpoint when due; the stop that a rank asked for, unless the run is done
            stop = stop_requested and not last
            if checkpoint or (stop and (args.checkpoint_every > 0 or args.save_checkpoint)):
                with clock.paused():
                    check_finite("norm of the weights", step, weights_norm(model), log, newest)
                    newest = save_checkpoint(step, stateful, args, run_id, code, clock, log,
                                             newest)
            if stop:
                stop_as_asked(stop_requested, step, newest, log)
            if validate:  # off the clock, with this step's window
                with clock.paused():
                    window.fill_(window_schedule(step, args.num_iterations))
                    val_losses[step] = evaluate(compiled, val_loader, window, args, world_size)
                report_loss(log, "validation", step, val_losses[step], clock.elapsed_ms, args,
                            newest)
            if last:
                break
            loss = train_one_step(step)
            in_flight.append(send_loss_and_stop(step + 1, loss, stops_asked(signals, log), clock))
    log(f"peak memory consumption: {peak_memory_mib(device)} MiB" + (
        "" if device.type == "cuda" else " (CPU run: peak resident set size of rank 0)"))
    log.close()
    if failed := on_rank_0(lambda: log.failed):  # in the last step: no stop is read after it
        raise UserError(f"{failed}: it lacks the lines printed after that; {FULL_DISK_FIX}")
    return val_losses

def build_model(args, device, gpu_path=None):
    """(model, compiled, ddp_model): the GPT of `args` on `device`, compiled on the GPU's path,
    and in DDP when there are several processes. `gpu_path` (default: on a GPU) compiles and
    takes the kernels; tests set it on a CPU, where Triton's interpreter runs the kernels."""
    torch.manual_seed(args.seed)  # built on the CPU: the same weights on every rank and device
    cuda = device.type == "cuda"
    gpu_path = cuda if gpu_path is None else gpu_path
    model = GPT(args.vocab_size, args.num_layers, args.num_heads, args.model_dim,
                max_seq_len=args.micro_batch_size, no_attention_layers=args.no_attention_layers,
                embed_dtype=torch.bfloat16 if cuda else torch.float32,
                softcap=args.softcap).to(device)
    if gpu_path and args.kernels:
        use_kernels(model, device)  # decided here, once, for this device
    compiled = torch.compile(model) if gpu_path else model
    ddp_model = data_parallel(compiled, device) if dist.is_initialized() else compiled
    return model, compiled, ddp_model

def data_parallel(module, device):
    """`module` in DDP, which averages its gradients over the ranks in the backward. Its buffers
    (the rotary tables, the same on every rank) are not broadcast before each forward (newer
    PyTorch's forward_sync_buffers=False still broadcasts them once, as DDP is built)."""
    return DDP(module, device_ids=[device] if device.type == "cuda" else None,
               gradient_as_bucket_view=True, **{DDP_BUFFER_SYNC: False})

def build_optimizers(model, args):
    """Adam for the embeddings, the head and the scalars; Muon for every matrix in the blocks."""
    embeddings = [model.embed.weight, *(table.weight for table in model.value_embeds)]
    scalars = [p for p in model.parameters() if p.ndim < 2]
    matrices = [p for p in model.blocks.parameters() if p.ndim == 2]
    adam = torch.optim.Adam([dict(params=embeddings, lr=args.embed_lr),
                             dict(params=[model.lm_head.weight], lr=args.head_lr),
                             dict(params=scalars, lr=args.scalar_lr)],
                            betas=(0.8, 0.95), eps=1e-8, fused=model.lm_head.weight.is_cuda)
    muon = Muon(matrices, lr=args.muon_lr, momentum=0.95)
    for group in adam.param_groups + muon.param_groups:
        group["initial_lr"] = group["lr"]
    return adam, muon

def lr_multiplier(step, num_iterations, cooldown_frac):
    """1 for the first (1 - cooldown_frac) of the run, then a straight line down to 0."""
    remaining = 1 - step / num_iterations
    return 1.0 if remaining >= cooldown_frac else remaining / cooldown_frac

def muon_momentum(step, ramp_steps=300):
    """Muon's momentum rises linearly from 0.85 to 0.95 over the first 300 steps."""
    frac = min(step / ramp_steps, 1)
    return (1 - frac) * 0.85 + frac * 0.95

def window_schedule(step, num_iterations):
    """The attention window, in 128-token blocks: 1 at the start, 14 (1792 tokens) at the end."""
    x = step / num_iterations
    return int(((1 - x) * 128 + x * 1856) // 128)

def forward_backward(model, inputs, targets, window, seq_len):
    """Forward and backward this rank's slice as sequences of `seq_len` tokens; return the mean
    loss. Gradients are averaged over the sequences here and over the ranks by DDP, after the
    last: the update is the mean over the whole batch, whatever the world size."""
    num_seqs = len(inputs) // seq_len
    total = torch.zeros((), device=inputs.device)
    for i in range(num_seqs):
        chunk = slice(i * seq_len, (i + 1) * seq_len)
        last = i == num_seqs - 1
        with model.no_sync() if isinstance(model, DDP) and not last else contextlib.nullcontext():
            loss = model(inputs[chunk], targets[chunk], window) / num_seqs
            loss.backward()
        total += loss.detach()
    return total

def optimizer_step(adam, muon, step, args):
    """Apply the schedules of `step` to both optimizers, step them, and clear the gradients."""
    multiplier = lr_multiplier(step, args.num_iterations, args.cooldown_frac)
    for group in adam.param_groups + muon.param_groups:
        group["lr"] = group["initial_lr"] * multiplier
    for group in muon.param_groups:
        group["momentum"] = muon_momentum(step)
    adam.step()
    muon.step()
    adam.zero_grad(set_to_none=True)
    muon.zero_grad(set_to_none=True)

@torch.no_grad()
def evaluate(model, loader, window, args, world_size):
    """The val loss: the mean loss over the first val_tokens of the val shard, in sequences of
    micro_batch_size tokens, over every rank."""
    model.eval()
    loader.reset()
    steps = args.val_tokens // (world_size * args.micro_batch_size)
    total = torch.zeros((), device=window.device)
    for _ in range(steps):
        inputs, targets = loader.next_batch(world_size * args.micro_batch_size)
        total += model(inputs, targets, window).float()
    model.train()
    return all_ranks_mean(total / steps).item()

def report_loss(log, kind, step, loss, ms, args, newest):
    """Log the record's line of a `kind` ("training" or "validation") loss after `step` steps,
    then stop the run if the loss is not finite."""
    done = f"step:{step}/{args.num_iterations}"
    times = f"train_time:{ms:.0f}ms step_avg:{ms / step if step else 0:.2f}ms"
    log(f"{done} {times} train_loss:{loss:.4f}" if kind == "training" else
        f"{done} val_loss:{loss:.4f} {times}")
    check_finite(f"{kind} loss", step, loss, log, newest)

# ----------------------------------------------------------------------------- around the loop
# Processes and devices, the checks, the log's header, the untimed compile steps, the clock, and
# the losses' way to the host.

def setup_device():
    """(rank, world size, device): torchrun's process group, or one process without torchrun."""
    if not {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"} & os.environ.keys():  # a user's wins
        # segments that grow in place strand no freed memory; set before CUDA starts
        os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu")
    if cuda:
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:  # bf16 arithmetic came with the A100
            raise UserError(f"{torch.cuda.get_device_name(device)} (compute capability {major}."
                            f"{minor}) has no bf16 arithmetic, in which the recipe trains; use a "
                            "GPU from the A100 (8.0) on, or hide this one for the CPU smoke run: "
                            "CUDA_VISIBLE_DEVICES= python train_gpt.py --preset=smoke")
        torch.cuda.set_device(device)
    if "RANK" not in os.environ:  # not launched by torchrun
        return 0, 1, device
    store, rank, world_size = next(dist.rendezvous("env://"))
    # torchrun keeps its store when it restarts the workers: without a fresh prefix they would
    # read the previous attempt's addresses and fail or hang while connecting
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world_size,
                            store=dist.PrefixStore(f"attempt{attempt}", store))
    return rank, world_size, device

def sequence_length(args, world_size):
    """Tokens per forward pass: the micro-batch, or a rank's whole slice when that is shorter."""
    return min(args.micro_batch_size, args.batch_size // world_size)

def check_config(args, world_size, val_shard_tokens=math.inf):
    """Refuse hyperparameters that cannot run on `world_size` ranks, naming the value and fix;
    `val_shard_tokens`: the val shard's length, once it is known."""
    def require(allowed, names, rule):
        for name in names.split():
            value = getattr(args, name)
            if not allowed(value):
                shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
                raise UserError(f"--{name}={shown} {rule}")

    require(lambda v: v > 0, "val_tokens batch_size micro_batch_size num_layers model_dim "
            "num_iterations", "must be positive")
    require(lambda v: v >= 0, "val_every compile_steps seed checkpoint_every", "must be 0 or more")
    require(lambda v: 0 <= v < math.inf, "embed_lr head_lr scalar_lr muon_lr",
            "must be a finite number, 0 or more")
    require(lambda v: 0 <= v <= 1, "cooldown_frac", "must lie in [0, 1]")
    require(lambda v: 0 < v < math.inf, "softcap", "must be a finite number above 0")
    require(lambda v: v > EOT_TOKEN, "vocab_size",
            f"cannot hold the GPT-2 tokens of the data (up to {EOT_TOKEN}); use 50257")
    require(lambda v: min(v, default=0) >= 0, "no_attention_layers", "must count layers from 0")
    require(bool, "log_dir", "must name a folder")
    # the default stands for "layer 7, where there is one"; layers the user names must exist
    missing = [i for i in args.no_attention_layers if i >= args.num_layers]
    if missing and args.no_attention_layers != type(args).no_attention_layers:
        raise UserError(f"--no_attention_layers names layer {missing[0]}, but the model's layers "
                        f"are 0 to {args.num_layers - 1}")
    check_heads(args.model_dim, args.num_heads)
    local, seq_len = rank_share(args.batch_size, world_size), sequence_length(args, world_size)
    if local % seq_len or seq_len % BLOCK_SIZE or args.micro_batch_size % BLOCK_SIZE:
        raise UserError(f"each rank's {local} tokens must split into sequences of {seq_len}, and "
                        f"--micro_batch_size={args.micro_batch_size} must be a multiple of "
                        f"{BLOCK_SIZE}; change --batch_size or --micro_batch_size")
    if args.val_tokens % (world_size * args.micro_batch_size):
        raise UserError(f"--val_tokens={args.val_tokens} must be a multiple of world size x "
                        f"micro batch = {world_size * args.micro_batch_size}")
    if args.val_tokens + 1 >= val_shard_tokens:  # the targets reach one token further
        raise UserError(f"the val shard holds {val_shard_tokens} tokens, not more than "
                        f"--val_tokens={args.val_tokens} + 1; validate on fewer tokens")

def launch_refusal(world_size, argv):
    """For a launcher (run.sh), before it starts `world_size` processes of train_gpt.py `argv`:
    the line each would stop with, naming the numbers of processes up to 8 it would start on;
    None where it starts (the data is checked as the run reads it)."""
    def refusal(processes):
        try:
            check_config(parse_args(argv), processes)
        except UserError as err:
            return str(err)
        return None

    if {"-h", "--help"} & set(argv) or not (problem := refusal(world_size)):
        return None
    takers = [str(n) for n in range(1, 9) if not refusal(n)]
    starts = " or ".join([", ".join(takers[:-1]), takers[-1]] if len(takers) > 1 else takers)
    return f"error: {problem}" + (f" (it starts on {starts} processes)" if takers else "")

def check_host_memory(model, seq_len):
    """On a CPU, refuse sequences whose forward and backward cannot fit in the machine's memory,
    shared by the processes torchrun starts on it, rather than be killed for them part-way. The
    floor counts, for each token, 3.5 fp32 copies of its logits and 14 fp32 values per layer and
    unit of width, less than every model measured took (records/2026-11-28_cpu_memory/)."""
    if model.lm_head.weight.is_cuda:  # where CUDA's own out-of-memory error gives the sizes
        return
    columns, width = model.lm_head.weight.shape
    floats = 3.5 * columns + 14 * len(model.blocks) * width  # the floor's fp32 values a token
    per_token = int(4 * floats)  # bytes
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // processes
    if seq_len * per_token > memory:
        raise UserError(f"on a CPU, a sequence of {seq_len} tokens needs at least "
                        f"{seq_len * per_token / 2**30:.1f} GiB, and this machine has "
                        f"{memory / 2**30:.1f} GiB for each of its {processes} process(es), "
                        f"enough for at most {memory // per_token} tokens: set a smaller "
                        f"--micro_batch_size, or run the CPU smoke run, --preset=smoke")

def all_ranks_mean(x):
    if dist.is_initialized():
        dist.all_reduce(x)  # a sum: gloo has no average
        x /= dist.get_world_size()
    return x

# What to do where the log or a checkpoint cannot be written (a full disk, as a rule)
FULL_DISK_FIX = "free space or change --log_dir"

def make_logger(log_dir, run_id, rank):
    """The run's RunLog, <log_dir>/<run id>.txt. Every rank makes the folder, or finds that it
    cannot, so that all stop alike."""
    try:
        os.makedirs(log_dir, exist_ok=True)
    except OSError as err:
        raise UserError(f"--log_dir={log_dir}: cannot make the folder ({err.strerror})")
    if not os.access(log_dir, os.W_OK | os.X_OK):
        raise UserError(f"--log_dir={log_dir}: the folder is not writable")
    return RunLog(os.path.join(log_dir, f"{run_id}.txt"), writes=rank == 0)

class RunLog:
    """log(line): on rank 0 (`writes`), print the line and append it to the log at `path`; on
    the others, nothing. A line the file cannot take (a full disk) is cut off again, so that the
    log keeps whole lines, and `failed` says why: from then on lines are printed only, and the
    training loop stops every rank after the step."""

    def __init__(self, path, writes):
        self.path, self.writes, self.file, self.failed = path, writes, None, None
        if writes:
            print(f"logging to {path}")

    def __call__(self, line, console=True):
        if not self.writes:
            return
        if console:
            print(line)
        if self.failed:
            return
        try:
            if self.file is None:  # opened here, so that a failure to open is one to write
                # a restarted worker goes on with its run's log; a new run replaces one that
                # never trained
                self.file = open(self.path, "ab" if restarted_by_torchrun() else "wb")
            whole = self.file.tell()
            self.file.write(line.encode() + b"\n")
            self.file.flush()
        except OSError as err:
            self.failed = f"cannot write the log {self.path} ({err.strerror})"
            if self.file is not None:
                with contextlib.suppress(OSError):
                    self.file.close()  # which flushes again, fails again, and closes
                with contextlib.suppress(OSError):
                    os.truncate(self.path, whole)
                    if not whole:  # a log that holds nothing is no log
                        os.remove(self.path)

    def close(self):
        if self.file is not None:
            with contextlib.suppress(OSError):  # a failed write has closed it already
                self.file.close()

def log_run_header(log, args, world_size, train_files, val_files, model, script):
    """Everything needed to reproduce the run: code (`script`, read_script's), versions, hardware,
    data, settings."""
    if script is not None:  # none where the code was run by exec()
        log(script.decode() + "=" * 100, console=False)
    cuda = torch.version.cuda if torch.cuda.is_available() else "none (CPU run)"
    log(f"Python {sys.version.split()[0]}, PyTorch {torch.__version__}, CUDA {cuda}")
    if script is not None:
        log(f"the script's SHA-256 begins {script_digest(script)}, as sha256sum "
            f"{os.path.basename(__file__)} says")
    log("allocator settings: " + ", ".join(f"{name}={os.environ[name]}" for name in
                                           ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
                                           if name in os.environ))
    if shutil.which("nvidia-smi"):
        log(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout, console=False)
    log(f"train files: {' '.join(train_files)}\nval files: {' '.join(val_files)}", console=False)
    log(f"hyperparameters: {dataclasses.asdict(args)}")
    seq_len = sequence_length(args, world_size)
    log(f"world size {world_size}: {args.batch_size // world_size // seq_len} sequence(s) of "
        f"{seq_len} tokens per rank per step" + ("" if seq_len == args.micro_batch_size else
        " (shorter than --micro_batch_size: a different run from the reference)"))
    runs = what_runs(model)
    log(f"the head's loss runs as {runs['head']}, the MLPs as {runs['mlp']}")
    if log.failed:
        raise UserError(f"{log.failed}; {FULL_DISK_FIX}")

def peak_memory_mib(device):
    """This process's peak memory on `device`: CUDA's allocations, or on a CPU the resident set.
    Linux's VmHWM, as ru_maxrss keeps the peak of the process that started this one across exec
    (torchrun's, a notebook's); elsewhere ru_maxrss, in bytes on macOS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) // 2**20
    try:
        with open("/proc/self/status") as status:  # the line "VmHWM:   123456 kB"
            kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        return kib // 1024
    except FileNotFoundError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 2**20

def run_compile_steps(train_one_step, steps, signals, log, show_progress):
    """Run the untimed steps that compile the model, each shown as it ends (on rank 0), as a
    bar on a terminal or a line in a file: with a cold compile cache they take minutes, which a
    silent script cannot tell apart from a hang. Return whether a rank asked to stop (in
    `signals`): then the steps end there, on every rank."""
    if not steps:
        return False
    started = time.perf_counter()
    terminal = show_progress and sys.stdout.isatty()
    bar = tqdm(total=steps, desc="compile steps (untimed)", unit="step", file=sys.stdout,
               disable=not terminal)
    for step in range(steps):
        loss = train_one_step(step)
        # waits for the step, so that the time shown is its end
        stop_asked = all_ranks_mean(torch.full_like(loss, bool(signals))).item() > 0
        bar.update()
        if show_progress and not terminal:
            print(f"compile step {step + 1}/{steps}: {time.perf_counter() - started:.1f}s",
                  flush=True)
        if stop_asked:
            bar.close()
            return True
    bar.close()
    log(f"compile steps: {steps} in {time.perf_counter() - started:.1f}s, untimed, then undone")
    return False

class TrainClock:
    """Milliseconds spent training: validation and checkpoints run inside paused()."""

    def __init__(self, device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
        self.elapsed_ms = 0.0  # up to the last pause
        self.sync()
        self.start = time.perf_counter()

    def ms(self):
        return self.elapsed_ms + 1e3 * (time.perf_counter() - self.start)

    @contextlib.contextmanager
    def paused(self):
        self.sync()
        self.elapsed_ms = self.ms()
        yield
        self.sync()
        self.start = time.perf_counter()

# What a rank may ask the run to stop for: a Ctrl-C or SIGTERM, a log it cannot write (rank 0)
STOP_REASONS = ("signal", "log")

def stops_asked(signals, log):
    """What this rank asks the run to stop for: the signals noted in `signals`, the failed `log`."""
    return {reason for reason, asked in zip(STOP_REASONS, (signals, log.failed)) if asked}

def send_loss_and_stop(step, loss, stops, clock):
    """Send step `step`'s loss, and for each of STOP_REASONS whether a rank asked to stop for it
    (this rank: for those in `stops`), their means over the ranks, to host memory without waiting
    for them: reading a value the GPU has just computed makes the CPU wait for the step, and the
    GPU then idles while the CPU queues the next one. Read them with receive_loss_and_stop a step
    later."""
    values = all_ranks_mean(torch.stack([loss, *(torch.full_like(loss, reason in stops)
                                                 for reason in STOP_REASONS)]))
    host = torch.empty(len(values), pin_memory=values.is_cuda).copy_(values, non_blocking=True)
    arrived = torch.cuda.current_stream().record_event() if values.is_cuda else None
    return step, host, arrived, clock.ms()

def receive_loss_and_stop(sent, clock):
    """(step, mean loss, what a rank asked to stop for, train time in ms) of a
    send_loss_and_stop(). The time is read when the host sees the step done: at its end while the
    CPU runs ahead of the GPU, as it does in a real run, and later when the CPU lags behind."""
    step, host, arrived, ms = sent
    if arrived:
        arrived.synchronize()  # long done unless the CPU is more than a step ahead
        ms = clock.ms()  # the step has certainly finished by now
    loss, *asked = host.tolist()
    return step, loss, {reason for reason, mean in zip(STOP_REASONS, asked) if mean > 0}, ms

# ----------------------------------------------------------------------- checkpoints and stops
# A checkpoint holds the whole training state and the step: a resumed run takes the same batches
# and reaches the same weights as one that never stopped. Ctrl-C, SIGTERM and non-finite values
# stop every rank after the same step.

# The hyperparameters a resumed run may change: they change neither the batches nor the math
# (`kernels`: up to rounding).
MAY_CHANGE_ON_RESUME = {"val_files", "val_tokens", "val_every", "compile_steps", "log_dir",
                        "checkpoint_every", "save_checkpoint", "resume", "kernels"}

def training_state(model, adam, muon, loader, gather=False):
    """Everything the next steps depend on, with this rank's part of Muon's momentum (with
    gather=True, which every rank calls, rank 0's holds all of it)."""
    return dict(model=model.state_dict(), adam=adam.state_dict(),
                muon=muon.state_dict(gather=gather), train_loader=loader.state_dict())

def restore_training_state(state, model, adam, muon, loader):
    """Put a training_state() back: the weights are copied into the model's own tensors."""
    model.load_state_dict(state["model"])
    adam.load_state_dict(state["adam"])
    muon.load_state_dict(state["muon"])
    loader.load_state_dict(state["train_loader"])

def weights_norm(model):
    """The norm of all the model's weights together: a NaN or an infinity if any weight is one."""
    return torch.stack([p.detach().float().norm() for p in model.parameters()]).norm().item()

def save_checkpoint(step, stateful, args, run_id, code, clock, log, newest):
    """Write the training state after `step` steps, with the run's `code` (script_digest; rank
    0 writes, the others wait); return its path."""
    started = time.perf_counter()
    path = os.path.join(args.log_dir, run_id, f"state_step{step:06d}.pt")
    checkpoint = dict(training_state(*stateful, gather=True), step=step, run_id=run_id,
                      world_size=dist.get_world_size() if dist.is_initialized() else 1,
                      train_time_ms=clock.elapsed_ms, hyperparameters=dataclasses.asdict(args),
                      code=code)
    try:
        on_rank_0(write_checkpoint, checkpoint, path)
    except OSError as err:
        stop_run(f"cannot write the checkpoint {path} ({err.strerror or err}); {FULL_DISK_FIX}",
                 newest, log)
    log(f"checkpoint: step {step} written to {path} in "
        f"{1e3 * (time.perf_counter() - started):.0f}ms, not counted in train_time")
    return path

def resume_from(resume, stateful, clock, code, log):
    """Restore `resume`, a (path, checkpoint) from find_checkpoint, into the training state and
    the clock; return (steps done, newest checkpoint), or (0, None) without one. The log says
    where the checkpoint's run ran other code than this one's `code` (a fix mid-run, say)."""
    if not resume:
        return 0, None
    path, checkpoint = resume
    log(f"resuming from {path}: step {checkpoint['step']} of run {checkpoint['run_id']}")
    if None not in (checkpoint.get("code"), code) and checkpoint["code"] != code:
        log(f"the checkpoint's run ran other code: its script's SHA-256 begins "
            f"{checkpoint['code']}, this one's {code}")  # older checkpoints do not say
    with clock.paused():  # not training time
        restore_training_state(checkpoint, *stateful)
    clock.elapsed_ms = checkpoint["train_time_ms"]
    return checkpoint["step"], path

def check_finite(what, step, value, log, newest):
    """End the run if `value` is a NaN or an infinity; every rank sees the same value."""
    if not math.isfinite(value):
        stop_run(f"step {step}: the {what} is {value}, so the run stops here", newest, log)

def stop_as_asked(reasons, step, newest, log):
    """End the run after `step` for the `reasons` (STOP_REASONS) that ranks asked it to stop for."""
    if "log" in reasons:  # rank 0's, which every rank says
        stop_run(f"step {step}: {on_rank_0(lambda: log.failed)}, so the run stops here; "
                 f"{FULL_DISK_FIX}", newest, log)
    stop_run(f"interrupted at step {step}", newest, log, error=SystemExit)

def stop_run(message, newest, log, error=UserError):
    """End the run, on every rank alike, with `message` and where it can go on from: `newest`,
    the newest checkpoint, or none."""
    message += (f"; continue with --resume={newest}" if newest else
                "; no checkpoint was written (--checkpoint_every=K writes one every K steps)")
    log(message)
    raise error(message)

@contextlib.contextmanager
def stop_signals(print_notice):
    """Within it, a first Ctrl-C or SIGTERM is noted in the list it yields, which the loop shares
    with the other ranks, so that all stop after the same step (`print_notice`: say so). A second
    ends the process at once; one within a second of the first is a copy of it (a scheduler
    signals every process of a job, and torchrun passes its own on). Python runs handlers only
    between bytecodes of the main thread, which may wait long in a compile or for good in a
    hung collective: so a thread reads the signals from the interpreter's wakeup pipe."""
    signals, stops = [], (signal.SIGINT, signal.SIGTERM)
    watched, wakeup = os.pipe()
    os.set_blocking(wakeup, False)  # as set_wakeup_fd requires

    def watch():
        first = None  # when the first stop signal came
        while received := os.read(watched, 1):  # empty once the pipe is closed
            if received[0] not in stops:
                continue
            if first is None:
                first = time.monotonic()
                if print_notice:
                    with contextlib.suppress(OSError):  # nobody may be reading any more
                        os.write(2, b"stopping after this step; Ctrl-C again to quit now\n")
            elif time.monotonic() - first > 1:
                os._exit(128 + received[0])  # as if killed by it: no clean-up to wait for
        os.close(watched)

    previous = {sig: signal.signal(sig, lambda signum, frame: signals.append(signum))
                for sig in stops}
    previous_wakeup = signal.set_wakeup_fd(wakeup)
    threading.Thread(target=watch, daemon=True).start()
    try:
        yield signals
    finally:
        signal.set_wakeup_fd(previous_wakeup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(wakeup)

def restarted_by_torchrun():
    """Whether torchrun restarted this worker (--max-restarts), which then goes on with its run."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0

def read_script():
    """This file's bytes, read once so that the log's copy of the code and its digest agree
    (None where it was run by exec(), from no file)."""
    if not globals().get("__file__"):
        return None
    with open(__file__, "rb") as f:
        return f.read()

def script_digest(script):
    """The first 12 hex digits of the SHA-256 of `script`, as `sha256sum` gives it: what
    identifies the code a run runs (None for no script)."""
    return None if script is None else hashlib.sha256(script).hexdigest()[:12]

def make_run_id():
    """torchrun's run id, which lasts over its restarts of the workers, or a new one."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if run_id != "none":
        return run_id
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)) > 0:  # torchrun without --rdzv-id
        raise UserError("torchrun may restart the workers (--max-restarts) but has no run id, so "
                        "each restart would draw a new one and train again from step 0 instead "
                        "of resuming; give torchrun --rdzv-id=NAME, the same on every node")
    return on_rank_0(lambda: str(uuid.uuid4()))

def find_checkpoint(args, run_id, world_size):
    """(path, checkpoint) to continue from, or None. Rank 0 picks the file, every rank reads it:
    on several nodes, --log_dir must be a folder they share."""
    path = on_rank_0(resume_path, args, run_id)
    return (path, load_checkpoint(path, args, world_size)) if path else None

def on_rank_0(fn, *args):
    """fn(*args) run by rank 0 alone, while the others wait; all get its result or its error."""
    outcome = [None, None]
    if not dist.is_initialized() or dist.get_rank() == 0:
        try:
            outcome[0] = fn(*args)
        except Exception as err:  # whatever it is, the other ranks must hear of it
            outcome[1] = err
    if dist.is_initialized():
        dist.broadcast_object_list(outcome, src=0)
    if outcome[1] is not None:
        raise outcome[1]
    return outcome[0]

def resume_path(args, run_id):
    """The checkpoint to continue from, or "": after torchrun restarts the workers (told by the
    restart count of rank 0's node), the run's own newest; otherwise --resume, a folder meaning
    its newest. A new run may not take the run id of a run that began training (its log has a
    step's line) or wrote checkpoints: it would write into that run's log."""
    log, folder = os.path.join(args.log_dir, f"{run_id}.txt"), os.path.join(args.log_dir, run_id)
    own = checkpoints_in(folder)
    if restarted_by_torchrun():
        if own:
            return own[-1]
    elif (began := began_training(log)) or own:
        resume = f" (to continue that run, add --resume={folder})" if own else ""
        raise UserError(f"the run id {run_id} is taken: {log if began else folder} holds an "
                        f"earlier run; give torchrun a new --rdzv-id{resume}")
    if os.path.isdir(args.resume):
        found = checkpoints_in(args.resume)
        if not found:
            raise UserError(f"--resume={args.resume}: the folder holds no checkpoint "
                            f"(state_step*.pt); a run keeps its checkpoints in "
                            f"<log_dir>/<run id>/{run_folders_in(args.resume)}")
        return found[-1]
    return args.resume

def run_folders_in(folder, most=3):
    """The run folders in `folder` that hold checkpoints, the newest `most` first, as the end of
    a sentence ("" where there are none)."""
    runs = [path for name in os.listdir(folder)
            if checkpoints_in(path := os.path.join(folder, name))]
    runs.sort(key=lambda run: os.path.getmtime(checkpoints_in(run)[-1]), reverse=True)
    more = f", and {len(runs) - most} more" if len(runs) > most else ""
    listed = ", ".join(f"--resume={run}" for run in runs[:most])
    return f"; here, the newest first: {listed}{more}" if runs else ""

def began_training(log):
    """Whether the log at path `log` has a step's line: its run began training."""
    if not os.path.exists(log):
        return False
    with open(log) as f:
        return re.search(r"^step:\d+/\d+ ", f.read(), re.MULTILINE) is not None

def checkpoints_in(folder):
    """The complete checkpoints in `folder`, oldest first (a write in progress has another name)."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    steps = sorted(int(m[1]) for m in map(re.compile(r"state_step(\d+)\.pt").fullmatch, names) if m)
    return [os.path.join(folder, f"state_step{step:06d}.pt") for step in steps]

def write_checkpoint(state, path, keep=2):
    """Save `state` to `path`, then delete all but the newest `keep` checkpoints in its folder.
    The bytes go to a temporary name, renamed once complete: a crash mid-write breaks nothing,
    and a write that fails (a full disk: an OSError) leaves nothing behind."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = path + ".partial"
    try:
        with open(partial, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.remove(partial)
        # torch.save closes its archive as the disk's error unwinds, and that fails in turn:
        # its RuntimeError hides the OSError, which says what went wrong
        if isinstance(err, RuntimeError) and isinstance(err.__context__, OSError):
            raise err.__context__ from None
        raise
    os.replace(partial, path)
    for old in checkpoints_in(os.path.dirname(path))[:-keep]:
        if old != path:
            os.remove(old)

def load_checkpoint(path, args, world_size):
    """Read a checkpoint, refusing one from another configuration with the differing fields."""
    if not os.path.isfile(path):
        raise UserError(f"--resume={path}: no such file")
    # torch.save writes a zip archive with a pickle in it, the directory last and a checksum for
    # each part: a file that is cut, damaged or of another kind fails here. Any other error (an
    # I/O error, memory) is no fault of the file's, and keeps its traceback.
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()  # reads it all: about 0.3 s for 2 GB
            pickled = any(name.endswith("/data.pkl") for name in archive.namelist())
        problem = (f"its part {damaged} is damaged (the checksum differs)" if damaged else
                   None if pickled else "a zip archive, but not one that torch.save wrote")
        state = None if problem else torch.load(path, map_location="cpu", weights_only=True)
    except zipfile.BadZipFile as err:
        problem = f"not a sound zip archive ({err}): a file of another kind, or one cut short"
    except pickle.UnpicklingError:
        problem = "it holds objects that weights_only=True refuses, not tensors and plain data"
    if problem:
        raise UserError(f"--resume={path} is not a readable checkpoint: {problem}")
    if not isinstance(state, dict) or "hyperparameters" not in state:
        raise UserError(f"--resume={path} is not a checkpoint of this script")
    # a field missing from an older checkpoint had its default then
    saved = dict(dataclasses.asdict(Hyperparameters()), **state["hyperparameters"],
                 world_size=state["world_size"])
    current = dict(dataclasses.asdict(args), world_size=world_size)
    differing = [f"{name} (checkpoint {saved.get(name)!r}, now {value!r})"
                 for name, value in current.items()
                 if name not in MAY_CHANGE_ON_RESUME and saved.get(name) != value]
    if differing:
        raise UserError(f"{path} comes from a different configuration: {'; '.join(differing)}."
                        f" Resume with the checkpoint's values (the world size is torchrun's "
                        f"--nproc_per_node x --nnodes), or start a new run")
    return state

# ----------------------------------------------------------------------------- GPU kernels
# Two functions of the recipe, `head_loss` and `relu_square_mlp`, have Triton kernels that
# compute them, which a GPU runs in their place; the tests run them on a CPU too, through
# Triton's interpreter (TRITON_INTERPRET=1). Each kernel is a custom op, which torch.compile
# calls without breaking its graph, inside an autograd.Function rather than with a backward
# registered on the op: the compile cache keys that backward by the op's name alone.

try:  # Triton comes with PyTorch's CUDA builds
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only build runs the recipe's torch code
    triton = None
if not globals().get("__file__"):  # run by exec(): Triton reads a kernel's code from its file
    triton = None

# The code each kernel computes, as recipe_fingerprint() gives it: a copy that edits a recipe
# function and not its kernel would train other code on a GPU than on a CPU.
KERNEL_RECIPES = dict(head="484aad08653d", mlp="027de2b5e7a8")
# The ops' namespace, from the file's path and module name: two copies loaded in one process
# keep their own kernels, and every run of one file has the same, as the compile cache needs.
OPS = "speedrun_" + hashlib.sha256(f"{globals().get('__file__') or uuid.uuid4()}:{__name__}"
                                   .encode()).hexdigest()[:12]

def use_kernels(model, device):
    """Run the model's head loss and MLPs through the kernels that compute them: the head's
    everywhere, the MLP's where a pipeline fits `device`'s shared memory, its products split into
    whole tiles and (on a GPU) the stream is bf16; refused in one line, before anything trains,
    where a kernel would compute something else."""
    if triton is None:  # PyTorch's CPU-only builds, or code run by exec()
        return
    mlps = [block.mlp for block in model.blocks]
    check_recipe("head", {model.head_loss})
    check_recipe("mlp", {mlp.relu_square_mlp for mlp in mlps})
    # for micro-batches of up to 2^24 rows, more than a GPU's memory holds
    columns = model.lm_head.weight.size(0)
    largest = math.floor(math.log(2 ** -24 / torch.finfo(torch.float32).tiny / columns))
    if model.softcap > largest:
        raise UserError(f"--softcap={model.softcap}: the head kernel scales each row by 1 / (rows"
                        f" x its sum of exp(capped logit) over {columns} columns), a normal fp32 "
                        f"number only for caps up to {largest}; use a smaller cap, or "
                        f"--kernels=false")
    model.head_loss = triton_head_loss
    num_stages = mlp_pipeline_stages(device)
    hidden, dim = mlps[0].c_fc.weight.shape
    in_bf16 = device.type != "cuda" or model.embed.weight.dtype == torch.bfloat16
    # every sequence is whole 128-token blocks: the tiles' rows split it if they split 128
    if num_stages and in_bf16 and mlp_fits_tiles(BLOCK_SIZE, dim, hidden):
        for mlp in mlps:
            mlp.relu_square_mlp = functools.partial(triton_relu_square_mlp, num_stages=num_stages)

def check_recipe(kernel, recipes):
    """Refuse, in one line, a recipe function that is not the code `kernel` computes."""
    for recipe in recipes:
        found = recipe_fingerprint(recipe)
        if found == KERNEL_RECIPES[kernel]:
            continue
        name = getattr(recipe, "__name__", recipe)
        cap = cap_written_in(recipe) if kernel == "head" else None
        fix = (f"write softcap back where {name} has {cap}, and run with --softcap={cap}"
               if cap is not None else
               f'make the kernel compute it and set KERNEL_RECIPES["{kernel}"] = "{found}"'
               if found else "write it as a function of the file, whose code can be read")
        raise UserError(f"{os.path.basename(__file__)}: {name} is not the code that the {kernel} "
                        f"kernel computes, so a GPU would train other code than a CPU: run it "
                        f"with --kernels=false, or {fix}")

def function_tree(fn):
    """The syntax tree of `fn`'s code without its docstring, or None where there is no code to
    read (a builtin, a partial, a lambda inside a call)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    except (OSError, TypeError, SyntaxError):
        return None
    if isinstance(tree, ast.FunctionDef) and ast.get_docstring(tree) is not None:
        tree.body = tree.body[1:]
    return tree

def cap_written_in(fn):
    """The number that a copy of `head_loss` has in place of each use of its argument softcap,
    or None: what --softcap would then be."""
    nodes = list(ast.walk(function_tree(fn) or ast.Pass()))
    if any(isinstance(node, ast.Name) and node.id == "softcap" for node in nodes):
        return None
    numbers = {node.value for node in nodes if isinstance(node, ast.Constant)
               and type(node.value) in (int, float)}
    return next((number for number in sorted(numbers)
                 if recipe_fingerprint(fn, softcap=number) == KERNEL_RECIPES["head"]), None)

def recipe_fingerprint(fn, seen=(), softcap=None):
    """A hash of `fn`'s code (not its docstring, comments or layout) with the functions and
    constants of this file that it names; None where there is no code to read. With `softcap`,
    the number `softcap` reads as the name softcap: what a cap written into the code would be."""
    tree = function_tree(fn)
    if tree is None:
        return None
    code, nodes = ast.unparse(tree), list(ast.walk(tree))
    if softcap is not None:
        code = re.sub(rf"(?<![\w.]){re.escape(repr(softcap))}(?![\w.])", "softcap", code)
    bound = {node.arg for node in nodes if isinstance(node, ast.arg)} | {
        node.id for node in nodes if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    for name in sorted({node.id for node in nodes if isinstance(node, ast.Name)} - bound):
        value = fn.__globals__.get(name)
        if inspect.isfunction(value) and value.__module__ == fn.__module__ and value not in seen:
            code += f"\n{name}: {recipe_fingerprint(value, (*seen, fn))}"
        elif isinstance(value, (bool, int, float, str, tuple)):
            code += f"\n{name} = {value!r}"
    return hashlib.sha256(code.encode()).hexdigest()[:12]

def what_runs(model):
    """{"head": ..., "mlp": ...}: what computes the head's loss and the MLPs, as the log and the
    benchmarks say it; a forward that does not call the function use_kernels sets runs its own."""
    said = {}
    for part, module, name in [("head", model, "head_loss"),
                               ("mlp", model.blocks[0].mlp, "relu_square_mlp")]:
        fn, forward = getattr(module, name), function_tree(type(module).forward)
        if forward and name not in {getattr(node, "attr", "") for node in ast.walk(forward)}:
            said[part] = (f"{type(module).__name__}.forward's own code (it does not call "
                          f"self.{name})")
        elif fn is triton_head_loss:
            said[part] = f"the head kernel (Triton, {HEAD_KERNEL_SETTING})"
        elif getattr(fn, "func", None) is triton_relu_square_mlp:
            said[part] = f"the MLP kernel (Triton, {MLP_TILES}, {fn.keywords})"
        else:
            said[part] = f"{getattr(fn, '__name__', fn)} (torch code)"
    return said

# ----------------------------------------------------------------------- the head's kernel
# head_loss, HEAD_CHUNK_ROWS rows at a time: a product makes the chunk's logits z = x W^T; the
# kernel reads each logit once and writes over it, in place, its unscaled share of d loss / dz;
# two more products turn the shares into the chunk's part of d/dx and d/dW. The forward saves
# those two gradients, and the backward only scales them by the incoming gradient.

HEAD_CHUNK_ROWS = 8192  # the logits made at a time: 8,192 x 50,304 in bf16 is 824 MB, not 6.6 GB
HEAD_KERNEL_SETTING = dict(BLOCK=2048, num_warps=4)  # columns per iteration, warps per row

def triton_head_loss(x, weight, targets, softcap):
    """`head_loss` through the head kernel: with its gradients where autograd will ask for them,
    the loss alone where it will not (evaluation, under torch.no_grad)."""
    if torch.is_grad_enabled():
        return HeadLoss.apply(x, weight, targets, softcap)
    return head_loss_and_gradients(x, weight, targets, softcap, False)[0]

class HeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, softcap):
        loss, grad_x, grad_weight = head_loss_and_gradients(x, weight, targets, softcap, True)
        ctx.save_for_backward(grad_x, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_weight = ctx.saved_tensors
        return grad_x * grad_loss, (grad_weight * grad_loss).to(ctx.weight_dtype), None, None

@torch.library.custom_op(f"{OPS}::head_loss_and_gradients", mutates_args=())
def head_loss_and_gradients(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                            softcap: float, with_gradients: bool
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the mean loss of head_loss; with `with_gradients`, its gradients over x, and over weight
    in fp32, else two empty tensors). Every target is a column of the logits: there is no
    ignored index."""
    rows = x.size(0)
    losses = torch.empty(rows, dtype=torch.float32, device=x.device)
    grad_x = x.new_empty(x.shape if with_gradients else 0)
    grad_weight = torch.zeros(weight.shape if with_gradients else 0, dtype=torch.float32,
                              device=x.device)
    chunk_logits = x.new_empty(min(rows, HEAD_CHUNK_ROWS), weight.size(0))  # one, reused
    for start in range(0, rows, HEAD_CHUNK_ROWS):
        chunk = slice(start, start + HEAD_CHUNK_ROWS)
        logits = torch.mm(x[chunk], weight.T, out=chunk_logits[:len(x[chunk])])
        # in place: the logits become the unscaled shares of their gradient, 0 at the targets
        row_scales, target_shares = softcapped_cross_entropy_rows(
            logits, targets[chunk], losses[chunk], 1 / rows, softcap, with_gradients)
        if with_gradients:
            row_scales, target_shares = row_scales[:, None], target_shares[:, None]
            target = targets[chunk]
            # x's: the targets' shares, and the rest's product, in fp32, scaled, rounded once
            product = weight[target] * target_shares
            add_product_in_fp32(product, logits, weight)
            torch.mul(product, row_scales, out=grad_x[chunk])
            # the weight's: x scaled by the rows' scales (one bf16 rounding more), as scaling
            # the shares instead would take a second pass over the logits; the targets' in fp32
            scaled_x = torch.mul(x[chunk], row_scales, out=torch.empty_like(x[chunk]))
            add_product_in_fp32(grad_weight, logits.T, scaled_x)
            grad_weight.index_add_(0, target, x[chunk] * (target_shares * row_scales))
    return losses.mean(), grad_x, grad_weight

@head_loss_and_gradients.register_fake
def _(x, weight, targets, softcap, with_gradients):
    return (x.new_empty((), dtype=torch.float32), x.new_empty(x.shape if with_gradients else 0),
            x.new_empty(weight.shape if with_gradients else 0, dtype=torch.float32))

def add_product_in_fp32(total, a, b):
    """total += a b, summed in fp32 whatever the dtype of a and b: a product made in chunks then
    rounds once, at the end, as the whole product would."""
    if a.is_cuda and a.dtype != total.dtype:
        # cuBLAS accumulates in fp32 and adds into the total: no temporary the size of the
        # total. Only inside a custom op: torch 2.11 cannot trace this call (its fake fails).
        torch.addmm(total, a, b, out_dtype=total.dtype, out=total)
    else:  # the CPU has no mixed-dtype product
        total.addmm_(a.to(total.dtype), b.to(total.dtype))

def softcapped_cross_entropy_rows(logits, targets, losses, scale, softcap, with_gradients):
    """Launch the head kernel on each row of `logits`: each row's loss into `losses` and, with
    `with_gradients`, the unscaled shares of its gradient over the row, 0 at the target; return
    the rows' scales and the targets' shares, in fp32."""
    row_scales, target_shares = torch.empty(2, len(logits), dtype=torch.float32,
                                            device=logits.device)
    softcapped_cross_entropy_kernel[(len(logits),)](logits, targets.contiguous(), losses,
                                                    row_scales, target_shares, scale,
                                                    logits.size(1), softcap, with_gradients,
                                                    **HEAD_KERNEL_SETTING)
    return row_scales, target_shares

if triton is not None:
    @triton.jit
    def tanh_and_slope(x):
        """tanh(x) and its slope 1 - tanh(x)^2 in fp32, from exp (the interpreter has no tanh)
        of -2|x|, which cannot overflow; the slope as 4e / (1 + e)^2, which loses nothing to
        cancellation where tanh nears +-1. One division: the special-function unit is busy."""
        e = tl.exp(-2 * tl.abs(x))
        r = 1 / (1 + e)
        tanh = (1 - e) * r
        return tl.where(x < 0, -tanh, tanh), 4 * e * r * r

    @triton.jit
    def softcapped_cross_entropy_kernel(logits_ptr, targets_ptr, losses_ptr, row_scales_ptr,
                                        target_shares_ptr, scale, num_columns: tl.constexpr,
                                        softcap: tl.constexpr, GRADIENTS: tl.constexpr,
                                        BLOCK: tl.constexpr):
        """One row of logits z, each read once: stores the loss of c = softcap * tanh(z /
        softcap), and with GRADIENTS the loss's gradient over z, scale * (softmax(c) -
        onehot(target)) * tanh'(z / softcap), as the row's scale, scale / sum(e^c), into
        row_scales, times unscaled shares: e^c tanh'(z / softcap) written over z, but 0 at the
        target, whose share, (e^c - sum(e^c)) tanh', goes into target_shares in fp32. The row's
        sum is known only at its end: this way each logit's share is written as it is read.

        As |c| < softcap, e^c can neither overflow nor vanish: the sum needs no running max.
        Barriers between the warps order the row's memory: the target's logit is read before
        any warp writes over the row, and zeroed after every warp has."""
        row = tl.program_id(0).to(tl.int64)
        logits_ptr += row * num_columns
        target = tl.load(targets_ptr + row)
        z_target = tl.load(logits_ptr + target).to(tl.float32)
        tanh_target, slope_target = tanh_and_slope(z_target * (1 / softcap))
        if GRADIENTS:
            tl.debug_barrier()
        sum_exp = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, num_columns, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            z = tl.load(logits_ptr + cols, mask=cols < num_columns, other=0).to(tl.float32)
            tanh, slope = tanh_and_slope(z * (1 / softcap))
            exp_c = tl.exp(softcap * tanh)
            sum_exp += tl.where(cols < num_columns, exp_c, 0)
            if GRADIENTS:
                tl.store(logits_ptr + cols, (exp_c * slope).to(logits_ptr.dtype.element_ty),
                         mask=cols < num_columns)
        total = tl.sum(sum_exp, axis=0)
        tl.store(losses_ptr + row, tl.log(total) - softcap * tanh_target)
        if GRADIENTS:
            tl.store(row_scales_ptr + row, scale / total)
            tl.store(target_shares_ptr + row,
                     (tl.exp(softcap * tanh_target) - total) * slope_target)
            tl.debug_barrier()
            tl.store(logits_ptr + target, tl.zeros([], logits_ptr.dtype.element_ty))

# ------------------------------------------------------------------------ the MLP's kernel
# relu_square_mlp with ReLU^2 computed where the products around it write: the first product,
# pre = x W_fc^T, also writes h = relu(pre)^2, and pre is saved; in the backward, the product
# that makes d/dh multiplies it by 2 relu(pre) as it writes, and writes h again for d/dW_proj.

MLP_TILES = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8)
# The depths of its pipeline of loads, the H100's first: a GPU takes the first that fits its
# shared memory per block, the 99 KB GPUs (sm_86, sm_89, sm_120) one load fewer in flight.
MLP_STAGES = (4, 3)

def mlp_pipeline_stages(device):
    """The first of MLP_STAGES that fits `device`'s shared memory per block, or None; on a CPU,
    where Triton's interpreter runs the kernels, the first."""
    if device.type != "cuda":
        return MLP_STAGES[0]
    gpu = torch.cuda.get_device_properties(device)
    return next((stages for stages in MLP_STAGES
                 if mlp_shared_memory(stages, gpu.major) <= gpu.shared_memory_per_block_optin),
                None)

def mlp_shared_memory(num_stages, major):
    """The bytes of shared memory per block that Triton's build of the MLP kernel takes with
    `num_stages` on a GPU of compute capability `major`.x, with 1 KiB to spare (sm_100's barriers
    take 16): bf16 tiles of both operands, `num_stages` of them where copies run asynchronously
    to the tensor cores (sm_90, sm_100), one fewer elsewhere (tests/kernels_for_gpus.py)."""
    buffers = num_stages - (major not in (9, 10))
    return buffers * (MLP_TILES["BLOCK_M"] + MLP_TILES["BLOCK_N"]) * MLP_TILES["BLOCK_K"] * 2 + 1024

def mlp_fits_tiles(tokens, dim, hidden):
    """Whether an MLP of `tokens` x `dim` inputs and `hidden` units splits into whole tiles."""
    return (tokens % MLP_TILES["BLOCK_M"] == 0 and hidden % MLP_TILES["BLOCK_N"] == 0
            and dim % MLP_TILES["BLOCK_K"] == 0)

def triton_relu_square_mlp(x, w_fc, w_proj, num_stages):
    """`relu_square_mlp` through the MLP kernel, with a pipeline of `num_stages` loads."""
    return ReluSquareMLP.apply(x, w_fc, w_proj, num_stages)

class ReluSquareMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_fc, w_proj, num_stages):
        pre, h = relu_square_matmul(x, w_fc.T, None, num_stages)
        ctx.save_for_backward(x, w_fc, w_proj, pre)
        ctx.num_stages = num_stages
        return h @ w_proj.T

    @staticmethod
    def backward(ctx, grad_out):
        x, w_fc, w_proj, pre = ctx.saved_tensors
        grad_pre, h = relu_square_matmul(grad_out, w_proj, pre, ctx.num_stages)
        return grad_pre @ w_fc, grad_pre.T @ x, grad_out.T @ h, None

@torch.library.custom_op(f"{OPS}::relu_square_matmul", mutates_args=())
def relu_square_matmul(a: torch.Tensor, b: torch.Tensor, pre: typing.Optional[torch.Tensor],
                       num_stages: int) -> tuple[torch.Tensor, torch.Tensor]:
    """With `pre` None: (a b, relu(a b)^2). Given `pre`: (a b * 2 relu(pre), relu(pre)^2)."""
    (M, K), N = a.shape, b.size(1)
    if not mlp_fits_tiles(M, K, N):
        raise ValueError(f"relu_square_matmul: a {M} x {K} by {K} x {N} product does not split "
                         "into the kernel's whole tiles")
    a, pre = a.contiguous(), None if pre is None else pre.contiguous()
    out, h = a.new_empty(M, N), a.new_empty(M, N)
    grid = (M // MLP_TILES["BLOCK_M"] * (N // MLP_TILES["BLOCK_N"]),)
    # the interpreter multiplies bf16 as raw bits: fp32 holds the same values
    operand = tl.bfloat16 if a.is_cuda else tl.float32
    relu_square_matmul_kernel[grid](a, b, out if pre is None else pre, out, h, M, N, K,
                                    *b.stride(), pre is not None, operand, **MLP_TILES,
                                    num_stages=num_stages)
    return out, h

@relu_square_matmul.register_fake
def _(a, b, pre, num_stages):
    return a.new_empty(a.size(0), b.size(1)), a.new_empty(a.size(0), b.size(1))

if triton is not None:
    @triton.jit
    def relu_square_matmul_kernel(a_ptr, b_ptr, pre_ptr, out_ptr, h_ptr, M, N: tl.constexpr,
                                  K: tl.constexpr, stride_bk, stride_bn, BACKWARD: tl.constexpr,
                                  OPERAND: tl.constexpr, BLOCK_M: tl.constexpr,
                                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                  GROUP_M: tl.constexpr):
        """One BLOCK_M x BLOCK_N tile of a b (a: M x K, row-major; b: K x N), rounded to bf16
        where the compiled graph rounds. Forward: writes the product, and relu(product)^2.
        Backward: writes product * 2 relu(pre), and relu(pre)^2. Tiles run GROUP_M row tiles
        at a time, column by column, so that the rows of `a` they read stay in the L2 cache."""
        pid, tiles_n = tl.program_id(0), N // BLOCK_N
        first_m = pid // (GROUP_M * tiles_n) * GROUP_M
        group_m = min(M // BLOCK_M - first_m, GROUP_M)
        tile_m = first_m + pid % (GROUP_M * tiles_n) % group_m
        tile_n = pid % (GROUP_M * tiles_n) // group_m
        rows = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = tl.load(a_ptr + rows[:, None] * K + (k + ks)[None, :]).to(OPERAND)
            b = tl.load(b_ptr + (k + ks)[:, None] * stride_bk + cols[None, :] * stride_bn)
            acc = tl.dot(a, b.to(OPERAND), acc)
        tile = rows[:, None] * N + cols[None, :]
        product = acc.to(out_ptr.dtype.element_ty)
        if BACKWARD:
            relu = tl.maximum(tl.load(pre_ptr + tile).to(tl.float32), 0)
            tl.store(out_ptr + tile, (product.to(tl.float32) * 2 * relu).to(product.dtype))
        else:
            relu = tl.maximum(product.to(tl.float32), 0)
            tl.store(out_ptr + tile, product)
        tl.store(h_ptr + tile, (relu * relu).to(product.dtype))

if __name__ == "__main__":
    try:
        main()
    except UserError as err:
        sys.exit(f"error: {err}")
    except KeyboardInterrupt:  # before the run notes Ctrl-C itself (stop_signals), or after
        sys.exit("interrupted")
