#!/usr/bin/env python3
"""One efficiency measurement of one PyTorch attention at one length, printed as a JSON line:
the same protocol as `burn-lra bench-attention` (median forward and forward + backward time over
`--reps` after `--warmup`, peak resident memory of this process above its level before the first
input), so that `cargo xtask bench attention` can put the two side by side.

Variants: softmax (four linear projections around torch's scaled_dot_product_attention), linear
(Katharopoulos et al.'s elu + 1 feature map) and efficient (Shen et al.'s softmax over features
and over positions), each a few lines of torch inside the same projections, and the packages
people use: linformer (LinformerSelfAttention), performer and performer-relu
(performer-pytorch SelfAttention, FAVOR+ or its generalized ReLU kernel), nystrom
(nystrom-attention NystromAttention), local (local-attention LocalAttention, blocks attending to
themselves, inside the same four projections), reformer (reformer-pytorch LSHSelfAttention),
sinkhorn (sinkhorn-transformer SinkhornSelfAttention), longformer and bigbird (HuggingFace
transformers' LongformerSelfAttention and BigBirdBlockSparseAttention, each with an output
projection), memory-compressed (memory-compressed-attention), set-transformer (isab-pytorch
ISAB), axial (axial-attention AxialAttention), compressive and transformer-xl
(compressive-transformer-pytorch SelfAttention over the segments, with and without compressed
memory), routing (routing-transformer SelfAttention), and the linear attentions with a state
that decays, gates or is written by the delta rule, a few lines of torch each from the papers'
chunkwise forms, as the library computes them (the packages that have them, flash-linear-attention
and mamba-ssm, need a GPU and Triton or CUDA kernels): retnet (RetNet's retention), mamba2 (the
SSD mixer), gla, deltanet and gated-deltanet (the WY form, torch.linalg.solve_triangular within a
chunk), and hedgehog (its feature maps around linear attention). Installed by `cargo xtask bench
setup`.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


def proc_status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return float(line.split()[1])
    return 0.0


def linear_attention(q, k, v):
    """Non-causal linear attention, `phi(q) (phi(k)^T v) / (phi(q) . sum_j phi(k_j))`,
    `phi = elu + 1` (Katharopoulos et al. 2020, eq. 4-6)."""
    q, k = F.elu(q) + 1, F.elu(k) + 1
    kv = k.transpose(-2, -1) @ v
    z = q @ k.sum(dim=-2, keepdim=True).transpose(-2, -1)
    return (q @ kv) / z.clamp_min(1e-6)


def efficient_attention(q, k, v):
    """Efficient Attention (Shen et al. 2021): `softmax_features(q) (softmax_positions(k)^T v)`."""
    return q.softmax(dim=-1) @ (k.softmax(dim=-2).transpose(-2, -1) @ v)


def segment_sums(g):
    """`out[..., i, j, :] = sum_{j < t <= i} g[..., t, :]` over the positions on the
    second-to-last axis of `g: [..., c, w]` (0 for j >= i): each span summed from its own terms,
    as the library does, not as a difference of cumulative sums."""
    c = g.shape[-2]
    x = g.unsqueeze(-2).expand(*g.shape[:-2], c, c, g.shape[-1])
    after = torch.ones(c, c, dtype=torch.bool, device=g.device).tril(-1)
    return x.masked_fill(~after[..., None], 0).cumsum(-3)


def decayed_causal(q, k, v, log_decay, chunk=64):
    """Causal linear attention with a decaying state, `o_i = sum_{j<=i} exp(G_i - G_j) (q_i.k_j)
    v_j` with `G` the cumulative log-decay (one per position, width 1, or one per key channel,
    width d_k: GLA's gates), in chunks (the chunkwise form of RetNet, Sun et al. 2023, section
    2.3; GLA, Yang et al. 2024, section 4): within a chunk the masked `c x c` weights, across
    chunks the state each chunk writes, carried by a `chunks x chunks` matrix of decays with one
    decay per position, and from chunk to chunk with one per key channel (the matrix would take
    `(n / c)^2 d_k`, a gigabyte at 16K positions in chunks of 16; the chunks taken apart by
    `unbind`, whose backward is one `stack`, where indexing chunk by chunk would give each a
    gradient the size of the whole tensor). Every decay is `exp` of a span summed over its own
    terms."""
    b, h, n, dk = q.shape
    dv, w = v.shape[-1], log_decay.shape[-1]
    c = min(chunk, n)
    m = -(-n // c)
    fill = m * c - n
    pad = lambda t: F.pad(t, (0, 0, 0, fill)).view(b, h, m, c, t.shape[-1])
    q, k, v, g = pad(q), pad(k), pad(v), pad(log_decay)
    cum = g.cumsum(3)
    decays = segment_sums(g).exp()  # [b, h, m, c, c, w]
    past = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    if w == 1:
        scores = (q @ k.transpose(3, 4)) * decays[..., 0]
    else:
        scores = (q[..., :, None, :] * k[..., None, :, :] * decays).sum(-1)
    intra = scores.masked_fill(~past, 0) @ v
    writes = (k * decays[..., -1, :, :]).transpose(3, 4) @ v  # [b, h, m, dk, dv]
    if w == 1:
        totals = segment_sums(cum[..., -1, :]).exp()  # [b, h, m, m, 1]
        upto = torch.ones(m, m, dtype=torch.bool, device=q.device).tril()
        totals = totals[..., 0].masked_fill(~upto, 0)  # [b, h, m, m]
        after = (totals @ writes.reshape(b, h, m, dk * dv)).reshape(b, h, m, dk, dv)
        before = torch.cat([torch.zeros_like(after[:, :, :1]), after[:, :, :-1]], 2)
    else:
        state, states = q.new_zeros(b, h, dk, dv), []
        for write, total in zip(writes.unbind(2), cum[..., -1, :].exp().unbind(2)):
            states.append(state)
            state = state * total[..., None] + write
        before = torch.stack(states, 2)
    inter = (q * cum.exp()) @ before
    return (intra + inter).reshape(b, h, m * c, dv)[:, :, :n]


def decayed_both_ways(q, k, v, log_decay, chunk=64):
    """The non-causal form: the causal one over the sequence and over its reverse, less the
    diagonal both count."""
    flip = lambda t: t.flip(2)
    return (
        decayed_causal(q, k, v, log_decay, chunk)
        + flip(decayed_causal(flip(q), flip(k), flip(v), flip(log_decay), chunk))
        - (q * k).sum(-1, keepdim=True) * v
    )


def decayed(q, k, v, log_decay, causal, chunk=64):
    """The causal form, or both ways."""
    if causal:
        return decayed_causal(q, k, v, log_decay, chunk)
    return decayed_both_ways(q, k, v, log_decay, chunk)


def heads_of(x, heads):
    b, n, d = x.shape
    return x.view(b, n, heads, d // heads).transpose(1, 2)


def merged(x):
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)


def per_head(x):
    """`[b, n, heads]` as `[b, heads, n, 1]`."""
    return x.transpose(1, 2).unsqueeze(-1)


def rms_heads(o, eps=1e-5):
    return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)


class Mamba2Mixer(nn.Module):
    """Mamba-2's SSD mixer (Dao & Gu 2024, arXiv 2405.21060) as the library computes it: C, B, x
    per head, Delta = softplus(x W + b), A = -exp(A_log), D skip, the gated RMSNorm, the output
    projection; causal, or both directions less the diagonal."""

    def __init__(self, dim, heads, causal=False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.c, self.b, self.x, self.z, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(5))
        self.dt = nn.Linear(dim, heads, bias=False)
        self.dt_bias = nn.Parameter(torch.full((heads,), -3.0))
        self.a_log = nn.Parameter(torch.empty(heads).uniform_(1, 16).log())
        self.d = nn.Parameter(torch.ones(heads))
        self.norm = nn.Parameter(torch.ones(dim))

    def forward(self, inp):
        h = self.heads
        c, b, x = heads_of(self.c(inp), h), heads_of(self.b(inp), h), heads_of(self.x(inp), h)
        dt = per_head(F.softplus(self.dt(inp) + self.dt_bias))
        g = dt * -self.a_log.exp().view(1, h, 1, 1)
        y = decayed(c, b * dt, x, g, self.causal) + x * self.d.view(1, h, 1, 1)
        y = merged(y) * F.silu(self.z(inp))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * self.norm
        return self.o(y)


class GatedLinearAttention(nn.Module):
    """GLA (Yang et al. 2024, arXiv 2312.06635) as the library computes it: keys and queries
    half the width, gates sigmoid(x W1 W2 + b)^(1/16) per key channel, chunks of 16, per-head
    RMSNorm, swish output gate; causal, or both directions less the diagonal."""

    def __init__(self, dim, heads, causal=False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.q, self.k = nn.Linear(dim, dim // 2, bias=False), nn.Linear(dim, dim // 2, bias=False)
        self.v, self.o = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.gate = nn.Sequential(nn.Linear(dim, 16, bias=False), nn.Linear(16, dim // 2))
        self.r = nn.Linear(dim, dim)
        self.norm = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = self.heads
        q, k, v = heads_of(self.q(x), h), heads_of(self.k(x), h), heads_of(self.v(x), h)
        q = q * q.shape[-1] ** -0.5
        g = heads_of(F.logsigmoid(self.gate(x)) / 16, h)
        o = merged(rms_heads(decayed(q, k, v, g, self.causal, chunk=16))) * self.norm
        return self.o(F.silu(self.r(x)) * o)


def delta_causal(q, k, v, beta, g, chunk=32):
    """The (gated) delta rule in chunks (Yang et al. 2024, arXiv 2406.06484, section 3; decays as
    Yang, Kautz & Hatamizadeh 2025): per chunk the WY pseudo-values from the unit lower-triangular
    system, solved by torch.linalg.solve_triangular, then the chunks one after another (taken
    apart by `unbind`, whose backward is one `stack`, where indexing chunk by chunk would give
    each a gradient the size of the whole tensor)."""
    b, h, n, dk = q.shape
    dv = v.shape[-1]
    c = min(chunk, n)
    m = -(-n // c)
    fill = m * c - n
    pad = lambda t: F.pad(t, (0, 0, 0, fill)).view(b, h, m, c, t.shape[-1])
    q, k, v, beta, g = pad(q), pad(k), pad(v), pad(beta), pad(g)
    cum = g.cumsum(3)
    gamma = segment_sums(g)[..., 0].exp()  # [b, h, m, c, c]
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril(-1)
    a = ((k @ k.transpose(3, 4)) * gamma * beta).masked_fill(~lower, 0)
    eye = torch.eye(c, device=q.device)
    rhs = torch.cat([v, k * cum.exp()], -1) * beta
    solved = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
    u_all, w_all = solved[..., :dv], solved[..., dv:]
    past = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    scores = ((q @ k.transpose(3, 4)) * gamma).masked_fill(~past, 0)
    qd, kd, total = q * cum.exp(), k * gamma[..., -1, :, None], cum[..., -1:, :].exp()
    s = q.new_zeros(b, h, dk, dv)
    outs = []
    chunks = zip(*(t.unbind(2) for t in (u_all, w_all, qd, scores, total, kd)))
    for u_i, w_i, qd_i, scores_i, total_i, kd_i in chunks:
        u = u_i - w_i @ s
        outs.append(qd_i @ s + scores_i @ u)
        s = s * total_i + kd_i.transpose(2, 3) @ u
    return torch.cat(outs, 2)[:, :, :n]


class DeltaNet(nn.Module):
    """DeltaNet and Gated DeltaNet as the library computes them: L2(silu(x W)) queries and keys,
    beta = sigmoid(x W_b), the gated form's decay exp(-exp(A_log) softplus(x W_a + b)), silu
    values and output gate; per-head RMSNorm; causal, or the forward recurrence plus the
    reversed one read before each position's own write."""

    def __init__(self, dim, heads, gated, causal=False):
        super().__init__()
        self.heads, self.gated, self.causal = heads, gated, causal
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.beta = nn.Linear(dim, heads, bias=False)
        if gated:
            self.dt = nn.Linear(dim, heads, bias=False)
            self.dt_bias = nn.Parameter(torch.full((heads,), -3.0))
            self.a_log = nn.Parameter(torch.empty(heads).uniform_(1, 16).log())
            self.g = nn.Linear(dim, dim, bias=False)
        self.norm = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = self.heads
        unit = lambda t: F.normalize(heads_of(F.silu(t), h), dim=-1, eps=1e-6)
        q, k, v = unit(self.q(x)), unit(self.k(x)), heads_of(self.v(x), h)
        q = q * q.shape[-1] ** -0.5
        beta = per_head(torch.sigmoid(self.beta(x)))
        if self.gated:
            v = F.silu(v)
            dt = per_head(F.softplus(self.dt(x) + self.dt_bias))
            g = dt * -self.a_log.exp().view(1, h, 1, 1)
        else:
            g = torch.zeros_like(beta)
        n = x.shape[1]
        flip = lambda t: t.flip(2)
        forward = delta_causal(q, k, v, beta, g)
        if self.causal:
            o = merged(rms_heads(forward)) * self.norm
            return self.o(o * F.silu(self.g(x)) if self.gated else o)
        early = torch.cat([flip(q * g.exp())[:, :, 1:], torch.zeros_like(q[:, :, :1])], 2)
        backward = delta_causal(early, flip(k), flip(v), flip(beta), flip(g))
        backward = torch.cat([torch.zeros_like(backward[:, :, :1]), backward[:, :, : n - 1]], 2)
        o = merged(rms_heads(forward + flip(backward))) * self.norm
        if self.gated:
            o = o * F.silu(self.g(x))
        return self.o(o)


