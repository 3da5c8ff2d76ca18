// What the golden-file tests share (test_golden_qwen3.cpp, test_golden_moe.cpp): reading a whole tensor of
// a safetensors file, and the golden batch (inputs and targets [B, S] from golden.safetensors, positions
// 0..S-1 in one segment, every target counted).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "meshtrain/data/batch.h"
#include "meshtrain/io/safetensors.h"

namespace meshtrain::testing {

inline std::vector<float> read_all(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry* entry = file.find(name);
  EXPECT_NE(entry, nullptr) << name;
  if (entry == nullptr) return {};
  int64_t count = 1;
  for (int64_t dim : entry->shape) count *= dim;
  std::vector<float> values(static_cast<size_t>(count));
  file.read_f32(name, entry->shape, values.data());
  return values;
}

inline Batch golden_batch(const SafetensorsFile& golden) {
  const std::vector<int64_t> shape = golden.find("inputs")->shape;
  const int64_t B = shape[0], S = shape[1], N = B * S;
  Batch batch;
  batch.tokens.resize(static_cast<size_t>(N));
  batch.targets.resize(static_cast<size_t>(N));
  golden.read_i32("inputs", shape, batch.tokens.data());
  golden.read_i32("targets", shape, batch.targets.data());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) batch.positions.push_back(static_cast<int32_t>(s));
  }
  batch.segment_ids.assign(static_cast<size_t>(N), 0);
  batch.loss_mask.assign(static_cast<size_t>(N), 1);
  return batch;
}

}  // namespace meshtrain::testing
