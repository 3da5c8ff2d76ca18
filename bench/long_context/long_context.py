#!/usr/bin/env python3
"""Helpers for run.sh (the long-context benchmark): the model's shapes, its FLOPs, memory checks, the table.

  long_context.py shapes  --repo R --model M                       the preset's shapes, one line
  long_context.py memory  --repo R --model M --seq S --dtype D     PyTorch's estimated peak resident GiB
  long_context.py table   --results FILE --out DIR --repo R --model M
        Prints median tokens/s (min..max), the ratio meshtrain / PyTorch per sequence length and dtype,
        GFLOP/s and MFU against the GEMM peaks meshtrain measured in that run (DIR/<peer>_S<S>/machine.json),
        and peak RSS.

The shapes come from the same files meshtrain reads (configs/base.yaml, then configs/models/<M>.yaml: their
top-level `key: value` lines), so PyTorch builds what meshtrain trains. The run itself goes through
bench/peers/peers.py (`run`: quiet wait, retries, per-step times, peak RSS); the medians are its `summarize`.
Standard library only; runs under any python3.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
import peers  # noqa: E402  (bench/peers/peers.py)

# meshtrain pads the vocabulary to a multiple of 128 (model/spec.cpp, padded_vocab_size at tensor degree 1).
VOCAB_MULTIPLE = 128
# What run.sh runs per dtype: meshtrain's peer name and PyTorch's (peers.py's names for the same modes).
PEERS_BY_DTYPE = {"bfloat16": ("meshtrain-bf16", "torch2-bf16"), "float32": ("meshtrain", "torch2-eager")}


def parse_scalar(text):
    text = text.split("#", 1)[0].strip()
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip('"')


def load_preset(repo, model):
    """base.yaml's top-level scalars overridden by configs/models/<model>.yaml's, as meshtrain layers them."""
    config = {}
    for path in (os.path.join(repo, "configs", "base.yaml"), os.path.join(repo, "configs", "models", model + ".yaml")):
        with open(path) as f:
            for line in f:
                if not line[:1].isalpha() or ":" not in line:
                    continue  # comments, nested mappings, list items
                key, value = line.split(":", 1)
                if value.split("#", 1)[0].strip():
                    config[key.strip()] = parse_scalar(value)
    config["vocab_padded"] = -(-config["vocab_size"] // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    if not config.get("head_dim"):
        config["head_dim"] = config["base_emb_dim"] // config["base_num_query_heads"]
    dense_qwen3 = (config.get("decoder_block") == "qwen3" and config.get("attention_type", "global") == "global"
                   and not config.get("num_experts"))
    if not dense_qwen3:
        raise ValueError(f"{model}: this benchmark builds dense Qwen3 models only (decoder_block=qwen3, "
                         f"attention_type=global, num_experts=0)")
    return config


def describe(c):
    return (f"{c['base_num_decoder_layers']} layers, width {c['base_emb_dim']}, {c['base_num_query_heads']} heads / "
            f"{c['base_num_kv_heads']} kv heads of {c['head_dim']}, SwiGLU {c['base_mlp_dim']}, vocab "
            f"{c['vocab_size']} (padded {c['vocab_padded']}), RoPE theta {c['rope_max_timescale']:g}, RMSNorm eps "
            f"{c['normalization_layer_epsilon']:g}, q/k norm, tied embedding {c['logits_via_embedding']}")


def dims(c):
    """D width, F SwiGLU width, H heads, K kv heads, d head width, L layers."""
    return (c["base_emb_dim"], c["base_mlp_dim"], c["base_num_query_heads"], c["base_num_kv_heads"], c["head_dim"],
            c["base_num_decoder_layers"])


def step_flops(c, batch, seq):
    """Training FLOPs of one step, MaxText's standard count as meshtrain's `standard_training_flops` makes it
    (model/spec.cpp): 3 x (the weight matmuls with the unembedding over the real vocab) + 3 x causal attention
    (half of 4 B S^2 H d per layer)."""
    B, S = batch, seq
    D, F, H, K, d, L = dims(c)
    ffn = 3 * 2 * B * S * D * F  # SwiGLU: gate, up and down
    qkv = 2 * B * S * D * (H + 2 * K) * d
    projection = 2 * B * S * D * H * d
    attention = 4 * B * S * S * H * d / 2
    unembedding = 2 * B * S * D * c["vocab_size"]
    return 3 * (L * (ffn + qkv + projection) + unembedding) + 3 * L * attention


def parameter_count(c):
    D, F, H, K, d, L = dims(c)
    layer = D * (H + 2 * K) * d + H * d * D + 3 * D * F + 2 * D + 2 * d  # projections, MLP, two norms, q/k norms
    embeddings = c["vocab_padded"] * D * (1 if c["logits_via_embedding"] else 2)
    return L * layer + embeddings + D  # + the final norm


# Resident set of the Python process once torch and transformers are imported (PyTorch 2.15, transformers 5.25).
TORCH_PROCESS_GIB = 0.7


def torch_memory_gib(c, seq, dtype, checkpoint_layers=False):
    """A rough peak resident set of torch_qwen3.py at batch 1 (GiB), to refuse a run that cannot fit before it
    starts. Fixed: the process, float32 weights, gradients and both AdamW moments (16 bytes a parameter; the
    fused AdamW has no temporaries) and, in bf16, autocast's copies of the weights (2). Per token: the logits in the compute dtype, their float32 copy and its gradient;
    per token and layer what Hugging Face's Qwen3 layer keeps for backward: in the compute dtype both norms'
    outputs (the matmul inputs), q, k, v, the attention output, gate, up, SiLU(gate) and the product; in
    float32 the residual stream entering both norms, and q and k after their norms (RoPE's inputs). With
    checkpointed layers: each layer's input (float32) kept, and one layer's activations while it is recomputed."""
    D, F, H, K, d, L = dims(c)
    act = 2 if dtype == "bfloat16" else 4
    per_token_layer = act * (2 * D + (H + 2 * K) * d + H * d + 4 * F) + 4 * (2 * D + (H + K) * d)
    kept_per_token = L * 4 * D + per_token_layer if checkpoint_layers else L * per_token_layer
    logits_per_token = c["vocab_padded"] * ((act if dtype == "bfloat16" else 0) + 4 + 4)  # float32: no copy
    fixed = parameter_count(c) * (16 + (2 if dtype == "bfloat16" else 0))
    return TORCH_PROCESS_GIB + (fixed + seq * (kept_per_token + logits_per_token)) / 2**30


def machine_peaks(path):
    """(float32 peak, bf16 peak or 0, source) in GFLOP/s from a meshtrain run's machine.json, or None."""
    try:
        with open(path) as f:
            m = json.load(f)
    except (OSError, ValueError):
        return None
    return m.get("gemm_peak_flops", 0) / 1e9, m.get("gemm_bf16_peak_flops", 0) / 1e9, m.get("gemm_peak_source", "")


def meshtrain_flops_per_step(metrics_path):
    """meshtrain's own count: tflops_per_device x step_time_s of its first logged step, or None."""
    try:
        with open(metrics_path) as f:
            for line in f:
                r = json.loads(line)
                if "tflops_per_device" in r and "step_time_s" in r:
                    return r["tflops_per_device"] * 1e12 * r["step_time_s"]
    except (OSError, ValueError):
        pass
    return None


def cmd_shapes(args):
    c = load_preset(args.repo, args.model)
    print(f"{args.model}: {describe(c)}; {parameter_count(c):,} parameters")
    return 0


def cmd_memory(args):
    print(f"{torch_memory_gib(load_preset(args.repo, args.model), args.seq, args.dtype, args.checkpoint_layers):.1f}")
    return 0


def cmd_table(args):
    c = load_preset(args.repo, args.model)
    recs = []
    with open(args.results) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    print(f"model {args.model}: {describe(c)}")
    print("FLOPs per step (MaxText's standard count, causal attention): " + ", ".join(
        f"1x{s}: {step_flops(c, 1, s) / 1e12:.3f} TFLOP" for s in sorted({r['seq'] for r in recs})))
    print("MFU = those FLOPs / median step time / the GEMM peak meshtrain measured at start-up in the same row's")
    print("run (bf16 rows: its bf16 GEMM peak; PyTorch rows: the peak of the meshtrain run of the same S and dtype).")
    print(f"* = other processes used > {peers.DISTURBED_PCT:.0f}% of the CPUs during that run (figures disturbed).")
    print()
    hdr = (f"{'system':<15} {'dtype':<8} {'S':>5} {'status':<8} {'n':>2} {'tokens/s':>9} {'min..max':>15} "
           f"{'x PyTorch':>9} {'GFLOP/s':>8} {'MFU':>6} {'of peak':>8} {'RSS GiB':>7} {'others':>7} "
           f"{'loss first->last':>18}")
    print(hdr)
    print("-" * len(hdr))
    peaks_seen = []
    for dtype in args.dtypes.split():
        mesh_peer, torch_peer = PEERS_BY_DTYPE[dtype]
        for seq in sorted({r["seq"] for r in recs}):
            rows = {r["peer"]: r for r in recs if r["seq"] == seq and r["peer"] in (mesh_peer, torch_peer)}
            if not rows:
                continue
            run_dir = os.path.join(args.out, f"{mesh_peer}_S{seq}")
            peaks = machine_peaks(os.path.join(run_dir, "machine.json"))
            peak = None
            if peaks:
                peak = peaks[1] if dtype == "bfloat16" else peaks[0]
                peaks_seen.append(f"{mesh_peer} S={seq}: float32 {peaks[0]:.0f}"
                                  + (f", bf16 {peaks[1]:.0f}" if peaks[1] else "") + f" GFLOP/s ({peaks[2]})")
                counted = meshtrain_flops_per_step(os.path.join(run_dir, "metrics.jsonl"))
                if counted and abs(counted / step_flops(c, 1, seq) - 1) > 1e-3:
                    print(f"WARNING: meshtrain counts {counted / 1e12:.3f} TFLOP a step at S={seq}, this table "
                          f"{step_flops(c, 1, seq) / 1e12:.3f}: the FLOP formulas disagree")
            summaries = {p: peers.summarize(r, peak or 1.0, lambda b, t: step_flops(c, b, t))
                         for p, r in rows.items() if r.get("steps")}
            theirs = summaries.get(torch_peer)
            for peer in (mesh_peer, torch_peer):
                r = rows.get(peer)
                if r is None:
                    continue
                s = summaries.get(peer)
                name = "meshtrain" if peer == mesh_peer else "PyTorch"
                oth = r.get("others_pct")
                oth_s = "" if oth is None else f"{oth:.0f}%" + ("*" if oth > peers.DISTURBED_PCT else " ")
                rss = r.get("peak_rss_gib")
                rss_s = "-" if rss is None else f"{rss:.2f}"
                if s is None:
                    print(f"{name:<15} {dtype:<8} {seq:>5} {r['status'][:8]:<8} {'-':>2} {'-':>9} {'-':>15} "
                          f"{'-':>9} {'-':>8} {'-':>6} {'-':>8} {rss_s:>7} {oth_s:>7}  {r.get('note', '')}")
                    continue
                ratio = f"{s['tps'] / theirs['tps']:.2f}x" if peer == mesh_peer and theirs else ""
                mfu = f"{s['mfu'] * 100:5.1f}%" if peak else "-"
                peak_s = f"{peak:.0f}" if peak else "-"
                print(f"{name:<15} {dtype:<8} {seq:>5} {r['status'][:8]:<8} {s['n']:>2} {s['tps']:>9.1f} "
                      f"{s['lo']:>7.1f}..{s['hi']:<7.1f} {ratio:>9} {s['gflops']:>8.1f} {mfu:>6} {peak_s:>8} "
                      f"{rss_s:>7} {oth_s:>7} {s['loss0']:>8.3f}->{s['lossN']:<8.3f}")
    print()
    print("GEMM peaks meshtrain measured in this run (2 threads, n = 1024):")
    for line in peaks_seen or ["(none: no meshtrain run wrote machine.json)"]:
        print("  " + line)
    return 0


def main():
    ap = argparse.ArgumentParser(description="run.sh helpers (bench/long_context)")
    sub = ap.add_subparsers(dest="sub", required=True)
    for name in ("shapes", "memory", "table"):
        p = sub.add_parser(name)
        p.add_argument("--repo", required=True)
        p.add_argument("--model", required=True)
        if name == "memory":
            p.add_argument("--seq", type=int, required=True)
            p.add_argument("--dtype", choices=sorted(PEERS_BY_DTYPE), required=True)
            p.add_argument("--checkpoint-layers", action="store_true")
        if name == "table":
            p.add_argument("--results", required=True)
            p.add_argument("--out", required=True)
            p.add_argument("--dtypes", default="bfloat16 float32")
    args = ap.parse_args()
    try:
        return {"shapes": cmd_shapes, "memory": cmd_memory, "table": cmd_table}[args.sub](args)
    except Exception as e:  # the benchmark never fails a caller
        print(f"long_context.py {args.sub}: error: {e}", file=sys.stderr)
        return 1 if args.sub != "table" else 0


if __name__ == "__main__":
    sys.exit(main())