class Hedgehog(nn.Module):
    """Hedgehog (Zhang et al. 2024, arXiv 2402.04347): feature maps [softmax(x W), softmax(-x W)]
    per head for queries and keys (W from the identity), then linear attention (causal: the
    decaying form's chunks with no decay, the normaliser as a column of ones)."""

    def __init__(self, dim, heads, causal=False):
        super().__init__()
        self.heads, self.causal = heads, causal
        d = dim // heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.wq = nn.Parameter(torch.eye(d).repeat(heads, 1, 1))
        self.wk = nn.Parameter(torch.eye(d).repeat(heads, 1, 1))

    def forward(self, x):
        h = self.heads
        feature = lambda t, w: torch.cat([(t @ w).softmax(-1), (-(t @ w)).softmax(-1)], -1)
        q = feature(heads_of(self.q(x), h), self.wq)
        k = feature(heads_of(self.k(x), h), self.wk)
        v = heads_of(self.v(x), h)
        if self.causal:
            ones = torch.ones_like(v[..., :1])
            sums = decayed_causal(q, k, torch.cat([v, ones], -1), torch.zeros_like(ones))
            return self.o(merged(sums[..., :-1] / sums[..., -1:]))
        kv = k.transpose(-2, -1) @ v
        z = q @ k.sum(dim=-2, keepdim=True).transpose(-2, -1)
        return self.o(merged((q @ kv) / z))


