#!/usr/bin/python3
"""Self-checks for make_golden.py (run: /usr/bin/python3 selfcheck.py).

1. A second, deliberately different float64 implementation of the same Qwen3
   forward (explicit loops over batch / head / query position, RoPE done as a
   complex rotation of the (i, i + hd/2) pairs, GQA via kv head = h // n_rep,
   hand-written log-softmax cross-entropy) must match make_golden's logits and
   loss to ~1e-12, for both variants, starting from the stored F32 files.
2. The stored golden logits / loss / grads must equal make_golden's float64
   values rounded to F32.
3. torch.autograd.gradcheck (float64) on one decoder layer with respect to
   its input and every weight, and central finite differences of the full
   model's mean loss for a sample of weight entries vs. the stored grads.
4. Sensitivity: common Qwen3 bugs (RoPE before q/k norm, norm weights ignored,
   wrong theta, GQA head mapping h % n_kv, missing 1/sqrt(hd), rotate_half
   sign) must each move the logits far beyond float32 tolerance.
"""

import json
import os
import sys

sys.dont_write_bytecode = True

import torch
import torch.nn.functional as F

import make_golden as mg

HERE = os.path.dirname(os.path.abspath(__file__))
torch.set_default_dtype(torch.float64)


def naive_forward(p, inputs, cfg, bug=None):
    B, S = inputs.shape
    D, hd = cfg["hidden_size"], cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    if bug == "theta":
        theta = 1e6
    n_rep = nh // nkv
    half = hd // 2

    def norm(x, w):
        if bug == "norm_weight":
            w = torch.ones_like(w)
        return w * x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps)

    def rope(x, pos):  # x: [hd]
        z = torch.complex(x[:half], x[half:])
        ang = torch.tensor([pos * theta ** (-(2.0 * i) / hd) for i in range(half)])
        sign = -1.0 if bug == "rope_sign" else 1.0
        z = z * torch.complex(torch.cos(ang), sign * torch.sin(ang))
        return torch.cat([z.real, z.imag])

    emb = p["model.embed_tokens.weight"]
    out_rows = []
    for b in range(B):
        h = torch.stack([emb[int(t)] for t in inputs[b]])  # [S, D]
        for l in range(cfg["num_hidden_layers"]):
            pre = "model.layers.%d." % l
            x = norm(h, p[pre + "input_layernorm.weight"])
            Wq, Wk, Wv, Wo = (p[pre + "self_attn.%s_proj.weight" % n] for n in "qkvo")
            qn, kn = p[pre + "self_attn.q_norm.weight"], p[pre + "self_attn.k_norm.weight"]
            heads = []
            for hh in range(nh):
                g = hh % nkv if bug == "gqa_mod" else hh // n_rep
                qs, ks, vs = [], [], []
                for s in range(S):
                    q = Wq[hh * hd:(hh + 1) * hd] @ x[s]
                    k = Wk[g * hd:(g + 1) * hd] @ x[s]
                    if bug == "rope_first":
                        q, k = norm(rope(q, s), qn), norm(rope(k, s), kn)
                    else:
                        q, k = rope(norm(q, qn), s), rope(norm(k, kn), s)
                    qs.append(q)
                    ks.append(k)
                    vs.append(Wv[g * hd:(g + 1) * hd] @ x[s])
                rows = []
                scale = 1.0 if bug == "no_scale" else 1.0 / (hd ** 0.5)
                for s in range(S):
                    sc = torch.stack([(qs[s] * ks[j]).sum() * scale for j in range(s + 1)])
                    w = torch.exp(sc - sc.max())
                    w = w / w.sum()
                    rows.append(sum(w[j] * vs[j] for j in range(s + 1)))
                heads.append(torch.stack(rows))  # [S, hd]
            attn = torch.cat(heads, dim=-1) @ Wo.t()
            h = h + attn
            x = norm(h, p[pre + "post_attention_layernorm.weight"])
            gate = x @ p[pre + "mlp.gate_proj.weight"].t()
            up = x @ p[pre + "mlp.up_proj.weight"].t()
            h = h + ((gate / (1 + torch.exp(-gate))) * up) @ p[pre + "mlp.down_proj.weight"].t()
        h = norm(h, p["model.norm.weight"])
        head = emb if cfg["tie_word_embeddings"] else p["lm_head.weight"]
        out_rows.append(h @ head.t())
    return torch.stack(out_rows)


def naive_loss(logits, targets):
    flat = logits.reshape(-1, logits.shape[-1])
    m = flat.max(-1, keepdim=True).values
    lse = (m + torch.log(torch.exp(flat - m).sum(-1, keepdim=True))).squeeze(-1)
    nll = lse - flat[torch.arange(flat.shape[0]), targets.reshape(-1)]
    return nll.mean(), nll.sum()


