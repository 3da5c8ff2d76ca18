// Incremental decoding with a key/value cache and the token sampler (see decoder.h).
#include "meshtrain/infer/decoder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <string>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/cpu/cross_entropy.h"
#include "meshtrain/kernels/cpu/embedding.h"
#include "meshtrain/kernels/cpu/gelu.h"
#include "meshtrain/kernels/cpu/layernorm.h"
#include "meshtrain/kernels/cpu/matmul.h"
#include "meshtrain/kernels/cpu/residual.h"
#include "meshtrain/kernels/cpu/rmsnorm.h"
#include "meshtrain/kernels/cpu/rope.h"
#include "meshtrain/kernels/cpu/swiglu.h"

namespace meshtrain {
namespace {

size_t size_of(int64_t count) {
  return static_cast<size_t>(count);
}

// Parameter lookup by checkpoint name. The names come from our own model families, so a missing one is a
// bug here (or a family this decoder does not know yet), not a user error.
class Parameters {
 public:
  explicit Parameters(const Engine& engine) : engine_(engine) {
    const ModelSpec& spec = engine.spec();
    for (const ParameterDecl& parameter : spec.parameters)
      ids_[spec.buffer(parameter.value).name] = parameter.value;
  }
  const float* get(const std::string& name, std::initializer_list<int64_t> dims) const {
    const auto found = ids_.find(name);
    MT_CHECK(found != ids_.end(), "the decoder reads a parameter the model spec does not declare: " + name);
    const TensorView view = engine_.view(found->second);
    MT_CHECK(view.shape.dims == std::vector<int64_t>(dims), name + " has shape " + view.shape.to_string());
    return view.f32();
  }
  const float* optional(const std::string& name, std::initializer_list<int64_t> dims) const {
    return ids_.contains(name) ? get(name, dims) : nullptr;
  }

