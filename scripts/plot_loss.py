#!/usr/bin/env python3
"""Plots a run's loss curve from its metrics.jsonl (train loss per step, eval loss where logged).

Usage: python3 scripts/plot_loss.py RUN_DIR OUT.png [--unigram NATS]
Needs matplotlib (python3 -m pip install matplotlib).
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("out")
    parser.add_argument("--unigram", type=float, help="unigram cross-entropy of the validation split (nats)")
    args = parser.parse_args()
    steps, losses, eval_steps, eval_losses = [], [], [], []
    with open(f"{args.run_dir}/metrics.jsonl") as lines:
        for line in lines:
            record = json.loads(line)
            if record.get("loss") is not None:
                steps.append(record["step"])
                losses.append(record["loss"])
            if "eval" in record and record["eval"].get("loss") is not None:
                eval_steps.append(record["step"])
                eval_losses.append(record["eval"]["loss"])
    figure, axes = plt.subplots(figsize=(7, 4), dpi=110)
    axes.plot(steps, losses, label="train loss", linewidth=1)
    if eval_steps:
        axes.plot(eval_steps, eval_losses, "o-", label="validation loss")
    if args.unigram:
        axes.axhline(args.unigram, color="gray", linestyle=":", label=f"unigram {args.unigram:.2f}")
        axes.axhline(0.7 * args.unigram, color="red", linestyle="--", label=f"0.7 x unigram {0.7 * args.unigram:.2f}")
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy (nats/token)")
    axes.set_title(f"meshtrain: {args.run_dir}")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(args.out)


if __name__ == "__main__":
    main()
