// Text generation on the CPU: an incremental decoder that runs one token at a time through the trained
// parameters of an Engine with a key/value cache, and the token sampler (temperature, top-k, top-p).
// Legend: T cache length (max_length), D width, H query heads, K kv heads, d head width, F MLP width,
// V vocab rows (padded), V_valid the tokenizer's vocabulary, P learned position rows (gpt2).
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/train/engine.h"

namespace meshtrain {

// Same arithmetic as the engine's forward pass (same kernels, same parameters), but for a single new token
// whose keys and values join a per-layer cache: feeding a sequence one token at a time gives the logits
// engine.eval would give at each position, up to float32 summation order.
// Reads the engine's parameters in place: the engine must outlive the decoder and not change under it.
class IncrementalDecoder {
 public:
  // Allocates every cache and scratch buffer once, for up to `max_length` tokens. For gpt2 `max_length` may
  // not exceed the learned position table (P rows): a MeshError says so.
  IncrementalDecoder(const Engine& engine, int64_t max_length);

  // Feeds one token at position length() and returns the logits of the next token [V_valid].
  // A token outside [0, V_valid) or a full cache is a MeshError.
  std::vector<float> step(int32_t token);
  // Forgets every fed token (the cache memory is kept).
  void reset() { length_ = 0; }
  int64_t length() const { return length_; }
  int64_t max_length() const { return max_length_; }

 private:
  // Pointers into the engine's arena; nullptr where the family has no such parameter.
  struct Layer {
    const float* attention_norm_scale = nullptr;  // [D]
    const float* attention_norm_bias = nullptr;   // [D] (gpt2)
    const float* query_kernel = nullptr;          // [D, H, d]
    const float* query_bias = nullptr;            // [H, d] (gpt2)
    const float* key_kernel = nullptr;            // [D, K, d]
    const float* key_bias = nullptr;              // [K, d] (gpt2)
    const float* value_kernel = nullptr;          // [D, K, d]
    const float* value_bias = nullptr;            // [K, d] (gpt2)
    const float* query_norm_scale = nullptr;      // [d] (qwen3)
    const float* key_norm_scale = nullptr;        // [d] (qwen3)
    const float* out_kernel = nullptr;            // [H, d, D]
    const float* out_bias = nullptr;              // [D] (gpt2)
    const float* mlp_norm_scale = nullptr;        // [D]
    const float* mlp_norm_bias = nullptr;         // [D] (gpt2)
    const float* mlp_in_kernel = nullptr;         // [D, F]: wi_0 (qwen3 gate) or wi (gpt2)
    const float* mlp_in_bias = nullptr;           // [F] (gpt2)
    const float* mlp_up_kernel = nullptr;         // [D, F]: wi_1 (qwen3)
    const float* mlp_out_kernel = nullptr;        // [F, D]
    const float* mlp_out_bias = nullptr;          // [D] (gpt2)
    std::vector<float> key_cache;                 // [T, K, d] after QK-norm and RoPE
    std::vector<float> value_cache;               // [T, K, d]
  };

  void norm(float* out, const float* x, const float* scale, const float* bias, int64_t rows, int64_t width);
  void attend(const Layer& layer);

  bool gpt2_ = false;
  int64_t D_ = 0, H_ = 0, K_ = 0, d_ = 0, F_ = 0, V_ = 0, V_valid_ = 0, P_ = 0;
  float epsilon_ = 0.0f, rope_theta_ = 0.0f;
  int64_t max_length_ = 0;
  int64_t length_ = 0;  // tokens fed so far = position of the next one

  const float* token_table_ = nullptr;       // [V, D]
  const float* position_table_ = nullptr;    // [P, D] (gpt2)
  const float* final_norm_scale_ = nullptr;  // [D]
  const float* final_norm_bias_ = nullptr;   // [D] (gpt2)
  const float* unembedding_ = nullptr;       // [V, D] tied table or [D, V] logits_dense kernel
  bool tied_ = true;
  std::vector<Layer> layers_;

  // Scratch for one token, sized once.
  std::vector<float> residual_;   // [D]
  std::vector<float> normed_;     // [D]
  std::vector<float> branch_;     // [D] output of a block before the residual add
  std::vector<float> query_;      // [H, d]
  std::vector<float> key_;        // [K, d]
  std::vector<float> value_;      // [K, d]
  std::vector<float> rotated_;    // [max(H, K), d] QK-norm output (the kernel is not run in place)
  std::vector<float> attended_;   // [H, d]
  std::vector<float> scores_;     // [T] one query head's scores, then probabilities
  std::vector<float> gate_;       // [F]
  std::vector<float> up_;         // [F]
  std::vector<float> activated_;  // [F]
  std::vector<float> mean_;       // [max(H, K, 1)] layernorm means (unused by RMSNorm)
  std::vector<float> rstd_;       // [max(H, K, 1)]
  std::vector<float> logits_;     // [V]
};

struct SamplingOptions {
  double temperature = 0.8;  // 0: greedy (argmax)
  int64_t top_k = 0;         // keep the k most likely tokens; 0: off
  double top_p = 1.0;        // keep the smallest most-likely set holding at least this probability; 1: off
};

// Picks the next token from `logits` [V_valid]: divide by the temperature, keep the top-k, then the top-p
// nucleus of the renormalised softmax, and draw with the Philox stream (seed, "sampling") at counter `step`,
// so (seed, step) fixes the choice. Ties are broken towards the lower id; -inf logits (padding) are never
// chosen. On return `logits` holds the probabilities the token was drawn from (0 outside the kept set;
// one-hot for greedy). Options out of range, or no finite logit, are a MeshError.
int32_t sample_token(std::vector<float>& logits, const SamplingOptions& options, uint64_t seed,
                     uint64_t step);

}  // namespace meshtrain
