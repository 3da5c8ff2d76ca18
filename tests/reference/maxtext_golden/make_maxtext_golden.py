#!/usr/bin/env python3
"""Golden fixture for Engram (hashing, block) and mHC (site, Sinkhorn) from the JAX reference system (maxtext).

Runs maxtext's own code from a checkout (src/maxtext/layers/engram.py, mhc.py, normalizations.py) in float64
on CPU and writes maxtext_golden.safetensors beside this script (see README.md for every tensor).

Usage (maxtext needs Python >= 3.12; virtual environment outside the repository, see README.md):
  /tmp/jaxvenv/bin/python tests/reference/maxtext_golden/make_maxtext_golden.py /tmp/maxtext [--out DIR] [--check]

--check regenerates into a temporary directory and compares bit-for-bit with the committed file.

Precision: the reference upcasts to float32 inside RMSNorm (normalizations.py, `jnp.asarray(x, jnp.float32)`), inside
sinkhorn (mhc.py, `t.astype(jnp.float32)`), and MultiHeadEmbedding's Embed computes in its default dtype float32.
To get a float64 fixture, this script hands normalizations.py and mhc.py a view of jax.numpy whose `float32` is
float64, and sets the Embed's compute dtype to float64; everything else is the reference's code unchanged. The script
also runs the unpatched (float32-internal) reference and checks that it agrees to float32 accuracy, so the patch
changes precision only.
"""
import argparse
import contextlib
import filecmp
import json
import os
import struct
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
DEFAULT_TOKENIZER = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "assets", "tokenizers", "qwen3"))
FIXTURE = "maxtext_golden.safetensors"

# Spec test vector (shared/specs/engram.md section 2): bases [226240, 226240], layers [1, 4], H = 8, N = 3.
SPEC_TABLE_SIZES = {
    1: [[226241, 226267, 226283, 226307, 226313, 226337, 226357, 226367],
        [226379, 226381, 226397, 226409, 226427, 226433, 226451, 226453]],
}
SPEC_LAYER4_FIRST, SPEC_LAYER4_LAST, SPEC_LAYER1_ROWS, SPEC_LAYER4_ROWS = 226463, 226649, 3621802, 3625086

HASH_TEXTS = [
    "The cat sat on THE mat. the Cat!",
    "  Hello   WORLD,\thello world; HELLO World. Café CAFE naïve NAÏVE",
]
HASH_SEQ = 16
RMS_EPS = 1e-6


def parse_args():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("maxtext", help="maxtext checkout (the directory holding src/maxtext)")
  p.add_argument("--out", default=HERE, help="output directory (default: beside this script)")
  p.add_argument("--check", action="store_true", help="regenerate into a temp dir and compare with the committed file")
  p.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help="Qwen3 tokenizer directory (tokenizer.json)")
  return p.parse_args()


ARGS = parse_args()
sys.path.insert(0, os.path.join(os.path.abspath(ARGS.maxtext), "src"))

import jax  # noqa: E402

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from maxtext.common.common_types import HyperConnectionType, ShardMode  # noqa: E402
from maxtext.layers import engram, mhc, normalizations  # noqa: E402

MESH = Mesh(np.array(jax.devices()[:1]), ("data",))


# ----------------------------------------------------------------------------------------------------------------
# float64 inside the reference
class _Float32IsFloat64(types.ModuleType):
  """jax.numpy as seen by normalizations.py / mhc.py, except that `float32` is float64."""

  float32 = jnp.float64

  def __getattr__(self, name):
    return getattr(jnp, name)


_F64_JNP = _Float32IsFloat64("jax.numpy (float32 -> float64)")
EXACT = True  # False: run the reference unpatched (float32 internals), for the consistency check only


@contextlib.contextmanager
def precision(exact):
  global EXACT
  saved = (normalizations.jnp, mhc.jnp, EXACT)
  if exact:
    normalizations.jnp = _F64_JNP
    mhc.jnp = _F64_JNP
  EXACT = exact
  try:
    yield
  finally:
    normalizations.jnp, mhc.jnp, EXACT = saved


