// A small training batch for whole-model tests: two packed documents per row (positions restart and the
// segment id changes where the second starts), every fifth target masked out, ids drawn below the
// tokenizer vocabulary (the padded rows are never targets).
#pragma once

#include <cstdint>
#include <random>

#include "meshtrain/config/config.h"
#include "meshtrain/data/batch.h"
#include "meshtrain/data/engram_hash.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/runtime/engram_inputs.h"

namespace meshtrain::testing {

inline Batch tiny_batch(const ModelDims& m, uint64_t seed) {
  std::mt19937 generator(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(m.V_valid - 1));
  Batch batch;
  for (int64_t b = 0; b < m.B; ++b) {
    const int64_t split = m.S / 2 + b;  // second document starts here
    for (int64_t s = 0; s < m.S; ++s) {
      batch.tokens.push_back(token(generator));
      batch.targets.push_back(token(generator));
      batch.positions.push_back(static_cast<int32_t>(s < split ? s : s - split));
      batch.segment_ids.push_back(s < split ? 0 : 1);
      batch.loss_mask.push_back(s % 5 == 3 ? 0 : 1);
    }
  }
  return batch;
}

// tiny_batch with Engram's hash ids for a model that has Engram layers.
inline Batch tiny_batch_for(const Config& config, const ModelDims& m, uint64_t seed) {
  Batch batch = tiny_batch(m, seed);
  if (!config.engram_layers.empty())
    make_engram_hashing(engram_hash_options(config), nullptr).add_to(batch, m.S);
  return batch;
}

}  // namespace meshtrain::testing
