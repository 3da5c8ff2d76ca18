// Engram's n-gram hash ids (shared/specs/engram.md sections 2 and 7): the prime table sizes of every Engram
// layer, order and head, each layer's odd multipliers, and the hash ids of rows of compressed token ids.
// The ids are hashed in natural (time) order, before any context-parallel reorder permutes a row, and then
// travel with the row like any other per-token field: array neighbours here are always time neighbours.
// Legend: B rows, S sequence, N max n-gram size (orders 2..N hashed), H heads per order, Vc compressed
// vocabulary size.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/core/engram_tables.h"
#include "meshtrain/data/batch.h"
#include "meshtrain/data/tokenizer/compressed_tokenizer.h"

namespace meshtrain {

// Layer `layer_id`'s N odd multipliers m_0..m_{N-1}, each below (2^63 - 1) / Vc, so x m fits int64 for every
// compressed id x < Vc (DeepSeek's 64-bit bound). m_j = 2 r_j + 1 with r_j uniform in [0, half), half =
// max(1, floor((2^63 - 1) / Vc) / 2): r_j is a 64-bit draw of the Philox stream "engram/multipliers" keyed
// by seed + 10007 layer_id (draw j from elements 2j and 2j + 1), reduced modulo `half` (a bias below
// 2^-18 for any Vc >= 2). Stored in checkpoints, so a load never regenerates them.
std::vector<int64_t> engram_multipliers(uint64_t seed, int64_t layer_id, int64_t max_ngram,
                                        int64_t compressed_vocab);

// The hash ids of one Engram layer, out[b, s, (n - 2) H + j] for order n and head j:
//   h_2 = (x_s m_0) XOR (x_{s-1} m_1),  h_n = h_{n-1} XOR (x_{s-n+1} m_{n-1}),  out = h_n mod p[n-2][j]
// (non-negative), x_t = pad_id for t < 0 (the row's start). `multipliers` has N entries, `table_sizes` is
// this layer's [N - 1][H] (each below 2^31).
void engram_hash_ids(int32_t* out,               // [B, S, H (N - 1)]
                     const int32_t* compressed,  // [B, S] compressed token ids in natural order
                     int64_t B, int64_t S, const std::vector<int64_t>& multipliers,
                     const std::vector<std::vector<int64_t>>& table_sizes, int32_t pad_id);

// What a run needs to hash its batches, per Engram layer in engram_layers order. Built from the config and
// the run's tokenizer, and stored in checkpoints with the parameters (checkpoint/checkpoint.h), so a load
// uses the checkpoint's multipliers and tables and never depends on regenerating them.
struct EngramHashing {
  std::vector<int64_t> layers;                                 // global layer indices (engram_layers)
  CompressedVocabulary compressed;                             // [V] -> [0, Vc)
  int32_t pad_id = 0;                                          // compressed id before a row's start
  std::vector<std::vector<int64_t>> multipliers;               // [layers][N]
  std::vector<std::vector<std::vector<int64_t>>> table_sizes;  // [layers][N - 1][H]

  int64_t heads_per_token() const;  // H (N - 1): hash ids of one token in one layer
  // Sets rows.engram_hash_ids from rows.tokens ([B, S] rows in natural order): [layers][B, S, H (N - 1)].
  void add_to(Batch& rows, int64_t S) const;
  // One layer's ids for the last token of `history` (compressed ids, oldest first, the last the current
  // token; fewer than N - 1 before it read pad_id): [H (N - 1)]. Incremental decoding's hash.
  std::vector<int32_t> last_token_ids(size_t layer, const std::vector<int32_t>& history) const;
};

// The Engram keys the hashing follows (engram_layers, engram_max_ngram_size, engram_num_heads,
// engram_vocab_bases, engram_seed) and the model's vocab_size.
struct EngramHashOptions {
  std::vector<int64_t> layers;
  int64_t max_ngram = 3, heads = 8;
  std::vector<int64_t> vocab_bases;
  uint64_t seed = 0;
  int64_t vocab_size = 0;
};

// Tables and multipliers from the options, and the run's tokenizer: its compressed vocabulary, and pad_id
// the compressed id of its end-of-text token (id 0 without one). Without a tokenizer (synthetic data) the
// compressed vocabulary is the identity over vocab_size and pad_id 0.
EngramHashing make_engram_hashing(const EngramHashOptions& options, const Tokenizer* tokenizer);

}  // namespace meshtrain
