#!/usr/bin/python3
"""Independent checks of make_golden.py's mixture-of-experts fixtures (run after it; writes nothing).

1. Central finite differences of the float64 mean loss, from the stored F32 weights, for 3 random entries of
   every weight tensor, against the stored gradients (which are F32-rounded float64 autograd values).
2. The fixture exercises what it claims: the number of (token, layer) routing decisions that change when the
   selection bias is ignored, when the group limit is lifted (DeepSeek-V3), and the stored bias is nonzero.
3. Sensitivity: typical bugs each change the logits far above float32 tolerance (DeepSeek-V3: interleaved
   RoPE read as rotate-half, routed_scaling_factor ignored, the first layer MoE instead of dense, the shared
   expert dropped, the selection bias added to the weights; Qwen3-MoE: weights not renormalised).

Run:  cd tests/reference/deepseek_golden && /usr/bin/python3 selfcheck.py
"""

import importlib.util
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("moe_make_golden", os.path.join(HERE, "make_golden.py"))
mg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mg)
torch.set_default_dtype(torch.float64)


def load(variant):
    _, model = mg.qwen3.read_safetensors(os.path.join(HERE, variant, "model.safetensors"))
    _, golden = mg.qwen3.read_safetensors(os.path.join(HERE, variant, "golden.safetensors"))
    return {k: v.to(torch.float64) for k, v in model.items()}, golden


def mean_loss(forward, params, cfg, inputs, targets):
    logits = forward(params, inputs, cfg, mg.RoutingMargins())
    return F.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), targets.reshape(-1)).item()


def finite_differences(name, cfg, forward, params, golden):
    inputs, targets = golden["inputs"].long(), golden["targets"].long()
    g = torch.Generator().manual_seed(7)
    worst = 0.0
    for tensor_name, t in params.items():
        if tensor_name.endswith(mg.BIAS):
            continue
        grad = golden["grad." + tensor_name].to(torch.float64).reshape(-1)
        for _ in range(3):
            i = torch.randint(0, t.numel(), (1,), generator=g).item()
            h = 1e-5
            plus = {k: v.clone() for k, v in params.items()}
            minus = {k: v.clone() for k, v in params.items()}
            plus[tensor_name].view(-1)[i] += h
            minus[tensor_name].view(-1)[i] -= h
            fd = (mean_loss(forward, plus, cfg, inputs, targets) - mean_loss(forward, minus, cfg, inputs, targets)) / (
                2 * h)
            worst = max(worst, abs(fd - grad[i].item()))
    print("%-11s finite differences vs stored grads: max |diff| %.2e" % (name, worst))
    assert worst < 1e-7, worst


def chosen(cfg, forward, params, inputs):
    """Every MoE layer's chosen expert sets, by recording topk indices through RoutingMargins.count."""
    record = []

    class Recorder(mg.RoutingMargins):
        def count(self, topk_indices, num_experts):
            record.append(topk_indices.sort(dim=-1)[0].clone())

    forward(params, inputs, cfg, Recorder())
    return torch.stack(record)  # [layers, N, k]


def changed_decisions(a, b):
    return int((a != b).any(dim=-1).sum().item())


def logits_change(forward, params, cfg, inputs, reference):
    return (forward(params, inputs, cfg, mg.RoutingMargins()) - reference).abs().max().item()


def main():
    # DeepSeek-V3
    cfg = mg.DEEPSEEK_CONFIG
    params, golden = load("deepseek_v3")
    inputs = golden["inputs"].long()
    finite_differences("deepseek_v3", cfg, mg.deepseek_forward, params, golden)
    base = chosen(cfg, mg.deepseek_forward, params, inputs)
    no_bias = {k: (torch.zeros_like(v) if k.endswith(mg.BIAS) else v) for k, v in params.items()}
    ungrouped = dict(cfg, n_group=1, topk_group=1)
    print("deepseek_v3 routing decisions (of %d) changed by ignoring the bias: %d; by lifting the group limit: %d;"
          " |bias| max %.3f" % (base.shape[0] * base.shape[1], changed_decisions(base, chosen(
              cfg, mg.deepseek_forward, no_bias, inputs)), changed_decisions(base, chosen(
                  ungrouped, mg.deepseek_forward, params, inputs)),
                                 max(v.abs().max().item() for k, v in params.items() if k.endswith(mg.BIAS))))
    reference = mg.deepseek_forward(params, inputs, cfg, mg.RoutingMargins())
    mutations = {}
    original_rope = mg.apply_rotary_pos_emb_interleave
    mg.apply_rotary_pos_emb_interleave = lambda q, k, cos, sin: mg.qwen3.apply_rotary_pos_emb(q, k, cos, sin)
    mutations["rope rotate-half on the file's columns"] = logits_change(mg.deepseek_forward, params, cfg, inputs,
                                                                        reference)
    mg.apply_rotary_pos_emb_interleave = original_rope
    mutations["routed_scaling_factor ignored"] = logits_change(mg.deepseek_forward, params,
                                                               dict(cfg, routed_scaling_factor=1.0), inputs,
                                                               reference)
    mutations["first layer MoE"] = logits_change(
        mg.deepseek_forward, dict(params, **{k.replace("layers.1.", "layers.0."): v
                                             for k, v in params.items() if k.startswith("model.layers.1.mlp.")}),
        dict(cfg, first_k_dense_replace=0), inputs, reference)
    no_shared = {k: (torch.zeros_like(v) if "shared_experts.down_proj" in k else v) for k, v in params.items()}
    mutations["shared expert dropped"] = logits_change(mg.deepseek_forward, no_shared, cfg, inputs, reference)
    original_router = mg.deepseek_router

    def bias_in_weights(x, p, pre, c, margins):
        indices, weights = original_router(x, p, pre, c, margins)
        return indices, weights + p[pre + mg.BIAS][indices] * c["routed_scaling_factor"]

    mg.deepseek_router = bias_in_weights
    mutations["selection bias added to the weights"] = logits_change(mg.deepseek_forward, params, cfg, inputs,
                                                                     reference)
    mg.deepseek_router = original_router
    for what, change in mutations.items():
        print("deepseek_v3 mutation %-40s max |dlogits| %.3g" % (what, change))
        assert change > 1e-3, what

    # Qwen3-MoE
    cfg = mg.QWEN3_MOE_CONFIG
    params, golden = load("qwen3_moe")
    inputs = golden["inputs"].long()
    finite_differences("qwen3_moe", cfg, mg.qwen3_moe_forward, params, golden)
    reference = mg.qwen3_moe_forward(params, inputs, cfg, mg.RoutingMargins())
    change = logits_change(mg.qwen3_moe_forward, params, dict(cfg, norm_topk_prob=False), inputs, reference)
    print("qwen3_moe   mutation %-40s max |dlogits| %.3g" % ("weights not renormalised", change))
    assert change > 1e-3
    print("OK")


if __name__ == "__main__":
    main()