class Retention(nn.Module):
    """RetNet's multi-scale retention (Sun et al. 2023, arXiv 2307.08621), written from the
    paper as the library computes it: rotary positions (angles 10000^-linspace(0, 1, d/2)),
    decays gamma_h = 1 - 2^(-5-h), the decays scaled by sqrt(sum_j D_ij) and the scores by
    max(|sum_j R_ij|, 1), a per-head normalisation, the swish gate and the output projection.
    Non-causal: the decay gamma^|i-j| on every pair, the chunked causal form over the sequence
    and its reverse, less the diagonal; or causal."""

    def __init__(self, dim, heads, causal=False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.q, self.k, self.v, self.g, self.o = (
            nn.Linear(dim, dim, bias=False) for _ in range(5)
        )
        gammas = 1 - 2 ** (-5 - torch.arange(heads, dtype=torch.float64))
        self.register_buffer("log_decay", gammas.log().float().view(1, heads, 1, 1))
        self.register_buffer("theta", 10_000 ** -torch.linspace(0, 1, dim // heads // 2))

    def forward(self, x):
        b, n, dim = x.shape
        h, d = self.heads, dim // self.heads
        split = lambda t: t.view(b, n, h, d).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        pos = torch.arange(n, device=x.device, dtype=x.dtype)
        angle = pos[:, None] * self.theta[None, :]
        cos, sin = angle.cos(), angle.sin()

        def rotate(t):
            even, odd = t[..., 0::2], t[..., 1::2]
            return torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2)

        q, k = rotate(q) * d**-0.5, rotate(k)
        v = torch.cat([v, torch.ones_like(v[..., :1])], -1)
        g = self.log_decay.expand(b, h, n, 1)
        gamma = self.log_decay.exp()
        seen = pos.view(1, 1, n, 1) + 1
        if self.causal:
            sums = decayed_causal(q, k, v, g)
            mass = (1 - gamma**seen) / (1 - gamma)
        else:
            sums = decayed_both_ways(q, k, v, g)
            mass = ((1 - gamma**seen) + (1 - gamma ** (n - seen + 1))) / (1 - gamma) - 1
        o = sums[..., :d] / torch.maximum(sums[..., d:].abs(), mass.sqrt())
        y = F.layer_norm(o, (d,), eps=1e-5).transpose(1, 2).reshape(b, n, dim)
        return self.o(F.silu(self.g(x)) * y)


class Projected(nn.Module):
    """Four linear projections around a per-head attention `attend(q, k, v)` on
    `[batch, heads, n, d]` tensors (torch's scaled_dot_product_attention by default, with
    `dropout` on its weights while training)."""

    def __init__(self, dim, heads, attend=None, dropout=0.0, causal=False):
        super().__init__()
        self.heads = heads
        self.attend = attend
        self.dropout = dropout
        self.causal = causal
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x):
        b, n, d = x.shape
        split = lambda t: t.view(b, n, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        if self.attend is None:
            p = self.dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal)
        else:
            out = self.attend(q, k, v)
        return self.o(out.transpose(1, 2).reshape(b, n, d))


class HfLongformer(nn.Module):
    """HuggingFace transformers' LongformerSelfAttention (its window's and global Q/K/V
    projections; the first position global, as LRA's CLS) and an output projection."""

    def __init__(self, dim, heads, window):
        super().__init__()
        from transformers import LongformerConfig
        from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

        config = LongformerConfig(
            hidden_size=dim,
            num_attention_heads=heads,
            attention_window=[window],
            attention_probs_dropout_prob=0.0,
        )
        self.attn = LongformerSelfAttention(config, layer_id=0)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        # The layer's mask convention: 0 local, > 0 global, < 0 padding.
        mask = torch.zeros(x.shape[0], x.shape[1])
        mask[:, 0] = 1.0
        out = self.attn(
            x,
            attention_mask=mask,
            is_index_masked=mask < 0,
            is_index_global_attn=mask > 0,
            is_global_attn=True,
        )[0]
        return self.o(out)


class HfBigBird(nn.Module):
    """HuggingFace transformers' BigBirdBlockSparseAttention (ITC: window of 3 blocks, first and
    last block global, random blocks; kept in training mode, where HF draws them) and an output
    projection."""

    def __init__(self, dim, heads, block, random_blocks):
        super().__init__()
        from transformers import BigBirdConfig
        from transformers.models.big_bird.modeling_big_bird import (
            BigBirdBlockSparseAttention,
            BigBirdModel,
        )

        config = BigBirdConfig(
            hidden_size=dim,
            num_attention_heads=heads,
            block_size=block,
            num_random_blocks=random_blocks,
            attention_type="block_sparse",
            use_bias=False,
            attention_probs_dropout_prob=0.0,
        )
        self.block = block
        self.attn = BigBirdBlockSparseAttention(config, seed=0)
        self.masks = BigBirdModel.create_masks_for_block_sparse_attn
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        blocked, band, from_mask, to_mask = self.masks(torch.ones(x.shape[:2]), self.block)
        out = self.attn(
            x,
            band_mask=band,
            from_mask=from_mask,
            to_mask=to_mask,
            from_blocked_mask=blocked,
            to_blocked_mask=blocked,
        )[0]
        return self.o(out)


class FirstOutput(nn.Module):
    """A module returning a tuple, reduced to its first element (the attention's output)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)[0]


class Grid(nn.Module):
    """`[b, n, d]` through a module over `[b, side, side, d]`."""

    def __init__(self, inner, side):
        super().__init__()
        self.inner, self.side = inner, side

    def forward(self, x):
        b, n, d = x.shape
        return self.inner(x.reshape(b, self.side, self.side, d)).reshape(b, n, d)


class Segmented(nn.Module):
    """compressive-transformer-pytorch's SelfAttention (one segment a call, causal, learned
    relative positions) over the sequence in segments of `segment_len`, each segment's memories
    the gradient-stopped ones the previous call returned. Kept in evaluation mode: in training
    mode the package computes its reconstruction loss in every call (ours only in
    `try_forward_with_loss`, which the benchmark does not call) and detaches its key/value
    weights in place."""

    def __init__(self, dim, heads, segment_len, mem_len, cmem_len, ratio):
        super().__init__()
        from compressive_transformer_pytorch.compressive_transformer_pytorch import SelfAttention

        self.attn = SelfAttention(dim, segment_len, mem_len, cmem_len, ratio, heads)
        self.segment_len = segment_len
        total = segment_len + mem_len + cmem_len
        self.pos_emb = nn.Parameter(0.02 * torch.randn(heads, total, dim // heads))

    def forward(self, x):
        self.attn.eval()
        out, memories = [], None
        for start in range(0, x.shape[1], self.segment_len):
            y, (mem, cmem), _ = self.attn(
                x[:, start : start + self.segment_len], memories=memories, pos_emb=self.pos_emb
            )
            memories = (mem.detach(), cmem.detach())
            out.append(y)
        return torch.cat(out, 1)


# The attentions whose PyTorch side here has a causal form (`--causal`).
CAUSAL = ("softmax", "retnet", "mamba2", "gla", "deltanet", "gated-deltanet", "hedgehog")


def build(name, dim, heads, n, params, dropout=0.0, causal=False):
    """The attention `name`; `dropout` on its weights where it has weights to drop (softmax,
    linformer), as ours applies the preset's attention dropout; `causal` for those in CAUSAL."""
    if causal and name not in CAUSAL:
        raise SystemExit(f"error: no causal PyTorch form of `{name}` in this benchmark")
    if name == "softmax":
        return Projected(dim, heads, dropout=dropout, causal=causal)
    if name == "linear":
        return Projected(dim, heads, attend=linear_attention)
    if name == "efficient":
        return Projected(dim, heads, attend=efficient_attention)
    if name == "local":
        from local_attention import LocalAttention

        # Blocks of `block_size`, each attending to itself only (no look-back or ahead).
        local = LocalAttention(
            window_size=params.get("block_size", 50),
            look_backward=0,
            look_forward=0,
            autopad=True,
            use_rotary_pos_emb=False,
        )
        return Projected(dim, heads, attend=local)
    if name == "reformer":
        from reformer_pytorch import LSHSelfAttention

        return LSHSelfAttention(
            dim,
            heads=heads,
            dim_head=dim // heads,
            bucket_size=params.get("chunk_len", 64),
            n_hashes=params.get("n_hashes", 2),
        )
    if name == "sinkhorn":
        from sinkhorn_transformer import SinkhornSelfAttention

        return SinkhornSelfAttention(
            dim,
            bucket_size=params.get("block_size", 50),
            max_seq_len=n,
            heads=heads,
            dim_head=dim // heads,
            sinkhorn_iter=params.get("iterations", 5),
            temperature=params.get("temperature", 0.75),
        )
    if name == "linformer":
        from linformer import LinformerSelfAttention

        return LinformerSelfAttention(
            dim, seq_len=n, k=params.get("k", 256), heads=heads, dropout=dropout
        )
    if name in ("performer", "performer-relu"):
        from performer_pytorch import SelfAttention

        return SelfAttention(
            dim,
            heads=heads,
            dim_head=dim // heads,
            nb_features=params.get("n_features", 256),
            generalized_attention=name == "performer-relu",
        )
    if name == "nystrom":
        from nystrom_attention import NystromAttention

        kernel = params.get("conv_kernel")
        return NystromAttention(
            dim,
            dim_head=dim // heads,
            heads=heads,
            num_landmarks=params.get("n_landmarks", 64),
            pinv_iterations=params.get("pinv_iterations", 6),
            residual=kernel is not None,
            residual_conv_kernel=kernel or 33,
        )
    if name == "memory-compressed":
        from memory_compressed_attention import MemoryCompressedAttention

        # Its own projections; one convolution, grouped per head, for keys and values (ours:
        # one over all channels for each).
        return MemoryCompressedAttention(
            dim, heads=heads, compression_factor=params.get("compression", 3)
        )
    if name == "set-transformer":
        from isab_pytorch import ISAB

        return FirstOutput(ISAB(dim=dim, heads=heads, num_latents=params.get("n_inducing", 32)))
    if name == "axial":
        from axial_attention import AxialAttention

        # Row and column attention, each with all the heads, summed (ours: half the heads
        # each): the sequence as a square grid.
        side = math.isqrt(n)
        if side * side != n:
            raise SystemExit(f"error: axial needs a square length, got {n}")
        return Grid(AxialAttention(dim, num_dimensions=2, heads=heads, dim_index=-1), side)
    if name in ("transformer-xl", "compressive"):
        # No package implements Transformer-XL's attention alone: its peer is the Compressive
        # Transformer's with no compressed memory, which is Transformer-XL's segment attention
        # with learned relative positions (ours: the paper's sinusoids through W_R, u, v).
        segment = params.get("segment_len", 512)
        cmem = params.get("cmem_len", 512) if name == "compressive" else 0
        return Segmented(
            dim, heads, segment, params.get("mem_len", 512), cmem, params.get("compression", 3)
        )
    if name == "retnet":
        return Retention(dim, heads, causal)
    if name == "mamba2":
        return Mamba2Mixer(dim, heads, causal)
    if name == "gla":
        return GatedLinearAttention(dim, heads, causal)
    if name in ("deltanet", "gated-deltanet"):
        return DeltaNet(dim, heads, gated=name == "gated-deltanet", causal=causal)
    if name == "hedgehog":
        return Hedgehog(dim, heads, causal)
    if name == "routing":
        from routing_transformer.routing_transformer import SelfAttention as RoutingAttention

        # k clusters of n/k positions (the package's clusters are n / window_size); half the
        # heads local, in blocks of `window` seeing their neighbours on each side.
        clusters = params.get("n_clusters", 32)
        if n % clusters:
            raise SystemExit(f"error: routing-transformer needs n divisible by {clusters}")
        window = params.get("window", 128)
        return FirstOutput(
            RoutingAttention(
                dim,
                1,
                n,
                heads,
                heads // 2,
                n // clusters,
                local_attn_window_size=window,
                rel_pos_emb=False,
            )
        )
    if name == "longformer":
        return HfLongformer(dim, heads, params.get("window", 512))
    if name == "bigbird":
        return HfBigBird(dim, heads, params.get("block_size", 64), params.get("random_blocks", 3))
    raise SystemExit(f"error: no PyTorch implementation of `{name}` in this benchmark")


