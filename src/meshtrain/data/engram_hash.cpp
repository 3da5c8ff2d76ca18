#include "meshtrain/data/engram_hash.h"

#include <algorithm>
#include <limits>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"

namespace meshtrain {

std::vector<int64_t> engram_multipliers(uint64_t seed, int64_t layer_id, int64_t max_ngram,
                                        int64_t compressed_vocab) {
  MT_CHECK(compressed_vocab >= 1, "Engram multipliers: a compressed vocabulary of at least one id");
  const int64_t bound = std::numeric_limits<int64_t>::max() / compressed_vocab;  // every m below it
  const auto half = static_cast<uint64_t>(std::max<int64_t>(1, bound / 2));
  const PhiloxKey key = philox_key(seed + 10007ull * static_cast<uint64_t>(layer_id), "engram/multipliers");
  std::vector<int64_t> multipliers;
  for (int64_t j = 0; j < max_ngram; ++j) {
    const uint64_t draw = (static_cast<uint64_t>(uint32_at(key, 2 * static_cast<uint64_t>(j))) << 32) |
                          uint32_at(key, 2 * static_cast<uint64_t>(j) + 1);
    multipliers.push_back(static_cast<int64_t>(2 * (draw % half) + 1));
  }
  return multipliers;
}

void engram_hash_ids(int32_t* out, const int32_t* compressed, int64_t B, int64_t S,
                     const std::vector<int64_t>& multipliers,
                     const std::vector<std::vector<int64_t>>& table_sizes, int32_t pad_id) {
  const auto N = static_cast<int64_t>(multipliers.size());
  MT_CHECK(N >= 2 && static_cast<int64_t>(table_sizes.size()) == N - 1, "one table-size row per order 2..N");
  const auto H = static_cast<int64_t>(table_sizes.front().size());
  for (const std::vector<int64_t>& order : table_sizes) {
    MT_CHECK(static_cast<int64_t>(order.size()) == H, "the same heads for every order");
    for (int64_t p : order)
      MT_CHECK(p >= 1 && p <= std::numeric_limits<int32_t>::max(), "table size fits int32");
  }
  // Products wrap as two's complement would in the references (numpy int64): an id that is out of range
  // cannot overflow UB here.
  const auto product = [&](int32_t x, int64_t j) {
    return static_cast<int64_t>(static_cast<uint64_t>(static_cast<int64_t>(x)) *
                                static_cast<uint64_t>(multipliers[static_cast<size_t>(j)]));
  };
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = compressed + b * S;
    for (int64_t s = 0; s < S; ++s) {
      const auto token = [&](int64_t back) { return s - back >= 0 ? row[s - back] : pad_id; };
      int32_t* ids = out + (b * S + s) * H * (N - 1);
      int64_t hash = product(token(0), 0);
      for (int64_t n = 2; n <= N; ++n) {
        hash ^= product(token(n - 1), n - 1);
        for (int64_t head = 0; head < H; ++head) {
          const int64_t p = table_sizes[static_cast<size_t>(n - 2)][static_cast<size_t>(head)];
          const int64_t remainder = ((hash % p) + p) % p;
          ids[(n - 2) * H + head] = static_cast<int32_t>(remainder);
        }
      }
    }
  }
}

int64_t EngramHashing::heads_per_token() const {
  if (table_sizes.empty()) return 0;
  return static_cast<int64_t>(table_sizes.front().size() * table_sizes.front().front().size());
}

void EngramHashing::add_to(Batch& rows, int64_t S) const {
  const auto cells = static_cast<int64_t>(rows.tokens.size());
  MT_CHECK(S > 0 && cells % S == 0, "Engram hashing: rows of S tokens");
  const int64_t B = cells / S;
  std::vector<int32_t> compressed_ids(rows.tokens.size());  // [B, S]
  for (size_t i = 0; i < rows.tokens.size(); ++i) compressed_ids[i] = compressed(rows.tokens[i]);
  rows.engram_hash_ids.assign(layers.size(), {});
  for (size_t layer = 0; layer < layers.size(); ++layer) {
    std::vector<int32_t>& ids = rows.engram_hash_ids[layer];
    ids.resize(static_cast<size_t>(cells * heads_per_token()));  // [B, S, H (N - 1)]
    engram_hash_ids(ids.data(), compressed_ids.data(), B, S, multipliers[layer], table_sizes[layer], pad_id);
  }
}

std::vector<int32_t> EngramHashing::last_token_ids(size_t layer, const std::vector<int32_t>& history) const {
  MT_CHECK(!history.empty(), "Engram hashing: a current token");
  const size_t N = multipliers[layer].size();
  // The last N tokens (pad_id before the start) as one row; its last token's ids are the answer.
  std::vector<int32_t> window(N, pad_id);
  const size_t kept = std::min(N, history.size());
  std::copy(history.end() - static_cast<std::ptrdiff_t>(kept), history.end(),
            window.end() - static_cast<std::ptrdiff_t>(kept));
  std::vector<int32_t> ids(N * static_cast<size_t>(heads_per_token()));
  engram_hash_ids(ids.data(), window.data(), 1, static_cast<int64_t>(N), multipliers[layer],
                  table_sizes[layer], pad_id);
  return {ids.end() - heads_per_token(), ids.end()};
}

EngramHashing make_engram_hashing(const EngramHashOptions& options, const Tokenizer* tokenizer) {
  EngramHashing hashing;
  hashing.layers = options.layers;
  if (tokenizer != nullptr) {
    hashing.compressed = compress_vocabulary(*tokenizer);
    hashing.pad_id = hashing.compressed(tokenizer->eos_id().value_or(0));
  } else {
    hashing.compressed.size = options.vocab_size;
    hashing.compressed.compress.resize(static_cast<size_t>(options.vocab_size));
    for (int32_t id = 0; id < static_cast<int32_t>(options.vocab_size); ++id)
      hashing.compressed.compress[id] = id;
  }
  hashing.table_sizes = engram_table_sizes(static_cast<int64_t>(options.layers.size()), options.max_ngram,
                                           options.heads, options.vocab_bases);
  for (int64_t layer : options.layers) {
    hashing.multipliers.push_back(
        engram_multipliers(options.seed, layer, options.max_ngram, hashing.compressed.size));
  }
  return hashing;
}

}  // namespace meshtrain