def make_config(emb_dim, G):
  """The config attributes the Engram / mHC / RMSNorm / DenseGeneral / Embed code paths read."""
  return types.SimpleNamespace(
      dtype=jnp.float64,
      weight_dtype=jnp.float64,
      normalization_layer_epsilon=RMS_EPS,
      matmul_precision="highest",
      shard_mode=ShardMode.AUTO,
      emb_dim=emb_dim,
      use_iota_embed=False,
      parameter_memory_host_offload=False,
      mhc_expansion_rate=G,
      sinkhorn_iterations=20,
      enable_mhc_lite=False,
      use_mhc_pallas_kernel=False,
  )


def set_param(var, value):
  value = np.asarray(value, dtype=np.float64)
  assert tuple(var.get_value().shape) == value.shape, (var.get_value().shape, value.shape)
  var.set_value(jnp.asarray(value))


def grads_of(model, loss_fn, x):
  """d loss / d (x, every Param of model); returns (dx, {path tuple: grad})."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def f(params, x):
    return loss_fn(nnx.merge(graphdef, params, rest), x)

  dparams, dx = jax.grad(f, argnums=(0, 1))(params, x)
  return np.asarray(dx), {tuple(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(dparams)}


# ----------------------------------------------------------------------------------------------------------------
# A. hashing
def fnv1a64_int32_le(values):
  digest = 0xCBF29CE484222325
  for byte in struct.pack("<%di" % len(values), *[int(v) for v in values]):
    digest = ((digest ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
  return "%016x" % digest


def build_hashing(out):
  tok = transformers.AutoTokenizer.from_pretrained(ARGS.tokenizer)  # as maxtext's models/deepseek.py does
  pad_token_id = tok.pad_token_id
  assert pad_token_id == 151643 and tok.pad_token == "<|endoftext|>", (pad_token_id, tok.pad_token)
  rows = []
  for text in HASH_TEXTS:
    ids = tok.encode(text)[:HASH_SEQ]
    rows.append(ids + [pad_token_id] * (HASH_SEQ - len(ids)))
  token_ids = np.array(rows, dtype=np.int32)

  layers, N, H = [1, 4], 3, 8
  hm = engram.NgramHashMapping(
      engram_vocab_bases=[226240, 226240], max_ngram_size=N, engram_num_heads=H, layer_ids=layers,
      tokenizer=tok, pad_id=pad_token_id, seed=0)
  compressed = np.asarray(hm.compressed_tokenizer(token_ids))
  hashes = hm(token_ids)
  vc = len(hm.compressed_tokenizer)

  out["hash/token_ids"] = token_ids
  out["hash/compressed_ids"] = compressed.astype(np.int32)
  out["hash/pad_id"] = np.array([hm.pad_id], dtype=np.int64)
  out["hash/compressed_vocab_size"] = np.array([vc], dtype=np.int64)
  for layer in layers:
    out[f"hash/layer_{layer}/multipliers"] = np.asarray(hm.layer_multipliers[layer]).astype(np.int64)
    out[f"hash/layer_{layer}/table_sizes"] = np.array(hm.vocab_size_across_layers[layer], dtype=np.int64)
    out[f"hash/layer_{layer}/ids"] = np.asarray(hashes[layer]).astype(np.int32)

  # --- checks
  sizes1, sizes4 = out["hash/layer_1/table_sizes"], out["hash/layer_4/table_sizes"]
  assert sizes1.tolist() == SPEC_TABLE_SIZES[1], sizes1
  assert sizes4.shape == (N - 1, H) and sizes4[0, 0] == SPEC_LAYER4_FIRST and sizes4[-1, -1] == SPEC_LAYER4_LAST
  assert sizes1.sum() == SPEC_LAYER1_ROWS and sizes4.sum() == SPEC_LAYER4_ROWS
  # compressed vocabulary equals the one the project made with `tokenizers` (tests/reference/engram_golden)
  cj = os.path.join(REPO_ROOT, "tests", "reference", "engram_golden", "compressed.json")
  lut = np.asarray(hm.compressed_tokenizer.lookup_table_np)
  if os.path.exists(cj):
    q = json.load(open(cj))["tokenizers"]["qwen3"]
    assert (len(lut), vc) == (q["vocab_size"], q["compressed_size"]), (len(lut), vc)
    assert fnv1a64_int32_le(lut) == q["fnv1a64_int32_le"]
    assert all(lut[t] == c for t, c in q["samples"])
    print("hash: maxtext's compressed vocabulary equals engram_golden/compressed.json (FNV-1a 64 %s)"
          % q["fnv1a64_int32_le"])
  else:
    print("hash: %s not found, compressed vocabulary cross-check skipped" % cj)
  assert np.array_equal(compressed, lut[token_ids])
  # independent int64 re-hash with the stored multipliers (the spec's formula): identical ids
  for layer in layers:
    m = out[f"hash/layer_{layer}/multipliers"]
    assert np.all(m % 2 == 1) and np.all(m <= (2**31 - 1) // vc), m
    x = compressed.astype(np.int64)
    shifted = [x] + [np.concatenate([np.full((x.shape[0], k), hm.pad_id, np.int64), x[:, :-k]], 1) for k in (1, 2)]
    h = shifted[0] * m[0]
    ids = []
    for n in range(2, N + 1):
      h = h ^ (shifted[n - 1] * m[n - 1])
      ids.append(np.mod(h[..., None], out[f"hash/layer_{layer}/table_sizes"][n - 2]))
    assert np.array_equal(np.concatenate(ids, -1), out[f"hash/layer_{layer}/ids"]), layer
  print("hash: Vc %d, pad_id %d, multipliers L1 %s L4 %s" % (
      vc, hm.pad_id, out["hash/layer_1/multipliers"].tolist(), out["hash/layer_4/multipliers"].tolist()))


# ----------------------------------------------------------------------------------------------------------------
# B. Engram block
EN = dict(D=16, H=2, N=3, Dh=4, K=4, B=2, S=12, bases=[31, 37])


def engram_table_sizes():
  """maxtext's own prime search (NgramHashMapping._calculate_vocab_size_across_layers) for small bases."""
  holder = types.SimpleNamespace(
      min_head_vocab_size_per_ngram=EN["bases"], max_ngram_size=EN["N"], n_head_per_ngram=EN["H"], layer_ids=[0])
  sizes = engram.NgramHashMapping._calculate_vocab_size_across_layers(holder)[0]
  assert sizes == [[31, 37], [41, 43]], sizes
  return np.array(sizes, dtype=np.int64)


