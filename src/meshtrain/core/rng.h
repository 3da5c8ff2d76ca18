// Counter-based random numbers (Philox-4x32-10). A value depends only on (key, counter), so parameter
// i of a tensor gets the same initial value whatever the sharding, thread count or layer layout: the
// key comes from (seed, canonical per-layer parameter name), the counter is the element index.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace meshtrain {

using PhiloxKey = std::array<uint32_t, 2>;
using PhiloxBlock = std::array<uint32_t, 4>;

PhiloxBlock philox4x32(PhiloxBlock counter, PhiloxKey key);

// 64-bit FNV-1a of a name, mixed with the seed: the stream key of one named tensor.
PhiloxKey philox_key(uint64_t seed, std::string_view stream_name);

// Standard normal sample number `index` of the stream (Box-Muller on one Philox block).
double normal_at(PhiloxKey key, uint64_t index);
// Uniform 32-bit integer number `index` of the stream (synthetic data, sampling).
uint32_t uint32_at(PhiloxKey key, uint64_t index);
// Uniform double in [0, 1) number `index` of the stream.
double uniform_at(PhiloxKey key, uint64_t index);

}  // namespace meshtrain