 private:
  const Engine& engine_;
  std::map<std::string, BufferId> ids_;
};

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Engine& engine, int64_t max_length) : max_length_(max_length) {
  const ModelSpec& spec = engine.spec();
  const ModelDims& m = spec.dims;
  const Config& config = spec.config;
  if (config.decoder_block != "qwen3" && config.decoder_block != "gpt2") {
    fail("config key 'decoder_block'", "qwen3 or gpt2 for generation", "'" + config.decoder_block + "'");
  }
  gpt2_ = config.decoder_block == "gpt2";
  D_ = m.D, H_ = m.H, K_ = m.K, d_ = m.d, F_ = m.F, V_ = m.V, V_valid_ = m.V_valid, P_ = m.P;
  epsilon_ = static_cast<float>(config.normalization_layer_epsilon);
  rope_theta_ = static_cast<float>(config.rope_max_timescale);
  if (max_length < 1) {
    fail("decoder max_length", "at least 1 token", std::to_string(max_length),
         "the prompt plus the new tokens to generate");
  }
  if (gpt2_ && max_length > P_) {
    fail("decoder max_length", "at most max_position_embeddings (" + std::to_string(P_) + ") for gpt2",
         std::to_string(max_length),
         "learned positions end there: shorten the prompt or generate fewer new tokens");
  }

  const Parameters parameters(engine);
  token_table_ = parameters.get("token_embedder/embedding", {V_, D_});
  if (gpt2_) position_table_ = parameters.get("position_embedder/embedding", {P_, D_});
  final_norm_scale_ = parameters.get("decoder/decoder_norm/scale", {D_});
  if (gpt2_) final_norm_bias_ = parameters.get("decoder/decoder_norm/bias", {D_});
  tied_ = config.logits_via_embedding;
  unembedding_ = tied_ ? token_table_ : parameters.get("decoder/logits_dense/kernel", {D_, V_});

  layers_.resize(size_of(m.L));
  for (int64_t index = 0; index < m.L; ++index) {
    Layer& layer = layers_[size_of(index)];
    const std::string prefix = "decoder/layers_" + std::to_string(index);
    const std::string attention = prefix + "/self_attention";
    const std::string mlp = prefix + "/mlp";
    // Biases exist exactly for gpt2; `optional` keeps the lookups uniform across families.
    layer.attention_norm_scale = parameters.get(prefix + "/pre_self_attention_layer_norm/scale", {D_});
    layer.attention_norm_bias = parameters.optional(prefix + "/pre_self_attention_layer_norm/bias", {D_});
    layer.query_kernel = parameters.get(attention + "/query/kernel", {D_, H_, d_});
    layer.query_bias = parameters.optional(attention + "/query/bias", {H_, d_});
    layer.key_kernel = parameters.get(attention + "/key/kernel", {D_, K_, d_});
    layer.key_bias = parameters.optional(attention + "/key/bias", {K_, d_});
    layer.value_kernel = parameters.get(attention + "/value/kernel", {D_, K_, d_});
    layer.value_bias = parameters.optional(attention + "/value/bias", {K_, d_});
    if (!gpt2_) {
      layer.query_norm_scale = parameters.get(attention + "/query_norm/scale", {d_});
      layer.key_norm_scale = parameters.get(attention + "/key_norm/scale", {d_});
    }
    layer.out_kernel = parameters.get(attention + "/out/kernel", {H_, d_, D_});
    layer.out_bias = parameters.optional(attention + "/out/bias", {D_});
    layer.mlp_norm_scale = parameters.get(prefix + "/post_self_attention_layer_norm/scale", {D_});
    layer.mlp_norm_bias = parameters.optional(prefix + "/post_self_attention_layer_norm/bias", {D_});
    if (gpt2_) {
      layer.mlp_in_kernel = parameters.get(mlp + "/wi/kernel", {D_, F_});
      layer.mlp_in_bias = parameters.get(mlp + "/wi/bias", {F_});
    } else {
      layer.mlp_in_kernel = parameters.get(mlp + "/wi_0/kernel", {D_, F_});
      layer.mlp_up_kernel = parameters.get(mlp + "/wi_1/kernel", {D_, F_});
    }
    layer.mlp_out_kernel = parameters.get(mlp + "/wo/kernel", {F_, D_});
    layer.mlp_out_bias = parameters.optional(mlp + "/wo/bias", {D_});
    layer.key_cache.resize(size_of(max_length * K_ * d_));
    layer.value_cache.resize(size_of(max_length * K_ * d_));
  }

  const int64_t rows = std::max<int64_t>({H_, K_, 1});
  residual_.resize(size_of(D_));
  normed_.resize(size_of(D_));
  branch_.resize(size_of(D_));
  query_.resize(size_of(H_ * d_));
  key_.resize(size_of(K_ * d_));
  value_.resize(size_of(K_ * d_));
  rotated_.resize(size_of(rows * d_));
  attended_.resize(size_of(H_ * d_));
  scores_.resize(size_of(max_length));
  gate_.resize(size_of(F_));
  up_.resize(size_of(F_));
  activated_.resize(size_of(F_));
  mean_.resize(size_of(rows));
  rstd_.resize(size_of(rows));
  logits_.resize(size_of(V_));
}

// RMSNorm (qwen3) or LayerNorm (gpt2, which has a bias) of `rows` rows of `width`; out must not alias x.
void IncrementalDecoder::norm(float* out, const float* x, const float* scale, const float* bias, int64_t rows,
                              int64_t width) {
  if (bias == nullptr) {
    kernels::rmsnorm_forward(out, rstd_.data(), x, scale, rows, width, epsilon_);
  } else {
    kernels::layernorm_forward(out, mean_.data(), rstd_.data(), x, scale, bias, rows, width, epsilon_);
  }
}

// Single-query causal attention of query_ over cache rows [0, length_]: query head h reads kv head
// h / (H / K), scores scaled by 1/sqrt(d), softmax shifted by its maximum so exp never overflows.
void IncrementalDecoder::attend(const Layer& layer) {
  const int64_t group = H_ / K_, visible = length_ + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_));
  for (int64_t h = 0; h < H_; ++h) {
    const float* q = query_.data() + h * d_;
    const int64_t g = h / group;
    float maximum = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < visible; ++j) {
      const float* k = layer.key_cache.data() + (j * K_ + g) * d_;
      float dot = 0.0f;
      for (int64_t c = 0; c < d_; ++c) dot += q[c] * k[c];
      scores_[size_of(j)] = scale * dot;
      maximum = std::max(maximum, scores_[size_of(j)]);
    }
    float* out = attended_.data() + h * d_;
    std::fill(out, out + d_, 0.0f);
    float sum = 0.0f;
    for (int64_t j = 0; j < visible; ++j) {
      const float p = std::exp(scores_[size_of(j)] - maximum);
      sum += p;
      const float* v = layer.value_cache.data() + (j * K_ + g) * d_;
      for (int64_t c = 0; c < d_; ++c) out[c] += p * v[c];
    }
    for (int64_t c = 0; c < d_; ++c) out[c] /= sum;
  }
}