def engram_inputs(G, seed):
  D, H, N, Dh, K, B, S = (EN[k] for k in ("D", "H", "N", "Dh", "K", "B", "S"))
  sizes = engram_table_sizes()
  flat = sizes.reshape(-1)
  d_en = Dh * H * (N - 1)
  rng = np.random.default_rng(seed)
  p = {
      "table": rng.standard_normal((int(flat.sum()), Dh)) * 0.5,
      "key_kernel": rng.standard_normal((d_en, G, D)) * 0.5,
      "key_bias": rng.standard_normal((G, D)) * 0.5,
      "value_kernel": rng.standard_normal((d_en, D)) * 0.5,
      "value_bias": rng.standard_normal((D,)) * 0.5,
      "k_norm_scale": 1.0 + 0.2 * rng.standard_normal((G, D)),
      "q_norm_scale": 1.0 + 0.2 * rng.standard_normal((G, D)),
      "conv_norm_scale": 1.0 + 0.2 * rng.standard_normal((G, D)),
      "conv_kernel": rng.standard_normal((K, G * D)) * 0.5,
  }
  hidden = rng.standard_normal((B, S, G, D))
  hash_ids = np.stack([rng.integers(0, int(v), size=(B, S)) for v in flat], axis=-1).astype(np.int32)
  cot = rng.standard_normal((B, S, G, D))
  return sizes, p, hidden, hash_ids, cot


