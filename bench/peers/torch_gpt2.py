#!/usr/bin/python3
"""Minimal nanoGPT-style GPT-2 124M training loop in PyTorch (fp32, or bf16 autocast), for the peer benchmark.

Model: 12 layers, width 768, 12 heads, learned positions (1024), LayerNorm (eps 1e-5), GELU (tanh), biases,
tied embedding / unembedding, vocab padded to 50304 as nanoGPT does, no dropout. Causal attention uses
F.scaled_dot_product_attention when it exists (PyTorch >= 2.0) and the explicit masked-softmax form
otherwise (Debian's 1.13). AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1 on 2-D weights, as nanoGPT),
gradient clipping at 1.0. Synthetic tokens, uniform in [0, 50257), a new batch each step, drawn outside
the timed region.

Timed per step: zero_grad + forward + loss + backward + clip + optimizer step (perf_counter).
Prints one line per step:   step N: loss X time_ms Y
Usage: torch_gpt2.py --batch B --seq T --steps N [--threads K] [--seed S] [--mode eager|compile|bf16-autocast]
  --mode compile        the model under torch.compile (PyTorch >= 2.0; the first step includes compilation)
  --mode bf16-autocast  forward and loss under torch.autocast("cpu", dtype=torch.bfloat16): matmuls in bf16,
                        fp32 master weights and optimizer, as a PyTorch user trains bf16 on a CPU
Run it with Debian's /usr/bin/python3 (python3-torch 1.13 imports only there), OMP_NUM_THREADS set, and
LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp so libblas.so.3 is OpenBLAS's OpenMP build; or with
the python of a virtual environment holding PyTorch 2.x from PyPI (its own bundled BLAS), as run_peers.sh does.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, VOCAB_PADDED, MAX_T, L, NH, D = 50257, 50304, 1024, 12, 12, 768
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        if not HAS_SDPA:
            self.register_buffer("mask", torch.tril(torch.ones(MAX_T, MAX_T, dtype=torch.bool))
                                 .view(1, 1, MAX_T, MAX_T), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(D, dim=2)
        q = q.view(B, T, NH, C // NH).transpose(1, 2)
        k = k.view(B, T, NH, C // NH).transpose(1, 2)
        v = v.view(B, T, NH, C // NH).transpose(1, 2)
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(D, 4 * D)
        self.c_proj = nn.Linear(4 * D, D)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D)
        self.attn = Attention()
        self.ln_2 = nn.LayerNorm(D)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB_PADDED, D)
        self.wpe = nn.Embedding(MAX_T, D)
        self.h = nn.ModuleList([Block() for _ in range(L)])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB_PADDED, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * L))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def cpu_capability():
    fn = getattr(torch._C, "_get_cpu_capability", None)
    return fn() if fn else "?"


def blas_hint():
    # Which libblas/libopenblas the process mapped (Debian's torch links the generic libblas.so.3).
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({ln.split()[-1] for ln in f if "blas" in ln.split()[-1]})
        return ",".join(libs) or "?"
    except OSError:
        return "?"


def make_optimizer(model, fused=False):
    """AdamW over the model's parameters: fused (one kernel per tensor, no temporaries; PyTorch >= 2.4 on the
    CPU) when asked, else multi-tensor (foreach), else the plain loop."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    if fused:
        return torch.optim.AdamW(groups, fused=True, **kwargs), "fused"
    try:  # multi-tensor AdamW (PyTorch >= 1.12); fall back to the plain loop
        return torch.optim.AdamW(groups, foreach=True, **kwargs), "foreach"
    except TypeError:
        return torch.optim.AdamW(groups, **kwargs), "loop"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0))
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--mode", choices=["eager", "compile", "bf16-autocast"], default="eager")
    args = ap.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = GPT()
    model.train()
    opt, opt_kind = make_optimizer(model)
    forward = model
    if args.mode == "compile":
        if not hasattr(torch, "compile"):
            print(f"error: torch {torch.__version__} has no torch.compile (PyTorch >= 2.0 needed)", flush=True)
            return 2
        forward = torch.compile(model)
    autocast_bf16 = args.mode == "bf16-autocast"
    n_params = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__} threads {torch.get_num_threads()} sdpa {HAS_SDPA} adamw {opt_kind} "
          f"params {n_params} B {args.batch} T {args.seq} mode {args.mode} "
          f"cpu_capability {cpu_capability()} blas {blas_hint()}", flush=True)

    g = torch.Generator().manual_seed(args.seed + 1)
    for step in range(1, args.steps + 1):
        data = torch.randint(0, VOCAB, (args.batch, args.seq + 1), generator=g)
        x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_bf16):
            loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        dt = time.perf_counter() - t0
        print(f"step {step}: loss {lv:.4f} time_ms {dt * 1000:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
