#!/usr/bin/python3
"""Golden fixture generator for meshtrain's mixture-of-experts models (DeepSeek-V3 and Qwen3-MoE).

A float64 plain-PyTorch re-expression of Hugging Face transformers' modeling code (it does not import
transformers):
  deepseek_v3/  DeepseekV3ForCausalLM (models/deepseek_v3/modeling_deepseek_v3.py): DeepseekV3Attention
                (q_a_proj -> q_a_layernorm -> q_b_proj; kv_a_proj_with_mqa -> [compressed kv | k_rot],
                kv_a_layernorm -> kv_b_proj -> [k_nope | v]; RoPE on the rotary parts with
                rope_interleave, i.e. apply_rotary_pos_emb_interleave; softmax scale qk_head_dim^-0.5),
                dense DeepseekV3MLP for the first first_k_dense_replace layers, then DeepseekV3MoE:
                DeepseekV3TopkRouter (sigmoid scores, e_score_correction_bias for the choice only,
                n_group groups scored by the sum of their top-2 choice scores, topk_group kept, the other
                groups' choice scores set to 0, top-k, weights = unbiased scores normalised (+1e-20) when
                norm_topk_prob, times routed_scaling_factor) + shared_experts (a DeepseekV3MLP of width
                moe_intermediate_size * n_shared_experts).
  qwen3_moe/    Qwen3MoeForCausalLM (models/qwen3_moe/modeling_qwen3_moe.py): Qwen3 attention (per-head
                q_norm / k_norm before rotate-half RoPE, GQA) and Qwen3MoeSparseMoeBlock (softmax over the
                experts, top-k, weights renormalised when norm_topk_prob), no shared experts; the causal-LM
                loss without the router auxiliary loss (output_router_logits false).
For each variant it writes config.json (HF style), model.safetensors (HF names, F32) and golden.safetensors
(inputs, targets, logits, loss, loss_sum, grad.<hf name> = d(mean loss)/dW for every weight but the
e_score_correction_bias, a buffer without gradient). Weights are drawn in float64, rounded to float32, and
the forward and backward run in float64 on the rounded values. Routing ties are impossible by construction:
every token's top-k margin (and group top-k margin) is checked > MIN_MARGIN in every MoE layer, and the seed
is advanced until it is, and until every routed expert of every MoE layer is chosen by at least one token
(so every expert's gradient is tested; the seeds used are in README.md).

Run:  cd tests/reference/deepseek_golden && /usr/bin/python3 make_golden.py [--check]
"""

import importlib.util
import json
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_qwen3_golden():
    # The Qwen3 fixture's generator: its rms_norm, rope_cos_sin, rotate_half, attention (Qwen3's, reused for
    # Qwen3-MoE) and hand-written safetensors writer and reader.
    path = os.path.join(HERE, "..", "qwen3_golden", "make_golden.py")
    spec = importlib.util.spec_from_file_location("qwen3_make_golden", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


qwen3 = _load_qwen3_golden()

qwen3.PRODUCER = PRODUCER = "meshtrain tests/reference/deepseek_golden/make_golden.py"
torch.set_default_dtype(torch.float64)

BATCH, SEQ = 2, 12
TOKEN_SEED = 515151
WEIGHT_STD = 0.1
MIN_MARGIN = 1e-4  # smallest allowed gap between the k-th and (k+1)-th choice score (and kept groups)

DEEPSEEK_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "v_head_dim": 8,
    "qk_nope_head_dim": 8,
    "head_dim": 8,  # HF: the rotary width (qk_rope_head_dim)
    "n_group": 4,
    "topk_group": 2,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "rope_interleave": True,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}

# The same model with queries projected directly (HF: q_lora_rank null -> q_proj; the engine's q_lora_rank 0).
DEEPSEEK_DIRECT_Q_CONFIG = dict(DEEPSEEK_CONFIG, q_lora_rank=None)

QWEN3_MOE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
    "hidden_act": "silu",
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}

# Qwen3-MoE with a dense first layer (mlp_only_layers [0]: the engine's first_num_dense_layers 1).
QWEN3_MOE_DENSE_FIRST_CONFIG = dict(QWEN3_MOE_CONFIG, num_hidden_layers=3, mlp_only_layers=[0])

BIAS = "mlp.gate.e_score_correction_bias"


