// The Engram keys of a config as the data path's hashing takes them.
#include "meshtrain/runtime/engram_inputs.h"

namespace meshtrain {

EngramHashOptions engram_hash_options(const Config& config) {
  return {config.engram_layers,
          config.engram_max_ngram_size,
          config.engram_num_heads,
          config.engram_vocab_bases,
          static_cast<uint64_t>(config.engram_seed),
          config.vocab_size};
}

}  // namespace meshtrain
