#!/usr/bin/env python3
"""PyTorch peer of the long-context benchmark: a meshtrain Qwen3 preset trained at batch 1 x S with Hugging Face
transformers' Qwen3ForCausalLM (attn_implementation="sdpa"), built from a Qwen3Config holding the preset's
shapes exactly (configs/base.yaml + configs/models/<model>.yaml, read by long_context.py): layers, width,
heads, kv heads, head width, SwiGLU width, q/k RMSNorm, RMSNorm eps, RoPE theta, tied embedding, and the
vocabulary padded to a multiple of 128 as meshtrain pads it (tokens drawn from the real vocabulary).

Random init (transformers', normal 0.02), float32 weights, AdamW (lr 3e-4, betas 0.9 / 0.95, weight decay 0.1 on
2-D weights, as bench/peers/torch_gpt2.py), gradient clipping at 1.0. --dtype bfloat16: forward and loss under
torch.autocast("cpu", dtype=torch.bfloat16) (bf16 matmuls and attention, float32 master weights and optimizer).
Attention is torch.nn.functional.scaled_dot_product_attention as transformers calls it: is_causal=True with no
mask, and GQA through enable_gqa=True (transformers' choice on PyTorch >= 2.5 when there is no mask). The first
step (untimed) runs under the profiler; the script prints how SDPA was called and which ATen attention kernel
ran, and exits 3 when it was not a causal call without a mask.

Timed per step: zero_grad + forward + loss + backward + clip + optimizer step (perf_counter); the batch, uniform
tokens, is drawn outside. Prints one line per step (bench/peers/peers.py reads it): step N: loss X time_ms Y
Usage: torch_qwen3.py --repo R --model M --seq S --steps N [--threads K] [--dtype bfloat16|float32] [--seed S]
"""
import argparse
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "peers"))
from long_context import describe, load_preset  # noqa: E402
from torch_gpt2 import cpu_capability, make_optimizer  # noqa: E402


