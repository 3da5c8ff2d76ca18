// The table sizes of Engram's hashed n-gram memory (shared/specs/engram.md section 2): pure arithmetic on
// the Engram config keys, shared by the config's checks, the data path's hashing (data/engram_hash.h) and
// the model's tables (model/layers/engram.h), which may not look at one another.
// Legend: N max n-gram size (orders 2..N hashed), H heads per order.
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

}  // namespace meshtrain
