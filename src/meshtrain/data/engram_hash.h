// Engram's n-gram hash ids (shared/specs/engram.md sections 2 and 7): the prime table sizes of every Engram
// layer, order and head, each layer's odd multipliers, and the hash ids of rows of compressed token ids.
// The ids are hashed in natural (time) order, before any context-parallel reorder permutes a row, and then
// travel with the row like any other per-token field: array neighbours here are always time neighbours.
// Legend: B rows, S sequence, N max n-gram size (orders 2..N hashed), H heads per order, Vc compressed
// vocabulary size.
#pragma once

#include <cstdint>
#include <vector>

namespace meshtrain {

// The table size of every (layer, order, head), [layers][N - 1][H]: primes drawn from one `seen` set across
// all Engram layers (in engram_layers order), then orders 2..N, then heads. Each order starts at its
// vocab base - 1 (vocab_bases has N - 1 entries, order 2 first); each head takes the smallest prime above
// the start that is not yet seen, and that prime becomes the start.
std::vector<std::vector<std::vector<int64_t>>> engram_table_sizes(int64_t layers, int64_t max_ngram,
                                                                  int64_t heads,
                                                                  const std::vector<int64_t>& vocab_bases);

// Whether n is prime (deterministic; n < 2^62).
bool is_prime(int64_t n);

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

}  // namespace meshtrain