def engram_reference(G, sizes, p, hidden, hash_ids, cot):
  cfg = make_config(EN["D"], G)
  m = engram.Engram(
      config=cfg, mesh=MESH, vocab_sizes=[int(v) for v in sizes.reshape(-1)], engram_num_heads=EN["H"],
      engram_head_dim=EN["Dh"], engram_max_ngram_size=EN["N"], engram_kernel_size=EN["K"], mhc_expansion_rate=G,
      rngs=nnx.Rngs(0))
  if EXACT:
    m.multi_head_embedding.embedding.dtype = jnp.float64  # MultiHeadEmbedding leaves Embed at float32
  assert float(m.short_conv.conv.kernel.get_value().std()) == 0.0  # reference init: conv kernel zero
  set_param(m.multi_head_embedding.embedding.embedding, p["table"])
  set_param(m.key_proj.kernel, p["key_kernel"])
  set_param(m.key_proj.bias, p["key_bias"])
  set_param(m.value_proj.kernel, p["value_kernel"])
  set_param(m.value_proj.bias, p["value_bias"])
  set_param(m.k_norm.scale, p["k_norm_scale"])
  set_param(m.q_norm.scale, p["q_norm_scale"])
  set_param(m.short_conv.norm.scale, p["conv_norm_scale"])
  set_param(m.short_conv.conv.kernel, p["conv_kernel"][:, None, :])  # reference layout [K, 1, G*D]

  ids = jnp.asarray(hash_ids)
  output = np.asarray(m(jnp.asarray(hidden), ids))
  d_hidden, g = grads_of(m, lambda mod, x: jnp.sum(mod(x, ids) * cot), jnp.asarray(hidden))
  d = {
      "d_hidden": d_hidden,
      "d_table": g[("multi_head_embedding", "embedding", "embedding")],
      "d_key_kernel": g[("key_proj", "kernel")],
      "d_key_bias": g[("key_proj", "bias")],
      "d_value_kernel": g[("value_proj", "kernel")],
      "d_value_bias": g[("value_proj", "bias")],
      "d_k_norm_scale": g[("k_norm", "scale")],
      "d_q_norm_scale": g[("q_norm", "scale")],
      "d_conv_norm_scale": g[("short_conv", "norm", "scale")],
      "d_conv_kernel": g[("short_conv", "conv", "kernel")][:, 0, :],
  }
  assert len(g) == 9, sorted(g)
  return output, d


# independent numpy float64 implementation of the spec (shared/specs/engram.md sections 3-5)
def np_rms(x, scale):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS) * scale


def np_engram(p, hidden, hash_ids, sizes):
  B, S, G, D = hidden.shape
  N, K = EN["N"], EN["K"]
  flat = sizes.reshape(-1)
  offsets = np.concatenate([[0], np.cumsum(flat)[:-1]])
  e = p["table"][hash_ids + offsets].reshape(B, S, -1)
  key = np.einsum("bse,egd->bsgd", e, p["key_kernel"]) + p["key_bias"]
  k = np_rms(key, p["k_norm_scale"])
  q = np_rms(hidden, p["q_norm_scale"])
  s = np.sum(q * k, -1) / np.sqrt(D)
  gate = 1 / (1 + np.exp(-(np.sign(s) * np.sqrt(np.maximum(np.abs(s), 1e-6)))))
  v = e @ p["value_kernel"] + p["value_bias"]
  gv = gate[..., None] * v[:, :, None, :]
  u = np_rms(gv, p["conv_norm_scale"]).reshape(B, S, G * D)
  y = np.zeros_like(u)
  for t in range(S):
    for j in range(K):
      src = t - (K - 1 - j) * N  # tap j multiplies input t - (K-1-j)*dilation
      if src >= 0:
        y[:, t] += p["conv_kernel"][j] * u[:, src]
  return gv + (y / (1 + np.exp(-y))).reshape(B, S, G, D)