def main():
    for name, tied, seed in mg.VARIANTS:
        vdir = os.path.join(HERE, name)
        with open(os.path.join(vdir, "config.json")) as f:
            cj = json.load(f)
        cfg = dict(mg.BASE_CONFIG, tie_word_embeddings=cj["tie_word_embeddings"])
        for k in mg.BASE_CONFIG:
            assert cj[k] == cfg[k], k
        _, model = mg.read_safetensors(os.path.join(vdir, "model.safetensors"))
        _, gold = mg.read_safetensors(os.path.join(vdir, "golden.safetensors"))
        p = {k: v.to(torch.float64) for k, v in model.items()}
        inputs, targets = gold["inputs"].long(), gold["targets"].long()

        # 1. independent implementation vs make_golden (both float64)
        ref_logits, ref_loss, ref_sum, ref_grads = mg.compute_golden(cfg, p, inputs, targets)
        nl = naive_forward(p, inputs, cfg)
        nloss, nsum = naive_loss(nl, targets)
        d_logits = (nl - ref_logits).abs().max().item()
        d_loss = abs(nloss.item() - ref_loss.item())
        print("%s: naive vs make_golden  max|dlogits|=%.2e  |dloss|=%.2e  |dloss_sum|=%.2e" % (
            name, d_logits, d_loss, abs(nsum.item() - ref_sum.item())))
        assert d_logits < 1e-12 and d_loss < 1e-13

        # 2. stored F32 == float64 golden rounded
        assert torch.equal(gold["logits"], ref_logits.float())
        assert torch.equal(gold["loss"], ref_loss.reshape(1).float())
        assert torch.equal(gold["loss_sum"], ref_sum.reshape(1).float())
        for k, g in ref_grads.items():
            assert torch.equal(gold["grad." + k], g.float()), k
        assert set(k for k in gold if k.startswith("grad.")) == set("grad." + k for k in model)
        print("%s: stored F32 logits/loss/loss_sum/%d grads == float64 golden rounded" % (name, len(ref_grads)))

        # 3b. finite differences of the full model vs the stored grads
        gen = torch.Generator().manual_seed(7)
        worst = 0.0
        for k in sorted(p):
            for _ in range(3):
                idx = tuple(int(torch.randint(0, n, (1,), generator=gen)) for n in p[k].shape)
                eps = 1e-6
                pp, pm = dict(p), dict(p)
                pp[k] = p[k].clone(); pp[k][idx] += eps
                pm[k] = p[k].clone(); pm[k][idx] -= eps
                lp = F.cross_entropy(mg.forward(pp, inputs, cfg).reshape(-1, cfg["vocab_size"]), targets.reshape(-1))
                lm = F.cross_entropy(mg.forward(pm, inputs, cfg).reshape(-1, cfg["vocab_size"]), targets.reshape(-1))
                fd = ((lp - lm) / (2 * eps)).item()
                an = ref_grads[k][idx].item()
                worst = max(worst, abs(fd - an))
        print("%s: central FD vs autograd grads, %d entries, max abs diff %.2e" % (name, 3 * len(p), worst))
        assert worst < 1e-8

        # 4. sensitivity to typical bugs (tolerance of a float32 C++ side is ~1e-4)
        for bug in ["rope_first", "norm_weight", "theta", "gqa_mod", "no_scale", "rope_sign"]:
            d = (naive_forward(p, inputs, cfg, bug=bug) - ref_logits).abs().max().item()
            print("%s:   bug %-11s -> max|dlogits| = %.3e" % (name, bug, d))
            assert d > 1e-2, bug

    # 3a. gradcheck on one decoder layer (small dims to keep it fast)
    cfg = dict(mg.BASE_CONFIG, hidden_size=16, intermediate_size=24, head_dim=4,
               num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
               tie_word_embeddings=True)
    gen = torch.Generator().manual_seed(11)
    names = [n for n, _ in mg.param_shapes(cfg) if n.startswith("model.layers.0.")]
    shapes = dict(mg.param_shapes(cfg))
    ws = [(torch.randn(shapes[n], generator=gen) * 0.3 + (1.0 if len(shapes[n]) == 1 else 0.0)).requires_grad_(True)
          for n in names]
    x = torch.randn(2, 5, cfg["hidden_size"], generator=gen).requires_grad_(True)
    cos, sin = mg.rope_cos_sin(5, cfg["head_dim"], cfg["rope_theta"])

    def layer(x, *w):
        return mg.decoder_layer(x, dict(zip(names, w)), 0, cfg, cos, sin)

    assert torch.autograd.gradcheck(layer, (x, *ws), eps=1e-6, atol=1e-8, rtol=1e-6)
    print("gradcheck: one decoder layer (input + %d weights) OK" % len(ws))
    print("ALL SELF-CHECKS PASSED")


if __name__ == "__main__":
    main()
