#!/usr/bin/env python3
"""One case of LRA's efficiency protocol in PyTorch, printed as a JSON line: the same model and
measurement as `burn-lra bench-train` (a task's model of a preset, full-length random tokens,
median time of a training step over `--steps` after `--warmup`, peak resident memory above the
level once the model was built), with the attention taken from the PyPI packages of
`torch_attention.py`. `cargo xtask bench lra` runs it beside ours.

The model mirrors burn-lra's classifier for the preset's `[model]` table: token embedding, a
zero-initialised CLS token (CLS pooling) or none (mean pooling), sinusoidal or learned positions,
pre-LN blocks `x + Dropout(Attn(LN(x)))`, `x + Dropout(Dense(Dropout(GELU(Dense(LN(x))))))`, a
final LayerNorm, CLS or mean pooling, `Dense(d_mlp) ReLU Dense(classes)`; AdamW with the preset's
betas, epsilon and weight decay. The preset's dropout everywhere, its attention dropout on the
weights of the attentions that have them (softmax, linformer), as on our side.
"""
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from torch_attention import Peak, build, case_parser, set_up


def sinusoidal(n, d):
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    i = torch.arange(0, d, 2, dtype=torch.float32)
    angle = pos / torch.pow(10000.0, i / d)
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table


class Block(nn.Module):
    def __init__(self, attention, d, d_ff, dropout):
        super().__init__()
        self.attn, self.drop = attention, nn.Dropout(dropout)
        self.norm_attn, self.norm_ff = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.ff_in, self.ff_out = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x):
        x = x + self.drop(self.attn(self.norm_attn(x)))
        h = self.ff_out(self.drop(F.gelu(self.ff_in(self.norm_ff(x)))))
        return x + self.drop(h)


class Classifier(nn.Module):
    def __init__(self, attention, n, m, params, vocab=257, classes=2):
        super().__init__()
        d = m["d_model"]
        self.mean = m["pooling"] == "mean"
        n_in = n if self.mean else n + 1
        self.embedding = nn.Embedding(vocab, d)
        self.cls = None if self.mean else nn.Parameter(torch.zeros(1, 1, d))
        if m["positions"] == "learned":
            self.positions = nn.Parameter(0.02 * torch.randn(n_in, d))
        else:
            self.register_buffer("positions", sinusoidal(n_in, d))
        self.drop = nn.Dropout(m["dropout"])
        attention_dropout = m["attention_dropout"]
        self.blocks = nn.ModuleList(
            Block(
                build(attention, d, m["n_heads"], n_in, params, attention_dropout),
                d,
                m["d_ff"],
                m["dropout"],
            )
            for _ in range(m["n_layers"])
        )
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.hidden, self.out = nn.Linear(d, m["d_mlp"]), nn.Linear(m["d_mlp"], classes)

    def forward(self, tokens):
        x = self.embedding(tokens)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], 1, -1), x], 1)
        x = self.drop(x + self.positions)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        pooled = x.mean(dim=1) if self.mean else x[:, 0]
        return self.out(F.relu(self.hidden(pooled)))


def main():
    p = case_parser(__doc__, batch=32, repeats="--steps")
    p.add_argument("--model", required=True, help="the preset's [model] table as JSON")
    p.add_argument("--optimizer", required=True, help="the preset's optimiser table as JSON")
    p.add_argument("--vocab", type=int, default=257, help="token ids (the Text task's: 257)")
    p.add_argument("--classes", type=int, default=2, help="classes (the Text task's: 2)")
    a = p.parse_args()
    set_up(a)
    m, o = json.loads(a.model), json.loads(a.optimizer)
    device = torch.device(a.device)
    model = Classifier(a.attention, a.n, m, json.loads(a.params), a.vocab, a.classes).to(device)
    optim = torch.optim.AdamW(
        model.parameters(),
        lr=1e-4,
        betas=(o["beta1"], o["beta2"]),
        eps=o["epsilon"],
        weight_decay=o["weight_decay"],
    )
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    peak = Peak(device)
    peak.start()
    times = []
    for step in range(a.warmup + a.steps):
        tokens = torch.randint(1, a.vocab, (a.batch, a.n), device=device)
        labels = torch.randint(0, a.classes, (a.batch,), device=device)
        if peak.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = F.cross_entropy(model(tokens), labels)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        if peak.cuda:
            torch.cuda.synchronize()
        if step >= a.warmup:
            times.append((time.perf_counter() - start) * 1e3)
    step_ms = statistics.median(times)
    print(
        json.dumps(
            {
                "attention": a.attention,
                "n": a.n,
                "batch": a.batch,
                "n_params": n_params,
                "step_ms": step_ms,
                "steps_per_s": 1e3 / step_ms,
                "peak_mib": peak.mib(),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "device": a.device,
            }
        )
    )


if __name__ == "__main__":
    main()