def build_engram(out, G, seed):
  sizes, p, hidden, hash_ids, cot = engram_inputs(G, seed)
  with precision(True):
    output, d = engram_reference(G, sizes, p, hidden, hash_ids, cot)
  with precision(False):
    output32, d32 = engram_reference(G, sizes, p, hidden, hash_ids, cot)
  pre = f"engram_g{G}/"
  out[pre + "table_sizes"] = sizes
  out[pre + "hidden"] = hidden
  out[pre + "hash_ids"] = hash_ids
  for k, v in p.items():
    out[pre + k] = v
  out[pre + "output"] = output
  out[pre + "cotangent"] = cot
  for k, v in d.items():
    assert v.shape == (hidden.shape if k == "d_hidden" else p[k[2:]].shape), (k, v.shape)
    out[pre + k] = v
  out[pre + "rms_epsilon"] = np.array([RMS_EPS])

  # --- checks
  ref = np_engram(p, hidden, hash_ids, sizes)
  err = np.max(np.abs(ref - output))
  assert err < 1e-12, err
  check_float32_agreement(pre, {"output": output, **d}, {"output": output32, **d32})
  loss = lambda q: float(np.sum(np_engram(q["p"], q["hidden"], hash_ids, sizes) * cot))
  fd_err = finite_difference_check({"p": p, "hidden": hidden}, {"hidden": d["d_hidden"], **{
      k[2:]: v for k, v in d.items() if k != "d_hidden"}}, loss, seed)
  print("%s numpy spec forward max |diff| %.2e; finite-difference rel err %.1e; conv kernel |w| mean %.2f"
        % (pre, err, fd_err, np.abs(p["conv_kernel"]).mean()))


# ----------------------------------------------------------------------------------------------------------------
# C. mHC site, D. sinkhorn
MH = dict(G=4, D=8, B=2, S=5)


class Branch(nnx.Module):
  """branch_fn for mhc_type MLP_DENSE: inputs -> inputs @ W."""

  def __init__(self, d, rngs):
    self.kernel = nnx.Param(jax.random.normal(rngs.params(), (d, d), jnp.float64))

  def __call__(self, inputs):
    return jnp.einsum("bsd,de->bse", inputs, self.kernel[...], precision=jax.lax.Precision.HIGHEST)


class MhcSite(nnx.Module):
  """One mHC site: maxtext's ManifoldConstrainedHyperConnections.__call__ with an RMSNorm norm_fn and Branch."""

  def __init__(self):
    cfg = make_config(MH["D"], MH["G"])
    rngs = nnx.Rngs(0)
    self.site = mhc.ManifoldConstrainedHyperConnections(cfg, MH["D"], MESH, rngs)
    self.branch_norm = normalizations.RMSNorm(
        num_features=MH["D"], dtype=cfg.dtype, weight_dtype=cfg.weight_dtype, kernel_axes=("norm",),
        epsilon=cfg.normalization_layer_epsilon, rngs=rngs)
    self.branch = Branch(MH["D"], rngs)

  def __call__(self, x):
    out, _ = self.site(self.branch_norm, self.branch, x, HyperConnectionType.MLP_DENSE)
    return out


MHC_PARAMS = {  # fixture name: path in MhcSite
    "norm_scale": ("site", "mhc_norm", "scale"),
    "pre_alpha": ("site", "pre_alpha"),
    "post_alpha": ("site", "post_alpha"),
    "res_alpha": ("site", "res_alpha"),
    "pre_beta": ("site", "pre_beta"),
    "post_beta": ("site", "post_beta"),
    "res_beta": ("site", "res_beta"),
    "pre_alpha_scale": ("site", "pre_alpha_scale"),
    "post_alpha_scale": ("site", "post_alpha_scale"),
    "res_alpha_scale": ("site", "res_alpha_scale"),
    "branch_norm_scale": ("branch_norm", "scale"),
    "branch_kernel": ("branch", "kernel"),
}