class RoutingMargins:
    """Collects the smallest top-k / group top-k margin and the smallest kept choice score."""

    def __init__(self):
        self.expert = float("inf")
        self.group = float("inf")
        self.choice = float("inf")
        self.least_used = float("inf")  # the fewest assignments any expert of any MoE layer got

    def count(self, topk_indices, num_experts):
        self.least_used = min(self.least_used, torch.bincount(topk_indices.reshape(-1), minlength=num_experts).min().item())

    def top_margin(self, values, k):  # values [N, n]: gap between the k-th and (k+1)-th largest per row
        ordered = values.sort(dim=-1, descending=True)[0]
        return (ordered[:, k - 1] - ordered[:, k]).min().item() if values.shape[-1] > k else float("inf")


# ----------------------------------------------------------------------------------------------------------
# Shared pieces
# ----------------------------------------------------------------------------------------------------------

def swiglu_mlp(x, p, prefix):
    gate = F.linear(x, p[prefix + "gate_proj.weight"])
    up = F.linear(x, p[prefix + "up_proj.weight"])
    return F.linear(F.silu(gate) * up, p[prefix + "down_proj.weight"])


def experts_combine(x, p, prefix, num_experts, topk_indices, topk_weights):
    """sum over each token's chosen experts of weight * expert(x): HF's per-expert index_add loop, written
    densely (a token's weight for an expert it did not choose is exactly 0)."""
    combine = torch.zeros(x.shape[0], num_experts).scatter(1, topk_indices, topk_weights)  # [N, E]
    out = torch.zeros_like(x)
    for e in range(num_experts):
        out = out + combine[:, e:e + 1] * swiglu_mlp(x, p, prefix + "experts.%d." % e)
    return out


def causal_attention(q, k, v, scaling):  # [B, H, S, d] each (v may be narrower)
    s = q.shape[2]
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


# ----------------------------------------------------------------------------------------------------------
# DeepseekV3ForCausalLM
# ----------------------------------------------------------------------------------------------------------

def apply_rotary_pos_emb_interleave(q, k, cos, sin):
    # HF: de-interleave (pairs at 2i, 2i+1 -> i, i + d/2), then rotate-half RoPE.
    b, h, s, d = q.shape
    q = q.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    b, h, s, d = k.shape
    k = k.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    q_embed = (q * cos) + (qwen3.rotate_half(q) * sin)
    k_embed = (k * cos) + (qwen3.rotate_half(k) * sin)
    return q_embed, k_embed


def deepseek_attention(x, p, pre, cfg, cos, sin):
    b, s, _ = x.shape
    nh = cfg["num_attention_heads"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    r_kv = cfg["kv_lora_rank"]
    qk_head_dim = nope + rope
    # q_a_layernorm / kv_a_layernorm are DeepseekV3RMSNorm(rank) with the default eps 1e-6.
    if cfg["q_lora_rank"] is None:  # HF: q_proj straight from the hidden state
        q = F.linear(x, p[pre + "q_proj.weight"])
    else:
        q = F.linear(qwen3.rms_norm(F.linear(x, p[pre + "q_a_proj.weight"]), p[pre + "q_a_layernorm.weight"],
                                    1e-6), p[pre + "q_b_proj.weight"])
    q = q.view(b, s, nh, qk_head_dim).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [nope, rope], dim=-1)
    compressed = F.linear(x, p[pre + "kv_a_proj_with_mqa.weight"])
    k_pass, k_rot = torch.split(compressed, [r_kv, rope], dim=-1)
    k_pass = F.linear(qwen3.rms_norm(k_pass, p[pre + "kv_a_layernorm.weight"], 1e-6), p[pre + "kv_b_proj.weight"])
    k_pass = k_pass.view(b, s, nh, nope + vd).transpose(1, 2)
    k_pass, value = torch.split(k_pass, [nope, vd], dim=-1)
    k_rot = k_rot.view(b, 1, s, rope)
    q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
    k_rot = k_rot.expand(*k_pass.shape[:-1], -1)
    query = torch.cat((q_pass, q_rot), dim=-1)
    key = torch.cat((k_pass, k_rot), dim=-1)
    out = causal_attention(query, key, value, qk_head_dim ** -0.5)  # [B, H, S, vd]
    return F.linear(out.transpose(1, 2).reshape(b, s, nh * vd), p[pre + "o_proj.weight"])


