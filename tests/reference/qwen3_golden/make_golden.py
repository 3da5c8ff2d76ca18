#!/usr/bin/python3
"""Golden fixture generator for meshtrain's Qwen3 forward/backward.

This script is an independent re-expression, in plain float64 PyTorch, of the
Hugging Face Qwen3 causal LM (transformers' models/qwen3/modeling_qwen3.py:
Qwen3RMSNorm, rotate_half / apply_rotary_pos_emb, Qwen3Attention with per-head
q_norm / k_norm applied BEFORE RoPE, repeat_kv for GQA, eager causal softmax
attention scaled by head_dim**-0.5, Qwen3MLP down(silu(gate(x)) * up(x)),
pre-norm decoder layers with residuals, final norm, lm_head tied or not).
It does not import transformers.

For two small random configs ("tied" and "untied" word embeddings) it writes:
  <variant>/config.json         HF-style Qwen3 config
  <variant>/model.safetensors   weights, HF names, [out, in] layout, F32
  <variant>/golden.safetensors  inputs/targets (I32), logits, loss (mean),
                                loss_sum and grad.<hf name> = d(mean loss)/dW
                                (all F32, computed in float64)
Weights are drawn in float64, rounded to float32, and the forward/backward is
run in float64 on those float32-rounded values, so the stored F32 weights are
exactly what the golden values were computed from. The safetensors files are
written by hand (no safetensors package needed) and read back for a check.

Run (Debian's python3-torch only imports under the system interpreter):
    cd tests/reference/qwen3_golden && /usr/bin/python3 make_golden.py
Output is deterministic: rerunning regenerates every file bit-identically
(with the same torch build). `--check` only verifies the existing files
against a fresh computation without writing anything.
"""

import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
PRODUCER = "meshtrain tests/reference/qwen3_golden/make_golden.py"

BASE_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 64,
}
BATCH = 2
SEQ = 12
VARIANTS = [("tied", True, 20250101), ("untied", False, 20250202)]
TOKEN_SEED = 424242
WEIGHT_STD = 0.1

torch.set_default_dtype(torch.float64)


# ----------------------------------------------------------------------------
# Model (float64 re-expression of HF modeling_qwen3.py)
# ----------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    # Qwen3RMSNorm: weight * (x * rsqrt(mean(x^2, -1) + eps)); HF upcasts to
    # fp32, here everything is already fp64.
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rope_cos_sin(seq_len, head_dim, theta):
    # Qwen3RotaryEmbedding default rope: inv_freq = 1 / theta^(arange(0,hd,2)/hd)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float64) / head_dim))
    positions = torch.arange(seq_len, dtype=torch.int64).to(torch.float64)  # positions 0..S-1
    freqs = torch.outer(positions, inv_freq)                                  # [S, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)                                   # [S, hd]
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    # q, k: [B, H, S, hd]; cos, sin: [S, hd] broadcast over batch and heads
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(x, n_rep):
    # [B, Hkv, S, hd] -> [B, Hkv*n_rep, S, hd]; query head h uses kv head h // n_rep
    b, hkv, s, hd = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(b, hkv, n_rep, s, hd)
    return x.reshape(b, hkv * n_rep, s, hd)


def attention(x, p, prefix, cfg, cos, sin):
    b, s, _ = x.shape
    hd = cfg["head_dim"]
    nh = cfg["num_attention_heads"]
    nkv = cfg["num_key_value_heads"]
    eps = cfg["rms_norm_eps"]
    # projections (nn.Linear: y = x @ W^T, W is [out, in]); per-head RMSNorm on
    # the head_dim axis BEFORE transposing to [B, H, S, hd] and BEFORE RoPE.
    q = F.linear(x, p[prefix + "q_proj.weight"]).view(b, s, nh, hd)
    k = F.linear(x, p[prefix + "k_proj.weight"]).view(b, s, nkv, hd)
    v = F.linear(x, p[prefix + "v_proj.weight"]).view(b, s, nkv, hd)
    q = rms_norm(q, p[prefix + "q_norm.weight"], eps).transpose(1, 2)
    k = rms_norm(k, p[prefix + "k_norm.weight"], eps).transpose(1, 2)
    v = v.transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)

    n_rep = nh // nkv
    k = repeat_kv(k, n_rep)
    v = repeat_kv(v, n_rep)
    scaling = hd ** -0.5
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling          # [B, H, S, S]
    causal = torch.ones(s, s, dtype=torch.bool).tril()              # key pos <= query pos
    scores = scores.masked_fill(~causal, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, nh * hd)
    return F.linear(out, p[prefix + "o_proj.weight"])


