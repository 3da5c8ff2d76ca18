// One micro-batch as the engine consumes it. Legend: B batch rows, S sequence length.
#pragma once

#include <cstdint>
#include <vector>

namespace meshtrain {

struct Batch {
  std::vector<int32_t> tokens;       // [B, S] input ids
  std::vector<int32_t> targets;      // [B, S] next-token ids
  std::vector<int32_t> positions;    // [B, S] position within its document (RoPE / learned positions)
  std::vector<int32_t> segment_ids;  // [B, S] document index within the row: attention never crosses it
  std::vector<uint8_t> loss_mask;    // [B, S] 1: the target counts in the loss
  // Per Engram layer (engram_layers order): the n-gram hash ids of each token, [B, S, H (N - 1)], hashed in
  // natural order before any context-parallel cut (data/engram_hash.h); empty without Engram.
  std::vector<std::vector<int32_t>> engram_hash_ids;
};

}  // namespace meshtrain