def mhc_inputs(seed):
  G, D, B, S = MH["G"], MH["D"], MH["B"], MH["S"]
  rng = np.random.default_rng(seed)
  p = {
      "norm_scale": 1.0 + 0.2 * rng.standard_normal((G * D,)),
      "pre_alpha": 0.3 * rng.standard_normal((G * D, G)),
      "post_alpha": 0.3 * rng.standard_normal((G * D, G)),
      "res_alpha": 0.3 * rng.standard_normal((G * D, G * G)),
      "pre_beta": 0.5 * rng.standard_normal((G,)),
      "post_beta": 0.5 * rng.standard_normal((G,)),
      "res_beta": 0.5 * rng.standard_normal((G, G)),
      "pre_alpha_scale": np.array([0.7]),
      "post_alpha_scale": np.array([-0.4]),
      "res_alpha_scale": np.array([0.9]),
      "branch_norm_scale": 1.0 + 0.2 * rng.standard_normal((D,)),
      "branch_kernel": rng.standard_normal((D, D)) / np.sqrt(D),
  }
  x = rng.standard_normal((B, S, G, D))
  cot = rng.standard_normal((B, S, G, D))
  return p, x, cot


def get_path(obj, path):
  for name in path:
    obj = getattr(obj, name)
  return obj


def mhc_reference(p, x, cot):
  model = MhcSite()
  for name, path in MHC_PARAMS.items():
    set_param(get_path(model, path), p[name])
  mixing = []
  orig = mhc.ManifoldConstrainedHyperConnections.res_mapping

  def recording_res_mapping(self, h_res):
    m = orig(self, h_res)
    mixing.append(np.asarray(m))
    return m

  mhc.ManifoldConstrainedHyperConnections.res_mapping = recording_res_mapping
  try:
    output = np.asarray(model(jnp.asarray(x)))
  finally:
    mhc.ManifoldConstrainedHyperConnections.res_mapping = orig
  assert len(mixing) == 1
  dx, g = grads_of(model, lambda mod, xx: jnp.sum(mod(xx) * cot), jnp.asarray(x))
  assert sorted(g) == sorted(MHC_PARAMS.values()), sorted(g)
  d = {"d_x": dx, **{"d_" + name: g[path] for name, path in MHC_PARAMS.items()}}
  return output, mixing[0], d


def np_sinkhorn(t, iters=20):
  t = np.exp(t - t.max(-1, keepdims=True))
  t = t / t.sum(-1, keepdims=True) + 1e-6
  t = t / (t.sum(-2, keepdims=True) + 1e-6)
  for _ in range(iters - 1):
    t = t / (t.sum(-1, keepdims=True) + 1e-6)
    t = t / (t.sum(-2, keepdims=True) + 1e-6)
  return t


def np_mhc(p, x):
  """shared/specs/mhc.md, numpy float64; returns (output, M)."""
  B, S, G, D = x.shape
  sig = lambda z: 1 / (1 + np.exp(-z))
  h = np_rms(x.reshape(B, S, G * D), p["norm_scale"]) @ np.concatenate(
      [p["pre_alpha"], p["post_alpha"], p["res_alpha"]], -1)
  pre = sig(p["pre_alpha_scale"] * h[..., :G] + p["pre_beta"]) + 1e-6
  xin = np.einsum("bsk,bskd->bsd", pre, x)
  o = np_rms(xin, p["branch_norm_scale"]) @ p["branch_kernel"]
  post = 2 * sig(p["post_alpha_scale"] * h[..., G:2 * G] + p["post_beta"])
  M = np_sinkhorn(p["res_alpha_scale"] * h[..., 2 * G:].reshape(B, S, G, G) + p["res_beta"])
  return np.einsum("bskm,bskd->bsmd", M, x) + post[..., None] * o[:, :, None, :], M