def mlp(x, p, prefix):
    gate = F.linear(x, p[prefix + "gate_proj.weight"])
    up = F.linear(x, p[prefix + "up_proj.weight"])
    return F.linear(F.silu(gate) * up, p[prefix + "down_proj.weight"])


def decoder_layer(h, p, i, cfg, cos, sin):
    pre = "model.layers.%d." % i
    eps = cfg["rms_norm_eps"]
    residual = h
    h = rms_norm(h, p[pre + "input_layernorm.weight"], eps)
    h = residual + attention(h, p, pre + "self_attn.", cfg, cos, sin)
    residual = h
    h = rms_norm(h, p[pre + "post_attention_layernorm.weight"], eps)
    return residual + mlp(h, p, pre + "mlp.")


def forward(p, inputs, cfg):
    """Qwen3ForCausalLM forward: returns logits [B, S, V] (float64)."""
    s = inputs.shape[1]
    cos, sin = rope_cos_sin(s, cfg["head_dim"], cfg["rope_theta"])
    h = F.embedding(inputs, p["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        h = decoder_layer(h, p, i, cfg, cos, sin)
    h = rms_norm(h, p["model.norm.weight"], cfg["rms_norm_eps"])
    head = p["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else p["lm_head.weight"]
    return F.linear(h, head)


# ----------------------------------------------------------------------------
# Parameters and data
# ----------------------------------------------------------------------------

def attention_shapes(cfg, pre):
    """A Qwen3 decoder layer's tensors up to its MLP (the Qwen3-MoE golden script shares them)."""
    d, hd = cfg["hidden_size"], cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    return [
        (pre + "input_layernorm.weight", [d]),
        (pre + "self_attn.q_proj.weight", [nh * hd, d]),
        (pre + "self_attn.k_proj.weight", [nkv * hd, d]),
        (pre + "self_attn.v_proj.weight", [nkv * hd, d]),
        (pre + "self_attn.o_proj.weight", [d, nh * hd]),
        (pre + "self_attn.q_norm.weight", [hd]),
        (pre + "self_attn.k_norm.weight", [hd]),
        (pre + "post_attention_layernorm.weight", [d]),
    ]


def param_shapes(cfg):
    d, ff, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    shapes = [("model.embed_tokens.weight", [v, d])]
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        shapes += attention_shapes(cfg, pre) + [
            (pre + "mlp.gate_proj.weight", [ff, d]),
            (pre + "mlp.up_proj.weight", [ff, d]),
            (pre + "mlp.down_proj.weight", [d, ff]),
        ]
    shapes.append(("model.norm.weight", [d]))
    if not cfg["tie_word_embeddings"]:
        shapes.append(("lm_head.weight", [v, d]))
    return shapes


def make_params(cfg, seed):
    """Draw float64 weights, round to float32, return float64 copies of the rounded values."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in param_shapes(cfg):
        w = torch.randn(shape, generator=g, dtype=torch.float64) * WEIGHT_STD
        if len(shape) == 1:  # RMSNorm weights: 1 + 0.1*N(0,1), so ignoring them fails
            w = w + 1.0
        params[name] = w.to(torch.float32).to(torch.float64)
    return params


def make_tokens(cfg):
    g = torch.Generator().manual_seed(TOKEN_SEED)
    seq = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ + 1), generator=g, dtype=torch.int64)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def compute_golden(cfg, params, inputs, targets):
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    logits = forward(leaves, inputs, cfg)
    flat = logits.reshape(-1, cfg["vocab_size"])
    loss = F.cross_entropy(flat, targets.reshape(-1), reduction="mean")
    loss_sum = F.cross_entropy(flat.detach(), targets.reshape(-1), reduction="sum")
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names])
    return logits.detach(), loss.detach(), loss_sum, dict(zip(names, grads))


# ----------------------------------------------------------------------------
# Hand-written safetensors
# ----------------------------------------------------------------------------

_DT = {torch.float32: ("F32", "<f"), torch.int32: ("I32", "<i")}


def tensor_bytes(t):
    t = t.contiguous().reshape(-1)
    _, fmt = _DT[t.dtype]
    return struct.pack("<%d%s" % (t.numel(), fmt[1]), *t.tolist())


def safetensors_bytes(tensors):
    """tensors: list of (name, tensor) in file order; float32 or int32."""
    header = {}
    chunks = []
    offset = 0
    for name, t in tensors:
        data = tensor_bytes(t)
        header[name] = {"dtype": _DT[t.dtype][0], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt", "producer": PRODUCER}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    return struct.pack("<Q", len(hjson)) + hjson + b"".join(chunks)


def read_safetensors(path):
    """Independent reader: returns (metadata, {name: tensor})."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0, "header not padded to 8"
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", None)
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    pos = 0
    for b, e, k in spans:  # contiguous, no gaps, no overlap, covers the data section
        assert b == pos, "gap/overlap at %s" % k
        pos = e
    assert pos == len(data), "trailing bytes"
    out = {}
    for k, v in header.items():
        b, e = v["data_offsets"]
        code = {"F32": "f", "I32": "i"}[v["dtype"]]
        count = (e - b) // 4
        assert count == math.prod(v["shape"]) and (e - b) % 4 == 0
        vals = struct.unpack("<%d%s" % (count, code), data[b:e])
        dtype = torch.float32 if code == "f" else torch.int32
        out[k] = torch.tensor(vals, dtype=dtype).reshape(v["shape"])
    return meta, out


# ----------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------

def variant_files(name, tied, seed):
    cfg = dict(BASE_CONFIG, tie_word_embeddings=tied)
    params = make_params(cfg, seed)
    inputs, targets = make_tokens(cfg)
    logits, loss, loss_sum, grads = compute_golden(cfg, params, inputs, targets)

    config_json = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["head_dim"],
        "vocab_size": cfg["vocab_size"],
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"],
        "tie_word_embeddings": tied,
        "max_position_embeddings": cfg["max_position_embeddings"],
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "float32",
    }
    order = [n for n, _ in param_shapes(cfg)]
    model_t = [(n, params[n].to(torch.float32)) for n in order]
    golden_t = [
        ("inputs", inputs.to(torch.int32)),
        ("targets", targets.to(torch.int32)),
        ("logits", logits.to(torch.float32)),
        ("loss", loss.reshape(1).to(torch.float32)),
        ("loss_sum", loss_sum.reshape(1).to(torch.float32)),
    ] + [("grad." + n, grads[n].to(torch.float32)) for n in order]
    files = {
        "config.json": (json.dumps(config_json, indent=2) + "\n").encode("utf-8"),
        "model.safetensors": safetensors_bytes(model_t),
        "golden.safetensors": safetensors_bytes(golden_t),
    }
    info = {"loss": loss.item(), "loss_sum": loss_sum.item(), "model": dict(model_t), "golden": dict(golden_t)}
    return files, info


def main():
    check_only = "--check" in sys.argv[1:]
    ok = True
    for name, tied, seed in VARIANTS:
        files, info = variant_files(name, tied, seed)
        vdir = os.path.join(HERE, name)
        if not check_only:
            os.makedirs(vdir, exist_ok=True)
            for fn, data in files.items():
                with open(os.path.join(vdir, fn), "wb") as f:
                    f.write(data)
        # Read back and compare (exact).
        for fn, data in files.items():
            path = os.path.join(vdir, fn)
            with open(path, "rb") as f:
                same = f.read() == data
            if not same:
                print("MISMATCH %s/%s differs from a fresh computation" % (name, fn))
                ok = False
        for fn, key in (("model.safetensors", "model"), ("golden.safetensors", "golden")):
            meta, got = read_safetensors(os.path.join(vdir, fn))
            assert meta == {"format": "pt", "producer": PRODUCER}
            want = info[key]
            assert set(got) == set(want), (fn, set(got) ^ set(want))
            for k, t in want.items():
                assert got[k].dtype == t.dtype and list(got[k].shape) == list(t.shape), k
                assert torch.equal(got[k], t), k
        print("%-6s loss=%.17g loss_sum=%.17g  files: %s" % (
            name, info["loss"], info["loss_sum"],
            ", ".join("%s=%dB" % (fn, len(d)) for fn, d in files.items())))
    if not ok:
        sys.exit(1)
    print("OK" if check_only else "written and verified")


if __name__ == "__main__":
    main()
