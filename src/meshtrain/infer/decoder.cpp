// Incremental decoding over the planned decode program, and the token sampler (see decoder.h).
#include "meshtrain/infer/decoder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/model/families.h"
#include "meshtrain/plan/decode.h"
#include "meshtrain/runtime/engram_inputs.h"

namespace meshtrain {
namespace {

size_t size_of(int64_t count) {
  return static_cast<size_t>(count);
}

bool learned_positions(const Config& config) {
  return family_of(config).positions == PositionKind::learned;
}

// The decode plan, once the decoder's own limits hold.
TrainingPlan checked_decode_plan(const Config& config, int64_t max_length) {
  if (max_length < 1) {
    fail("decoder max_length", "at least 1 token", std::to_string(max_length),
         "the prompt plus the new tokens to generate");
  }
  TrainingPlan plan = plan_decode(config, max_length);
  const int64_t P = plan.spec.dims.P;
  if (learned_positions(config) && max_length > P) {
    fail("decoder max_length", "at most max_position_embeddings (" + std::to_string(P) + ") for gpt2",
         std::to_string(max_length),
         "learned positions end there: shorten the prompt or generate fewer new tokens");
  }
  return plan;
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Config& config, int64_t max_length, const Tokenizer* tokenizer)
    : engine_(checked_decode_plan(config, max_length)), max_length_(max_length) {
  if (!config.engram_layers.empty())
    engram_hashing_ = make_engram_hashing(engram_hash_options(config), tokenizer);
}

std::vector<float> IncrementalDecoder::step(int32_t token) {
  const ModelDims& m = engine_.spec().dims;
  if (token < 0 || token >= m.V_valid) {
    fail("token id fed to the decoder", "an id in [0, " + std::to_string(m.V_valid) + ") (vocab_size)",
         std::to_string(token), "the tokenizer must be the one the checkpoint was trained with");
  }
  if (length_ >= max_length_) {
    fail("decoder cache", "at most " + std::to_string(max_length_) + " tokens (its max_length)",
         "token number " + std::to_string(length_ + 1),
         learned_positions(engine_.spec().config) && max_length_ == m.P
             ? "gpt2's learned positions end at max_position_embeddings"
             : "create the decoder with a larger max_length, or reset() it");
  }
  // Engram: this token's hash ids from the compressed ids before it (pad_id before the sequence's start).
  std::vector<std::vector<int32_t>> hash_ids;
  if (engram_hashing_) {
    const size_t window = engram_hashing_->multipliers.front().size();  // N
    compressed_history_.push_back(engram_hashing_->compressed(token));
    if (compressed_history_.size() > window) compressed_history_.erase(compressed_history_.begin());
    for (size_t layer = 0; layer < engram_hashing_->layers.size(); ++layer)
      hash_ids.push_back(engram_hashing_->last_token_ids(layer, compressed_history_));
  }
  const float* logits = engine_.decode(token, static_cast<int32_t>(length_), hash_ids).f32();
  ++length_;
  return std::vector<float>(logits, logits + m.V_valid);
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