def build_mhc(out, seed):
  p, x, cot = mhc_inputs(seed)
  with precision(True):
    output, mixing, d = mhc_reference(p, x, cot)
  with precision(False):
    output32, mixing32, d32 = mhc_reference(p, x, cot)
  out["mhc/x"] = x
  for k, v in p.items():
    out["mhc/" + k] = v
  out["mhc/output"] = output
  out["mhc/mixing"] = mixing
  out["mhc/cotangent"] = cot
  for k, v in d.items():
    assert v.shape == (x.shape if k == "d_x" else p[k[2:]].shape), (k, v.shape)
    out["mhc/" + k] = v
  out["mhc/rms_epsilon"] = np.array([RMS_EPS])

  # --- checks
  ref, M = np_mhc(p, x)
  err = max(np.max(np.abs(ref - output)), np.max(np.abs(M - mixing)))
  assert err < 1e-12, err
  check_doubly_stochastic("mhc/mixing", mixing, 1e-3)
  check_float32_agreement("mhc/", {"output": output, "mixing": mixing, **d},
                          {"output": output32, "mixing": mixing32, **d32})
  loss = lambda q: float(np.sum(np_mhc(q["p"], q["x"])[0] * cot))
  fd_err = finite_difference_check({"p": p, "x": x}, {"x": d["d_x"], **{k[2:]: v for k, v in d.items() if k != "d_x"}},
                                   loss, seed)
  print("mhc/ numpy spec forward max |diff| %.2e; finite-difference rel err %.1e" % (err, fd_err))


def build_sinkhorn(out, seed):
  rng = np.random.default_rng(seed)
  logits = rng.standard_normal((3, 4, 4)) * 3
  cot = rng.standard_normal((3, 4, 4))

  def run():
    f = lambda t: mhc.sinkhorn(t, 20)
    res = np.asarray(f(jnp.asarray(logits)))
    grad = np.asarray(jax.grad(lambda t: jnp.sum(f(t) * cot))(jnp.asarray(logits)))
    return res, grad

  with precision(True):
    res, grad = run()
  with precision(False):
    res32, grad32 = run()
  assert res.dtype == np.float64 and res32.dtype == np.float64
  out["sinkhorn/logits"] = logits
  out["sinkhorn/out"] = res
  out["sinkhorn/cotangent"] = cot
  out["sinkhorn/d_logits"] = grad
  err = np.max(np.abs(np_sinkhorn(logits) - res))
  assert err < 1e-13, err
  check_doubly_stochastic("sinkhorn/out", res, 1e-2)
  check_float32_agreement("sinkhorn/", {"out": res, "d_logits": grad}, {"out": res32, "d_logits": grad32})
  loss = lambda q: float(np.sum(np_sinkhorn(q["logits"]) * cot))
  fd_err = finite_difference_check({"logits": logits}, {"logits": grad}, loss, seed)
  print("sinkhorn/ numpy forward max |diff| %.2e; finite-difference rel err %.1e" % (err, fd_err))


# ----------------------------------------------------------------------------------------------------------------
# checks
def check_doubly_stochastic(name, m, row_tol):
  cols, rows = m.sum(-2), m.sum(-1)
  assert np.all(m > 0)
  assert np.max(np.abs(cols - 1)) < 2e-6, (name, cols)  # the last step normalises columns (denominator + 1e-6)
  assert np.max(np.abs(rows - 1)) < row_tol, (name, rows)  # rows drift: 20 iterations do not fully converge
  print("%s: column sums within %.1e of 1, row sums within %.1e" % (
      name, np.max(np.abs(cols - 1)), np.max(np.abs(rows - 1))))


def check_float32_agreement(prefix, exact, native):
  """The unpatched reference (float32 inside RMSNorm / sinkhorn / Embed) agrees to float32 accuracy."""
  worst = 0.0
  for k in exact:
    a, b = exact[k], native[k]
    rel = np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30)
    worst = max(worst, rel)
    assert rel < 1e-4, (prefix + k, rel)
  print("%s unpatched float32-internal reference agrees, worst relative diff %.1e" % (prefix, worst))