std::vector<float> IncrementalDecoder::step(int32_t token) {
  if (token < 0 || token >= V_valid_) {
    fail("token id fed to the decoder", "an id in [0, " + std::to_string(V_valid_) + ") (vocab_size)",
         std::to_string(token), "the tokenizer must be the one the checkpoint was trained with");
  }
  if (length_ >= max_length_) {
    fail("decoder cache", "at most " + std::to_string(max_length_) + " tokens (its max_length)",
         "token number " + std::to_string(length_ + 1),
         gpt2_ && max_length_ == P_ ? "gpt2's learned positions end at max_position_embeddings"
                                    : "create the decoder with a larger max_length, or reset() it");
  }
  const int32_t position = static_cast<int32_t>(length_);
  kernels::embedding_forward(residual_.data(), &token, token_table_, 1, V_, D_, false);
  if (gpt2_) kernels::embedding_forward(residual_.data(), &position, position_table_, 1, P_, D_, true);

  for (Layer& layer : layers_) {
    // Attention block: pre-norm, projections, QK-norm and RoPE, cache append, attention, out projection.
    norm(normed_.data(), residual_.data(), layer.attention_norm_scale, layer.attention_norm_bias, 1, D_);
    kernels::matmul_forward(query_.data(), normed_.data(), layer.query_kernel, layer.query_bias, 1, D_,
                            H_ * d_);
    kernels::matmul_forward(key_.data(), normed_.data(), layer.key_kernel, layer.key_bias, 1, D_, K_ * d_);
    kernels::matmul_forward(value_.data(), normed_.data(), layer.value_kernel, layer.value_bias, 1, D_,
                            K_ * d_);
    float* key_slot = layer.key_cache.data() + length_ * K_ * d_;
    float* value_slot = layer.value_cache.data() + length_ * K_ * d_;
    std::copy(value_.begin(), value_.end(), value_slot);
    if (gpt2_) {
      std::copy(key_.begin(), key_.end(), key_slot);
    } else {
      // Heads are the rows of the per-head norm, as in the engine (N * H rows of width d).
      norm(rotated_.data(), query_.data(), layer.query_norm_scale, nullptr, H_, d_);
      kernels::rope_forward(query_.data(), rotated_.data(), &position, 1, H_, d_, rope_theta_);
      norm(rotated_.data(), key_.data(), layer.key_norm_scale, nullptr, K_, d_);
      kernels::rope_forward(key_slot, rotated_.data(), &position, 1, K_, d_, rope_theta_);
    }
    attend(layer);
    kernels::matmul_forward(branch_.data(), attended_.data(), layer.out_kernel, layer.out_bias, 1, H_ * d_,
                            D_);
    kernels::residual_add(residual_.data(), branch_.data(), D_);

    // MLP block: pre-norm, SwiGLU (qwen3) or GELU (gpt2), down projection.
    norm(normed_.data(), residual_.data(), layer.mlp_norm_scale, layer.mlp_norm_bias, 1, D_);
    kernels::matmul_forward(gate_.data(), normed_.data(), layer.mlp_in_kernel, layer.mlp_in_bias, 1, D_, F_);
    if (gpt2_) {
      kernels::gelu_forward(activated_.data(), gate_.data(), F_);
    } else {
      kernels::matmul_forward(up_.data(), normed_.data(), layer.mlp_up_kernel, nullptr, 1, D_, F_);
      kernels::swiglu_forward(activated_.data(), gate_.data(), up_.data(), F_);
    }
    kernels::matmul_forward(branch_.data(), activated_.data(), layer.mlp_out_kernel, layer.mlp_out_bias, 1,
                            F_, D_);
    kernels::residual_add(residual_.data(), branch_.data(), D_);
  }
  ++length_;

  norm(normed_.data(), residual_.data(), final_norm_scale_, final_norm_bias_, 1, D_);
  kernels::unembed_logits(logits_.data(), normed_.data(), unembedding_,
                          tied_ ? kernels::UnembedLayout::table_VD : kernels::UnembedLayout::kernel_DV, 1, D_,
                          V_, V_valid_);
  return std::vector<float>(logits_.begin(), logits_.begin() + V_valid_);
}