def build_model(c, seq):
    try:
        from transformers import Qwen3Config, Qwen3ForCausalLM
    except ImportError:
        print("error: transformers is not installed in this Python: VENV/bin/pip install transformers", flush=True)
        sys.exit(2)
    config = Qwen3Config(
        vocab_size=c["vocab_padded"], hidden_size=c["base_emb_dim"], intermediate_size=c["base_mlp_dim"],
        num_hidden_layers=c["base_num_decoder_layers"], num_attention_heads=c["base_num_query_heads"],
        num_key_value_heads=c["base_num_kv_heads"], head_dim=c["head_dim"], hidden_act="silu",
        rms_norm_eps=c["normalization_layer_epsilon"],
        rope_parameters={"rope_type": "default", "rope_theta": c["rope_max_timescale"]},
        tie_word_embeddings=c["logits_via_embedding"], max_position_embeddings=max(seq, 4096),
        attention_bias=False, attention_dropout=0.0, use_sliding_window=False, use_cache=False)
    config._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(config)
    # The config's RoPE is what the preset says: inverse frequencies theta^(-2i/d).
    d = c["head_dim"]
    expected = 1.0 / (c["rope_max_timescale"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    inv_freq = model.model.rotary_emb.inv_freq.double()
    if inv_freq.shape != expected.shape or not torch.allclose(inv_freq, expected, rtol=1e-5):
        print(f"error: transformers built RoPE frequencies {inv_freq[:3].tolist()}..., expected theta "
              f"{c['rope_max_timescale']:g}", flush=True)
        sys.exit(2)
    return model


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of h @ W^T over targets, in chunks of tokens, with the gradients of h and W computed
    in the forward (the fused loss of Liger's FusedLinearCrossEntropy, and of meshtrain): the [S, V] logits
    never exist whole. The same FLOPs as the plain loss (2 N D V forward, 4 N D V for the gradients) and the
    same precisions as autocast gives it: bf16 products (float32 accumulation), the softmax in float32."""

    @staticmethod
    def forward(ctx, h, w, targets, chunk, compute_dtype):
        n = h.shape[0]
        hc, wc = h.to(compute_dtype), w.to(compute_dtype)
        grad_h = torch.empty_like(h, dtype=torch.float32)
        grad_w = torch.zeros_like(w, dtype=torch.float32)
        total = torch.zeros((), dtype=torch.float32)
        for start in range(0, n, chunk):
            end = min(n, start + chunk)
            logits = (hc[start:end] @ wc.t()).float()  # [c, V]
            lse = torch.logsumexp(logits, dim=-1)
            t = targets[start:end]
            total += (lse - logits.gather(1, t[:, None]).squeeze(1)).sum()
            grad_logits = torch.softmax(logits, dim=-1)
            grad_logits[torch.arange(end - start), t] -= 1.0
            grad_logits = (grad_logits / n).to(compute_dtype)
            grad_h[start:end] = (grad_logits @ wc).float()
            grad_w += (grad_logits.t() @ hc[start:end]).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = (h.dtype, w.dtype)
        return total / n

    @staticmethod
    def backward(ctx, grad_output):
        grad_h, grad_w = ctx.saved_tensors
        return ((grad_h * grad_output).to(ctx.dtypes[0]), (grad_w * grad_output).to(ctx.dtypes[1]), None, None,
                None)


class SdpaSpy:
    """Wraps F.scaled_dot_product_attention (transformers calls it through torch.nn.functional) to record how
    the first call was made: shapes, dtypes in and out (autocast casts below this function), the flags."""

    def __init__(self):
        self.real = F.scaled_dot_product_attention
        self.first = None
        self.calls = 0

    def __call__(self, *args, **kwargs):
        out = self.real(*args, **kwargs)
        self.calls += 1
        if self.first is None:
            q, k, v = args[:3]
            self.first = (f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)}, v {tuple(v.shape)} {v.dtype} -> "
                          f"{out.dtype}; is_causal={kwargs.get('is_causal')} attn_mask="
                          f"{'None' if kwargs.get('attn_mask') is None else 'given'} "
                          f"enable_gqa={kwargs.get('enable_gqa', False)}")
            self.causal_unmasked = kwargs.get("is_causal") is True and kwargs.get("attn_mask") is None
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True, help="the meshtrain checkout whose configs/ hold the preset")
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0))
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--loss-chunk", type=int, default=0,
                    help="tokens per chunk of a fused linear + cross-entropy (ChunkedLinearCrossEntropy) instead "
                         "of transformers' logits and F.cross_entropy; 0: the plain loss")
    ap.add_argument("--checkpoint-layers", action="store_true",
                    help="recompute each decoder layer's forward in the backward (transformers' gradient "
                         "checkpointing, torch.utils.checkpoint without reentrancy): only the layers' inputs are "
                         "kept, as meshtrain's remat_policy=full keeps only the residual stream")
    args = ap.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    c = load_preset(args.repo, args.model)
    model = build_model(c, args.seq)
    model.train()
    if args.checkpoint_layers:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # Fused AdamW: the foreach one's temporaries (about 4 bytes a parameter) took PyTorch past this machine's
    # memory at S = 2048 (bench/long_context/README.md, Memory).
    opt, opt_kind = make_optimizer(model, fused=True)
    spy = SdpaSpy()
    F.scaled_dot_product_attention = spy
    bf16 = args.dtype == "bfloat16"
    n_params = sum(p.numel() for p in model.parameters())
    import transformers
    print(f"torch {torch.__version__} transformers {transformers.__version__} threads {torch.get_num_threads()} "
          f"adamw {opt_kind} params {n_params} B 1 T {args.seq} dtype {args.dtype} "
          f"checkpointed layers {model.is_gradient_checkpointing} cpu_capability "
          f"{cpu_capability()} mkldnn_bf16 {torch.ops.mkldnn._is_mkldnn_bf16_supported()}", flush=True)
    print(f"model {args.model}: {describe(c)}", flush=True)

    g = torch.Generator().manual_seed(args.seed + 1)
    vocab = c["vocab_padded"]
    for step in range(1, args.steps + 1):
        data = torch.randint(0, c["vocab_size"], (1, args.seq + 1), generator=g)
        x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        # The warm-up step (never timed by the reader) runs under the profiler to name the attention kernels.
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if step == 1 else None
        if profiler:
            profiler.__enter__()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if args.loss_chunk > 0:
                hidden = model.model(input_ids=x, use_cache=False).last_hidden_state  # [1, S, D]
                loss = ChunkedLinearCrossEntropy.apply(
                    hidden.view(-1, hidden.shape[-1]), model.lm_head.weight, y.view(-1), args.loss_chunk,
                    torch.bfloat16 if bf16 else torch.float32)
            else:
                logits = model(input_ids=x, use_cache=False).logits  # [1, S, V padded]
                # float32 loss over the logits, as transformers' own ForCausalLMLoss upcasts them
                loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        dt = time.perf_counter() - t0
        if profiler:
            profiler.__exit__(None, None, None)
            kernels = sorted({e.key for e in profiler.key_averages()
                              if "attention" in e.key and e.key.startswith("aten::")})
            print(f"sdpa: {spy.calls} calls a step; first: {spy.first}", flush=True)
            print(f"sdpa kernels (aten): {', '.join(kernels) or '(none seen)'}", flush=True)
            if not spy.first or not spy.causal_unmasked:
                print("error: attention did not run as scaled_dot_product_attention(is_causal=True) without a mask",
                      flush=True)
                return 3
        print(f"step {step}: loss {lv:.4f} time_ms {dt * 1000:.1f}", flush=True)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
