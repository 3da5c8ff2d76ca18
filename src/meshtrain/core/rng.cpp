#include "meshtrain/core/rng.h"

#include <cmath>
#include <numbers>

namespace meshtrain {
namespace {

constexpr uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

uint64_t splitmix64(uint64_t value) {
  value += 0x9E3779B97F4A7C15ull;
  value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ull;
  value = (value ^ (value >> 27)) * 0x94D049BB133111EBull;
  return value ^ (value >> 31);
}

// 53 random bits -> double in [0, 1).
double to_unit(uint32_t high, uint32_t low) {
  const uint64_t bits = (static_cast<uint64_t>(high) << 21) ^ (low >> 11);
  return static_cast<double>(bits) * 0x1.0p-53;
}

PhiloxBlock counter_of(uint64_t index) {
  return {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u};
}

}  // namespace

PhiloxBlock philox4x32(PhiloxBlock counter, PhiloxKey key) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * counter[0];
    const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * counter[2];
    counter = {static_cast<uint32_t>(product1 >> 32) ^ counter[1] ^ key[0], static_cast<uint32_t>(product1),
               static_cast<uint32_t>(product0 >> 32) ^ counter[3] ^ key[1], static_cast<uint32_t>(product0)};
    key = {key[0] + kWeyl0, key[1] + kWeyl1};
  }
  return counter;
}

PhiloxKey philox_key(uint64_t seed, std::string_view stream_name) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (char character : stream_name) {
    hash ^= static_cast<unsigned char>(character);
    hash *= 0x100000001B3ull;
  }
  const uint64_t mixed = splitmix64(splitmix64(seed) ^ hash);
  return {static_cast<uint32_t>(mixed), static_cast<uint32_t>(mixed >> 32)};
}

double normal_at(PhiloxKey key, uint64_t index) {
  const PhiloxBlock block = philox4x32(counter_of(index), key);
  const double u1 = 1.0 - to_unit(block[0], block[1]);  // (0, 1]: log is finite
  const double u2 = to_unit(block[2], block[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

uint32_t uint32_at(PhiloxKey key, uint64_t index) {
  return philox4x32(counter_of(index), key)[0];
}

double uniform_at(PhiloxKey key, uint64_t index) {
  const PhiloxBlock block = philox4x32(counter_of(index), key);
  return to_unit(block[0], block[1]);
}

}  // namespace meshtrain
