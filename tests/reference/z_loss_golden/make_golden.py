#!/usr/bin/env python3
"""Golden values of the fused unembedding + cross-entropy with PaLM's z-loss (MaxText's z_loss_multiplier), from
PyTorch: F.cross_entropy and torch.logsumexp on float64 logits, gradients by autograd.

    loss_sum   = sum over counted tokens of cross_entropy(h @ W[:, :vocab_valid], target)
    z_loss_sum = sum over counted tokens of z_loss_multiplier * logsumexp(h @ W[:, :vocab_valid])^2
    dh, dW     = d(loss_sum + z_loss_sum) / dh, dW  (dW's padding columns >= vocab_valid: 0)

Inputs are drawn in float64 from a seeded generator and rounded to float32 (so the engine's float32 kernel
sees exactly these values); everything after runs in float64. W is stored as [D, V] (the untied kernel_DV
layout); the tied layout's table is its transpose. Masked tokens have target -1: the kernel must not read it.

Writes golden.json beside this script (or --out PATH); --check compares a fresh run with the committed file.
Run with Debian's torch: /usr/bin/python3 tests/reference/z_loss_golden/make_golden.py
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
N, D, V, VOCAB_VALID = 11, 8, 20, 17  # 3 padding columns
Z_LOSS_MULTIPLIER = 0.1  # large, so the z-loss moves the gradients visibly (MaxText's default is 0, PaLM 1e-4)
MASKED = (2, 7)  # tokens that do not count


def golden():
    generator = torch.Generator().manual_seed(41)
    # Logits of a few units (h in [-2, 2), W in [-1, 1)): logsumexp well away from 0.
    h = ((torch.rand(N, D, generator=generator, dtype=torch.float64) * 4 - 2).float().double())
    w = ((torch.rand(D, V, generator=generator, dtype=torch.float64) * 2 - 1).float().double())
    targets = torch.randint(0, VOCAB_VALID, (N,), generator=generator)
    mask = torch.ones(N, dtype=torch.float64)
    for token in MASKED:
        mask[token] = 0.0
        targets[token] = -1
    h.requires_grad_(True)
    w.requires_grad_(True)
    logits = h @ w[:, :VOCAB_VALID]
    counted_targets = torch.where(mask > 0, targets, torch.zeros_like(targets))
    cross_entropy = torch.nn.functional.cross_entropy(logits, counted_targets, reduction="none")
    log_sum_exp = torch.logsumexp(logits, dim=1)
    loss_sum = (cross_entropy * mask).sum()
    z_loss_sum = (Z_LOSS_MULTIPLIER * log_sum_exp.square() * mask).sum()
    (loss_sum + z_loss_sum).backward()
    flat = lambda tensor: [float(x) for x in tensor.detach().reshape(-1)]
    return {
        "producer": "torch " + torch.__version__,
        "N": N, "D": D, "V": V, "vocab_valid": VOCAB_VALID, "z_loss_multiplier": Z_LOSS_MULTIPLIER,
        "h": flat(h), "w_DV": flat(w), "targets": [int(t) for t in targets], "mask": [int(m) for m in mask],
        "loss_sum": float(loss_sum), "z_loss_sum": float(z_loss_sum),
        "dh": flat(h.grad), "dw_DV": flat(w.grad),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(HERE, "golden.json"))
    parser.add_argument("--check", action="store_true", help="compare with the committed golden.json")
    args = parser.parse_args()
    text = json.dumps(golden(), indent=None, separators=(",", ":")) + "\n"
    if args.check:
        same = open(os.path.join(HERE, "golden.json")).read() == text
        print("golden.json: the same" if same else "golden.json: DIFFERS from a fresh run")
        sys.exit(0 if same else 1)
    with open(args.out, "w") as out:
        out.write(text)


if __name__ == "__main__":
    main()