def finite_difference_check(values, grads, loss, seed, per_tensor=3, h=1e-5):
  """Central differences of the numpy spec loss at a few entries of each input/parameter vs. the JAX gradient."""
  rng = np.random.default_rng(seed + 1000)
  flat = {}
  for k, v in values.items():
    if isinstance(v, dict):
      flat.update({(k, kk): vv for kk, vv in v.items()})
    else:
      flat[(k,)] = v
  worst = 0.0
  for key, arr in flat.items():
    g = grads[key[-1]]
    scale = max(np.max(np.abs(g)), 1e-3)
    for _ in range(per_tensor):
      idx = tuple(int(rng.integers(0, n)) for n in arr.shape)

      def at(delta):
        q = {k: (dict(v) if isinstance(v, dict) else v) for k, v in values.items()}
        a = arr.copy()
        a[idx] += delta
        if len(key) == 2:
          q[key[0]][key[1]] = a
        else:
          q[key[0]] = a
        return loss(q)

      fd = (at(h) - at(-h)) / (2 * h)
      rel = abs(fd - g[idx]) / scale
      worst = max(worst, rel)
      assert rel < 1e-6, (key, idx, fd, g[idx])
  return worst


# ----------------------------------------------------------------------------------------------------------------
def build():
  out = {}
  build_hashing(out)
  build_engram(out, G=1, seed=101)
  build_engram(out, G=4, seed=104)
  build_mhc(out, seed=201)
  build_sinkhorn(out, seed=301)
  out["rms_epsilon"] = np.array([RMS_EPS])
  fixed = {}
  for k, v in out.items():
    v = np.ascontiguousarray(v)
    if v.dtype.kind == "f":
      v = v.astype("<f8")
    elif v.dtype == np.int32:
      v = v.astype("<i4")
    elif v.dtype == np.int64:
      v = v.astype("<i8")
    else:
      raise TypeError((k, v.dtype))
    fixed[k] = v
  return fixed


def write_safetensors(tensors, path, metadata):
  """safetensors by hand, for a byte-stable file: tensors sorted by name, 8-byte header length (little endian),
  JSON header padded with spaces to a multiple of 8, raw little-endian data without gaps."""
  dtypes = {"<f8": "F64", "<i8": "I64", "<i4": "I32"}
  header = {"__metadata__": metadata}
  offset, blobs = 0, []
  for name in sorted(tensors):
    v = tensors[name]
    data = v.tobytes(order="C")
    assert offset % v.dtype.itemsize == 0
    header[name] = {"dtype": dtypes[v.dtype.str], "shape": list(v.shape), "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * (-len(text) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for data in blobs:
      f.write(data)


def main():
  tensors = build()
  target = tempfile.mkdtemp(prefix="maxtext_golden_") if ARGS.check else ARGS.out
  os.makedirs(target, exist_ok=True)
  path = os.path.join(target, FIXTURE)
  write_safetensors(tensors, path, metadata={"producer": "tests/reference/maxtext_golden/make_maxtext_golden.py",
                                             "format": "maxtext golden v1"})
  back = load_file(path)  # the safetensors package reads it back identically
  assert sorted(back) == sorted(tensors) and all(
      back[k].dtype == v.dtype and np.array_equal(back[k], v) for k, v in tensors.items())
  size = os.path.getsize(path)
  assert size < 1 << 20, size
  print("wrote %s: %d tensors, %d bytes" % (path, len(tensors), size))
  if ARGS.check:
    committed = os.path.join(ARGS.out, FIXTURE)
    if not filecmp.cmp(path, committed, shallow=False):
      old = load_file(committed)
      for k in sorted(set(old) | set(tensors)):
        if k not in old or k not in tensors or old[k].dtype != tensors[k].dtype or not np.array_equal(old[k], tensors[k]):
          print("  differs: %s" % k)
      sys.exit("CHECK FAILED: %s differs from %s" % (path, committed))
    print("CHECK OK: bit-for-bit identical to %s" % committed)


if __name__ == "__main__":
  main()
