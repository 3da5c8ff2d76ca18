// Text generation on the CPU: an incremental decoder that steps the model's planned decode program (the
// same layers as training, attention through key / value caches; plan/decode.h) one token at a time, and
// the token sampler (temperature, top-k, top-p).
// Legend: T cache length (max_length), V vocab rows (padded), V_valid the tokenizer's vocabulary,
// P learned position rows (gpt2).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "meshtrain/data/engram_hash.h"
#include "meshtrain/data/tokenizer/tokenizer.h"
#include "meshtrain/runtime/engine.h"

namespace meshtrain {

// Feeding a sequence one token at a time gives the logits engine.eval would give at each position, up to
// float32 summation order: the ops are the layers' own, declared at one token. The decode plan's arena holds
// the parameter values, the caches and scratch: no gradient or optimizer state.
class IncrementalDecoder {
 public:
  // Plans and allocates the decode program of `config` for up to `max_length` tokens; its parameters start
  // from the config's init (load a checkpoint into engine(), or copy into parameters()). For gpt2
  // `max_length` may not exceed the learned position table (P rows): a MeshError says so. A model with
  // Engram hashes each fed token with the compressed vocabulary of `tokenizer` (none: the identity, as
  // training on synthetic data) and the config's multipliers, until a checkpoint's replace them
  // (engram_hashing(): pass it to load_checkpoint).
  IncrementalDecoder(const Config& config, int64_t max_length, const Tokenizer* tokenizer = nullptr);

  // Feeds one token at position length() and returns the logits of the next token [V_valid].
  // A token outside [0, V_valid) or a full cache is a MeshError.
  std::vector<float> step(int32_t token);
  // Forgets every fed token (the cache memory is kept; Engram's ShortConv history restarts at position 0).
  void reset() {
    length_ = 0;
    compressed_history_.clear();
  }
  int64_t length() const { return length_; }
  int64_t max_length() const { return max_length_; }
  Engine& engine() { return engine_; }
  ParameterStore& parameters() { return engine_.parameters(); }
  // null without Engram layers.
  EngramHashing* engram_hashing() { return engram_hashing_ ? &*engram_hashing_ : nullptr; }

 private:
  Engine engine_;  // runs the decode plan
  int64_t max_length_ = 0;
  int64_t length_ = 0;  // tokens fed so far = position of the next one
  // Engram: each fed token's n-gram hash ids need the N - 1 compressed ids before it, kept here (the
  // ShortConv keeps its last (K - 1) N inputs in the decode program's caches).
  std::optional<EngramHashing> engram_hashing_;
  std::vector<int32_t> compressed_history_;  // at most N, oldest first, the last one the newest token
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