int32_t sample_token(std::vector<float>& logits, const SamplingOptions& options, uint64_t seed,
                     uint64_t step) {
  if (!(options.temperature >= 0.0) || !std::isfinite(options.temperature)) {
    fail("--temperature", "a finite number >= 0 (0: greedy)", to_text(options.temperature));
  }
  if (options.top_k < 0) fail("--top-k", "an integer >= 0 (0: off)", std::to_string(options.top_k));
  if (!(options.top_p > 0.0 && options.top_p <= 1.0)) {
    fail("--top-p", "a number in (0, 1] (1: off)", to_text(options.top_p));
  }
  // Candidates: finite logits only, so padding (-inf) and a broken model's NaNs are never drawn.
  std::vector<int32_t> candidates;
  candidates.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) candidates.push_back(static_cast<int32_t>(i));
  }
  if (candidates.empty()) {
    fail("next-token logits", "at least one finite value", "none (all -inf or NaN)",
         "the checkpoint's parameters may hold NaN or Inf");
  }
  // Most likely first, ties towards the lower id: a total order, so the result never depends on the sort.
  const auto more_likely = [&](int32_t a, int32_t b) {
    const float la = logits[size_of(a)], lb = logits[size_of(b)];
    return la != lb ? la > lb : a < b;
  };
  const auto finish = [&](const std::vector<double>& probabilities, size_t kept, int32_t chosen) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    for (size_t i = 0; i < kept; ++i) logits[size_of(candidates[i])] = static_cast<float>(probabilities[i]);
    return chosen;
  };

  if (options.temperature == 0.0) {
    const int32_t best = *std::min_element(candidates.begin(), candidates.end(), more_likely);
    candidates = {best};
    return finish({1.0}, 1, best);
  }
  size_t kept = candidates.size();
  if (options.top_k > 0 && size_of(options.top_k) < kept) {
    kept = size_of(options.top_k);
    std::partial_sort(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(kept),
                      candidates.end(), more_likely);
  } else if (options.top_p < 1.0) {
    std::sort(candidates.begin(), candidates.end(), more_likely);
  }
  // Softmax of logits / T over the kept set, in double; shifted by the maximum so exp cannot overflow.
  float maximum = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < kept; ++i) maximum = std::max(maximum, logits[size_of(candidates[i])]);
  std::vector<double> probabilities(kept);
  double total = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    probabilities[i] =
        std::exp((static_cast<double>(logits[size_of(candidates[i])]) - maximum) / options.temperature);
    total += probabilities[i];
  }
  for (double& p : probabilities) p /= total;
  if (options.top_p < 1.0) {
    // Candidates are sorted here (top-k sorted its prefix, top-p sorted all): keep the shortest prefix whose
    // mass reaches top_p, then renormalise.
    double mass = 0.0;
    size_t nucleus = 0;
    while (nucleus < kept && mass < options.top_p) mass += probabilities[nucleus++];
    kept = nucleus;
    probabilities.resize(kept);
    for (double& p : probabilities) p /= mass;
  }
  const double draw = uniform_at(philox_key(seed, "sampling"), step);
  double cumulative = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    cumulative += probabilities[i];
    if (draw < cumulative) return finish(probabilities, kept, candidates[i]);
  }
  // Rounding left the cumulative sum just below the draw: it fell on the last token of nonzero probability.
  size_t last = kept - 1;
  while (last > 0 && probabilities[last] == 0.0) --last;
  return finish(probabilities, kept, candidates[last]);
}

}  // namespace meshtrain