def case_parser(description, batch, repeats):
    """The flags of one case, shared with torch_lra.py; `repeats` names the timed runs' flag."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--attention", required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument(repeats, type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--params", default="{}")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument(
        "--device",
        default="cpu",
        help="torch device (cpu, cuda); on cuda the times wait for the GPU and the memory is "
        "torch's peak allocation above its level before the first input",
    )
    return p


class Peak:
    """The peak memory of the measured part, in MiB: the process's resident memory above its
    level at `start` on the CPU, torch's own peak allocation above it on a GPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated() / 1024.0
        else:
            self.before = proc_status_kib("VmRSS:")

    def mib(self):
        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 1024.0
        else:
            peak = proc_status_kib("VmHWM:")
        return max(peak - self.before, 0.0) / 1024.0


def set_up(a):
    """Thread count and seed, before anything is built."""
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)


def main():
    p = case_parser(__doc__, batch=1, repeats="--reps")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--causal", action="store_true", help="causal masking (the CAUSAL variants)")
    a = p.parse_args()
    set_up(a)
    device = torch.device(a.device)
    params = json.loads(a.params)
    module = build(a.attention, a.d_model, a.heads, a.n, params, causal=a.causal).to(device)
    peak = Peak(device)
    peak.start()
    forward, both = [], []
    for rep in range(a.warmup + a.reps):
        x = torch.randn(a.batch, a.n, a.d_model, device=device)
        start = time.perf_counter()
        with torch.no_grad():
            module(x).sum().item()
        t_forward = (time.perf_counter() - start) * 1e3
        x.requires_grad_(True)
        start = time.perf_counter()
        module(x).sum().backward()
        x.grad.sum().item()
        t_both = (time.perf_counter() - start) * 1e3
        if rep >= a.warmup:
            forward.append(t_forward)
            both.append(t_both)
    print(
        json.dumps(
            {
                "attention": a.attention,
                "n": a.n,
                "forward_ms": statistics.median(forward),
                "forward_backward_ms": statistics.median(both),
                "peak_mib": peak.mib(),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "device": a.device,
            }
        )
    )


if __name__ == "__main__":
    main()