def deepseek_router(x, p, pre, cfg, margins):
    """DeepseekV3TopkRouter: returns (topk_indices [N, k], topk_weights [N, k])."""
    E, G, Gk, k = cfg["n_routed_experts"], cfg["n_group"], cfg["topk_group"], cfg["num_experts_per_tok"]
    scores = F.linear(x, p[pre + "mlp.gate.weight"]).sigmoid()  # [N, E]
    with torch.no_grad():
        choice = scores + p[pre + BIAS].unsqueeze(0)
        group_scores = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)  # [N, G]
        group_idx = torch.topk(group_scores, k=Gk, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        masked = choice.masked_fill(~score_mask.bool(), 0.0)
        topk_indices = torch.topk(masked, k=k, dim=-1, sorted=False)[1]
        margins.count(topk_indices, E)
        margins.group = min(margins.group, margins.top_margin(group_scores, Gk))
        margins.expert = min(margins.expert, margins.top_margin(masked, k))
        margins.choice = min(margins.choice, choice.gather(1, topk_indices).min().item(),
                             masked.masked_fill(~score_mask.bool(), float("inf")).min().item())
    topk_weights = scores.gather(1, topk_indices)
    if cfg["norm_topk_prob"]:
        topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
    return topk_indices, topk_weights * cfg["routed_scaling_factor"]


def deepseek_moe(x, p, pre, cfg, margins):
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    topk_indices, topk_weights = deepseek_router(flat, p, pre, cfg, margins)
    routed = experts_combine(flat, p, pre + "mlp.", cfg["n_routed_experts"], topk_indices, topk_weights)
    return routed.view(*shape) + swiglu_mlp(x, p, pre + "mlp.shared_experts.")


def deepseek_forward(p, inputs, cfg, margins):
    cos, sin = qwen3.rope_cos_sin(inputs.shape[1], cfg["qk_rope_head_dim"], cfg["rope_theta"])
    eps = cfg["rms_norm_eps"]
    h = F.embedding(inputs, p["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        h = h + deepseek_attention(qwen3.rms_norm(h, p[pre + "input_layernorm.weight"], eps), p,
                                   pre + "self_attn.", cfg, cos, sin)
        x = qwen3.rms_norm(h, p[pre + "post_attention_layernorm.weight"], eps)
        if i >= cfg["first_k_dense_replace"]:
            h = h + deepseek_moe(x, p, pre, cfg, margins)
        else:
            h = h + swiglu_mlp(x, p, pre + "mlp.")
    h = qwen3.rms_norm(h, p["model.norm.weight"], eps)
    return F.linear(h, p["lm_head.weight"])


def deepseek_shapes(cfg):
    d, nh, v = cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    r_q, r_kv, E = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["n_routed_experts"]
    fe = cfg["moe_intermediate_size"]
    shapes = [("model.embed_tokens.weight", [v, d])]
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        if r_q is None:
            query = [(pre + "self_attn.q_proj.weight", [nh * (nope + rope), d])]
        else:
            query = [(pre + "self_attn.q_a_proj.weight", [r_q, d]),
                     (pre + "self_attn.q_a_layernorm.weight", [r_q]),
                     (pre + "self_attn.q_b_proj.weight", [nh * (nope + rope), r_q])]
        shapes += [(pre + "input_layernorm.weight", [d])] + query + [
            (pre + "self_attn.kv_a_proj_with_mqa.weight", [r_kv + rope, d]),
            (pre + "self_attn.kv_a_layernorm.weight", [r_kv]),
            (pre + "self_attn.kv_b_proj.weight", [nh * (nope + vd), r_kv]),
            (pre + "self_attn.o_proj.weight", [d, nh * vd]),
            (pre + "post_attention_layernorm.weight", [d]),
        ]
        if i >= cfg["first_k_dense_replace"]:
            shapes += [(pre + "mlp.gate.weight", [E, d]), (pre + BIAS, [E])]
            for e in range(E):
                shapes += swiglu_shapes(pre + "mlp.experts.%d." % e, d, fe)
            shapes += swiglu_shapes(pre + "mlp.shared_experts.", d, fe * cfg["n_shared_experts"])
        else:
            shapes += swiglu_shapes(pre + "mlp.", d, cfg["intermediate_size"])
    return shapes + [("model.norm.weight", [d]), ("lm_head.weight", [v, d])]


# ----------------------------------------------------------------------------------------------------------
# Qwen3MoeForCausalLM
# ----------------------------------------------------------------------------------------------------------

def qwen3_moe_block(x, p, pre, cfg, margins):
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    k, E = cfg["num_experts_per_tok"], cfg["num_experts"]
    routing = F.softmax(F.linear(flat, p[pre + "mlp.gate.weight"]), dim=1)
    topk_weights, topk_indices = torch.topk(routing, k, dim=-1)
    with torch.no_grad():
        margins.expert = min(margins.expert, margins.top_margin(routing, k))
        margins.count(topk_indices, E)
    if cfg["norm_topk_prob"]:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return experts_combine(flat, p, pre + "mlp.", E, topk_indices, topk_weights).view(*shape)


def qwen3_moe_layer(cfg, i):
    """Qwen3MoeDecoderLayer: experts unless the layer is in mlp_only_layers or off decoder_sparse_step."""
    return i not in cfg["mlp_only_layers"] and (i + 1) % cfg["decoder_sparse_step"] == 0


def qwen3_moe_forward(p, inputs, cfg, margins):
    cos, sin = qwen3.rope_cos_sin(inputs.shape[1], cfg["head_dim"], cfg["rope_theta"])
    eps = cfg["rms_norm_eps"]
    h = F.embedding(inputs, p["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        h = h + qwen3.attention(qwen3.rms_norm(h, p[pre + "input_layernorm.weight"], eps), p,
                                pre + "self_attn.", cfg, cos, sin)
        x = qwen3.rms_norm(h, p[pre + "post_attention_layernorm.weight"], eps)
        if qwen3_moe_layer(cfg, i):
            h = h + qwen3_moe_block(x, p, pre, cfg, margins)
        else:  # Qwen3MoeMLP of intermediate_size
            h = h + swiglu_mlp(x, p, pre + "mlp.")
    h = qwen3.rms_norm(h, p["model.norm.weight"], eps)
    return F.linear(h, p["lm_head.weight"])


def qwen3_moe_shapes(cfg):
    d, v, E = cfg["hidden_size"], cfg["vocab_size"], cfg["num_experts"]
    shapes = [("model.embed_tokens.weight", [v, d])]
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        shapes += qwen3.attention_shapes(cfg, pre)
        if not qwen3_moe_layer(cfg, i):
            shapes += swiglu_shapes(pre + "mlp.", d, cfg["intermediate_size"])
            continue
        shapes += [(pre + "mlp.gate.weight", [E, d])]
        for e in range(E):
            shapes += swiglu_shapes(pre + "mlp.experts.%d." % e, d, cfg["moe_intermediate_size"])
    return shapes + [("model.norm.weight", [d]), ("lm_head.weight", [v, d])]


# ----------------------------------------------------------------------------------------------------------
# Parameters, data, driver
# ----------------------------------------------------------------------------------------------------------

def swiglu_shapes(prefix, d, f):
    return [(prefix + "gate_proj.weight", [f, d]), (prefix + "up_proj.weight", [f, d]),
            (prefix + "down_proj.weight", [d, f])]


def make_params(shapes, seed):
    """float64 draws rounded to float32: N(0, 0.1^2) matrices, 1 + 0.1 N(0, 1) norm weights, and the
    selection bias uniform in [-0.1, 0.1] (sigmoid scores here stay within (0.1, 0.9), so every choice
    score stays positive: checked)."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in shapes:
        if name.endswith(BIAS):
            w = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * 0.1
        else:
            w = torch.randn(shape, generator=g, dtype=torch.float64) * WEIGHT_STD
            if len(shape) == 1:
                w = w + 1.0
        params[name] = w.to(torch.float32).to(torch.float64)
    return params


def make_tokens(vocab):
    g = torch.Generator().manual_seed(TOKEN_SEED)
    seq = torch.randint(0, vocab, (BATCH, SEQ + 1), generator=g, dtype=torch.int64)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


VARIANTS = [
    # name, config, shapes, forward, first seed tried
    ("deepseek_v3", DEEPSEEK_CONFIG, deepseek_shapes, deepseek_forward, 20260301),
    ("deepseek_v3_direct_q", DEEPSEEK_DIRECT_Q_CONFIG, deepseek_shapes, deepseek_forward, 20260501),
    ("qwen3_moe", QWEN3_MOE_CONFIG, qwen3_moe_shapes, qwen3_moe_forward, 20260401),
    ("qwen3_moe_dense_first", QWEN3_MOE_DENSE_FIRST_CONFIG, qwen3_moe_shapes, qwen3_moe_forward, 20260601),
]


def compute_golden(cfg, shapes, forward, seed):
    """Returns (seed, params, inputs, targets, logits, loss, loss_sum, grads, margins) for the first seed
    from `seed` on whose routing has no near-tie."""
    inputs, targets = make_tokens(cfg["vocab_size"])
    while True:
        params = make_params(shapes, seed)
        margins = RoutingMargins()
        leaves = {n: t.clone().requires_grad_(not n.endswith(BIAS)) for n, t in params.items()}
        logits = forward(leaves, inputs, cfg, margins)
        if min(margins.expert, margins.group) > MIN_MARGIN and margins.choice > 0 and margins.least_used > 0:
            break
        print("seed %d: routing margin %.3g / group margin %.3g / min choice %.3g / least used expert %s, "
              "next seed" % (seed, margins.expert, margins.group, margins.choice, margins.least_used))
        seed += 1
    flat = logits.reshape(-1, cfg["vocab_size"])
    loss = F.cross_entropy(flat, targets.reshape(-1), reduction="mean")
    loss_sum = F.cross_entropy(flat.detach(), targets.reshape(-1), reduction="sum")
    names = [n for n, _ in shapes if not n.endswith(BIAS)]
    grads = dict(zip(names, torch.autograd.grad(loss, [leaves[n] for n in names])))
    return seed, params, inputs, targets, logits.detach(), loss.detach(), loss_sum, grads, margins


def variant_files(name, cfg, shape_fn, forward, first_seed):
    shapes = shape_fn(cfg)
    seed, params, inputs, targets, logits, loss, loss_sum, grads, margins = compute_golden(
        cfg, shapes, forward, first_seed)
    model_t = [(n, params[n].to(torch.float32)) for n, _ in shapes]
    golden_t = [
        ("inputs", inputs.to(torch.int32)),
        ("targets", targets.to(torch.int32)),
        ("logits", logits.to(torch.float32)),
        ("loss", loss.reshape(1).to(torch.float32)),
        ("loss_sum", loss_sum.reshape(1).to(torch.float32)),
    ] + [("grad." + n, grads[n].to(torch.float32)) for n, _ in shapes if not n.endswith(BIAS)]
    files = {
        "config.json": (json.dumps(cfg, indent=2) + "\n").encode("utf-8"),
        "model.safetensors": qwen3.safetensors_bytes(model_t),
        "golden.safetensors": qwen3.safetensors_bytes(golden_t),
    }
    info = {"seed": seed, "loss": loss.item(), "loss_sum": loss_sum.item(), "margins": margins,
            "model": dict(model_t), "golden": dict(golden_t)}
    return files, info


def main():
    check_only = "--check" in sys.argv[1:]
    ok = True
    for name, cfg, shape_fn, forward, first_seed in VARIANTS:
        files, info = variant_files(name, cfg, shape_fn, forward, first_seed)
        vdir = os.path.join(HERE, name)
        if not check_only:
            os.makedirs(vdir, exist_ok=True)
            for fn, data in files.items():
                with open(os.path.join(vdir, fn), "wb") as f:
                    f.write(data)
        for fn, data in files.items():
            with open(os.path.join(vdir, fn), "rb") as f:
                if f.read() != data:
                    print("MISMATCH %s/%s differs from a fresh computation" % (name, fn))
                    ok = False
        for fn, key in (("model.safetensors", "model"), ("golden.safetensors", "golden")):
            meta, got = qwen3.read_safetensors(os.path.join(vdir, fn))
            assert meta == {"format": "pt", "producer": PRODUCER}
            want = info[key]
            assert set(got) == set(want), (fn, set(got) ^ set(want))
            for k, t in want.items():
                assert got[k].dtype == t.dtype and list(got[k].shape) == list(t.shape), k
                assert torch.equal(got[k], t), k
        m = info["margins"]
        print("%-11s seed=%d loss=%.17g loss_sum=%.17g margins: expert %.3g group %.3g, min choice %.3g, "
              "least used expert %d; %s" % (
                  name, info["seed"], info["loss"], info["loss_sum"], m.expert, m.group, m.choice, m.least_used,
            ", ".join("%s=%dB" % (fn, len(d)) for fn, d in files.items())))
    if not ok:
        sys.exit(1)
    print("OK" if check_only else "written and verified")


if __name__ == "__main__":
    main()
