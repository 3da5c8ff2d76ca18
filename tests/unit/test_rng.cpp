// Counter-based RNG: Philox known-answer vectors, and values that depend only on (seed, name, index).
#include <gtest/gtest.h>

#include <cmath>

#include "meshtrain/core/rng.h"

namespace meshtrain {
namespace {

// Known-answer tests from the Random123 distribution (kat_vectors, philox4x32_10).
TEST(Philox, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}),
            (PhiloxBlock{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (PhiloxBlock{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (PhiloxBlock{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, ValueDependsOnlyOnSeedNameAndIndex) {
  const PhiloxKey key = philox_key(7, "decoder/layers_3/mlp/wo/kernel");
  const double forward = normal_at(key, 12345);
  for (int i = 0; i < 1000; ++i) normal_at(key, static_cast<uint64_t>(i));  // other draws change nothing
  EXPECT_EQ(normal_at(philox_key(7, "decoder/layers_3/mlp/wo/kernel"), 12345), forward);
  EXPECT_NE(normal_at(philox_key(8, "decoder/layers_3/mlp/wo/kernel"), 12345), forward);
  EXPECT_NE(normal_at(philox_key(7, "decoder/layers_4/mlp/wo/kernel"), 12345), forward);
}

TEST(Philox, NormalSamplesHaveUnitMoments) {
  const PhiloxKey key = philox_key(0, "moments");
  const int count = 200000;
  double sum = 0.0, sum_squares = 0.0;
  for (int i = 0; i < count; ++i) {
    const double value = normal_at(key, static_cast<uint64_t>(i));
    sum += value;
    sum_squares += value * value;
  }
  const double mean = sum / count, variance = sum_squares / count - mean * mean;
  // Standard error of the mean is 1/sqrt(200000) = 0.0022; of the variance about 0.0032.
  EXPECT_NEAR(mean, 0.0, 0.011);
  EXPECT_NEAR(variance, 1.0, 0.016);
}

}  // namespace
}  // namespace meshtrain
