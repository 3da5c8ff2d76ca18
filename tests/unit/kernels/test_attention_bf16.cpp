// The bf16 attention kernels (attention.h: attention_kernels_with(avx512_bf16) and (amx), each test run
// for both where the CPU has them) against the double reference run on the same bf16-exact inputs, element
// by element within a bound derived from what the kernels round.
// The bound is attention_bf16_bound.h's (its opening comment derives it).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention_bf16_bound.h"
#include "gradcheck.h"
#include "meshtrain/core/cpu_features.h"
#include "meshtrain/kernels/cpu/attention.h"

namespace {

using meshtrain::cpu_features;
using meshtrain::kernels::attention_backward_scratch_floats;
using meshtrain::kernels::context_attention_backward_scratch_floats;
using meshtrain::testing::random_values;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::attention_bf16::context_problem;
using meshtrain::testing::attention_bf16::describe;
using meshtrain::testing::attention_bf16::expect_bf16_close;
using meshtrain::testing::attention_bf16::expect_within_bound;
using meshtrain::testing::attention_bf16::Expected;
using meshtrain::testing::attention_bf16::Problem;
using meshtrain::testing::attention_bf16::Result;
using meshtrain::testing::attention_bf16::run_reference;
using meshtrain::testing::attention_bf16::self_problem;

// One implementation of the bf16 entries, and whether this CPU runs it.
struct Bf16Kernels {
  std::string name;
  bool (*available)();
  meshtrain::kernels::AttentionKernels set;
};

// gtest prints the parameter in test listings: the name, not the bytes (which hold pointers).
void PrintTo(const Bf16Kernels& kernels, std::ostream* out) {
  *out << kernels.name;
}

bool has_avx512_bf16() {
  return cpu_features().avx512_bf16;
}
bool has_amx() {
  return cpu_features().amx_bf16 && cpu_features().avx512_bf16;
}

using meshtrain::kernels::AttentionProducts;
const Bf16Kernels kAvx512Bf16{"avx512_bf16", has_avx512_bf16,
                              meshtrain::kernels::attention_kernels_with(AttentionProducts::avx512_bf16)};
const Bf16Kernels kAmx{"amx", has_amx, meshtrain::kernels::attention_kernels_with(AttentionProducts::amx)};

class AttentionBf16 : public ::testing::TestWithParam<Bf16Kernels> {
 protected:
  void SetUp() override {
    if (!GetParam().available())
      GTEST_SKIP() << "this CPU cannot run the " << GetParam().name << " kernels ("
                   << cpu_features().describe() << ")";
  }
  const meshtrain::kernels::AttentionKernels& kernels() const { return GetParam().set; }
};

// The bf16 kernels; the backward takes the reference's out and lse, so its error is its own.
Result run_bf16(const meshtrain::kernels::AttentionKernels& kernels, const Problem& p,
                const Expected& reference, bool self) {
  const std::vector<float> q = to_float(p.q), k = to_float(p.k), v = to_float(p.v), dout = to_float(p.dout);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(q.size(), nan), lse(static_cast<size_t>(p.B * p.H * p.Sq), nan);
  std::vector<float> dq(q.size(), nan), dk(k.size(), nan), dv(v.size(), nan);
  const std::vector<float> reference_out = to_float(reference.value.out);
  const std::vector<float> reference_lse = to_float(reference.value.lse);
  if (self) {
    std::vector<float> scratch(static_cast<size_t>(
        attention_backward_scratch_floats(p.B, p.Sq, p.H, p.K, p.d, omp_get_max_threads())));
    kernels.forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p.q_positions.data(),
                    p.q_segments(), p.B, p.Sq, p.H, p.K, p.d);
    kernels.backward(dq.data(), dk.data(), dv.data(), dout.data(), reference_out.data(), reference_lse.data(),
                     q.data(), k.data(), v.data(), p.q_positions.data(), p.q_segments(), p.B, p.Sq, p.H, p.K,
                     p.d, scratch.data());
  } else {
    std::vector<float> scratch(
        static_cast<size_t>(context_attention_backward_scratch_floats(p.B, p.Sq, p.H)));
    kernels.context_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p.q_positions.data(),
                            p.q_segments(), p.kv_positions.data(), p.kv_segments(), p.B, p.Sq, p.Skv, p.H,
                            p.K, p.d, false);
    kernels.context_backward(dq.data(), dk.data(), dv.data(), dout.data(), reference_out.data(),
                             reference_lse.data(), q.data(), k.data(), v.data(), p.q_positions.data(),
                             p.q_segments(), p.kv_positions.data(), p.kv_segments(), p.B, p.Sq, p.Skv, p.H,
                             p.K, p.d, false, scratch.data());
  }
  return Result{to_double(out), to_double(lse), to_double(dq), to_double(dk), to_double(dv)};
}

TEST_P(AttentionBf16, SelfAttentionWithinBf16BoundOfReference) {
  // The float32 tests' shapes, the head widths of the models (64, 80, 128, 192) on ragged S (not a multiple
  // of the 64-token tile), an odd head width and a single token.
  const int64_t shapes[][5] = {{2, 37, 4, 2, 8},    {1, 70, 4, 4, 64},  {1, 129, 4, 1, 128},
                               {2, 129, 2, 1, 8},   {1, 70, 2, 1, 300}, {1, 100, 2, 1, 80},
                               {1, 130, 2, 2, 192}, {1, 65, 3, 1, 5},   {2, 1, 2, 1, 64}};
  uint64_t seed = 10;
  for (const auto& [B, S, H, K, d] : shapes) {
    const Problem p = self_problem(B, S, H, K, d, seed += 10);
    const Expected e = run_reference(p);
    expect_bf16_close(run_bf16(kernels(), p, e, true), e, describe(p));
  }
}

TEST_P(AttentionBf16, PackedDocumentsAndArbitraryPositionsWithinBound) {
  // Self-attention over shuffled positions with three documents (segment ids) per sequence: every query
  // still sees itself.
  Problem p = self_problem(2, 150, 4, 2, 64, 500);
  std::mt19937_64 generator(501);
  p.q_segment_ids.resize(p.q_positions.size());
  for (int64_t b = 0; b < p.B; ++b) {
    std::vector<int32_t> order(static_cast<size_t>(p.Sq));
    for (int64_t i = 0; i < p.Sq; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::shuffle(order.begin(), order.end(), generator);
    for (int64_t i = 0; i < p.Sq; ++i) {
      const auto index = static_cast<size_t>(b * p.Sq + i);
      p.q_positions[index] = order[static_cast<size_t>(i)];
      p.q_segment_ids[index] = order[static_cast<size_t>(i)] / 60;  // documents of 60 tokens
    }
  }
  p.kv_positions = p.q_positions;
  p.kv_segment_ids = p.q_segment_ids;
  const Expected e = run_reference(p);
  expect_bf16_close(run_bf16(kernels(), p, e, true), e, "shuffled packed documents");
}

TEST_P(AttentionBf16, MaximaThatRiseOverLaterKeyTilesWithinBound) {
  // Keys that grow along the sequence (row j scaled by 1 + j / 24), so a query's largest score rises by
  // many times the forward's slack over later key tiles (the AMX kernel then rescales what it accumulated)
  // and its probabilities are far sharper than in the other problems.
  Problem p = self_problem(1, 260, 2, 1, 64, 900);
  for (size_t index = 0; index < p.k.size(); ++index) {
    const double growth = 1.0 + static_cast<double>(static_cast<int64_t>(index) / p.d) / 24.0;
    p.k[index] = meshtrain::float_from_bfloat16(
        meshtrain::bfloat16_from_float(static_cast<float>(p.k[index] * growth)));
  }
  const Expected e = run_reference(p);
  expect_bf16_close(run_bf16(kernels(), p, e, true), e, "keys growing along the sequence");
}

TEST_P(AttentionBf16, ContextSetsWithinBound) {
  // Separate query and key sets with random positions and segments (some queries see no key: out 0,
  // lse -inf), GQA, ragged sizes, and MLA's padded v (the last columns of v zero).
  struct Case {
    int64_t B, Sq, Skv, H, K, d;
    int32_t max_position, segments;
    bool padded_v;
  };
  const Case cases[] = {{2, 80, 100, 4, 2, 16, 150, 2, false},
                        {1, 130, 200, 4, 2, 64, 150, 0, false},
                        {1, 70, 129, 2, 1, 128, 100, 3, false},
                        {1, 66, 90, 2, 2, 192, 100, 2, true}};
  uint64_t seed = 600;
  for (const Case& c : cases) {
    Problem p = context_problem(c.B, c.Sq, c.Skv, c.H, c.K, c.d, c.max_position, c.segments, seed += 10);
    if (c.padded_v) {  // MLA: v of width 128 padded to the qk width 192
      for (size_t index = 0; index < p.v.size(); ++index) {
        if (static_cast<int64_t>(index) % c.d >= 128) p.v[index] = 0.0;
      }
    }
    const Expected e = run_reference(p);
    expect_bf16_close(run_bf16(kernels(), p, e, false), e, describe(p) + (c.padded_v ? " padded v" : ""));
  }
}

TEST_P(AttentionBf16, BitwiseIndependentOfThreadCount) {
  // One and two threads take the backward's owner schedule, three threads with B*K = 2 owners the split
  // one.
  for (const int64_t d : {16, 64, 80, 300}) {
    const Problem p = context_problem(1, 130, 200, 4, 2, d, 150, 2, 700 + static_cast<uint64_t>(d));
    const Expected e = run_reference(p);
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const Result one = run_bf16(kernels(), p, e, false);
    for (const int threads : {2, 3}) {
      omp_set_num_threads(threads);
      const Result many = run_bf16(kernels(), p, e, false);
      EXPECT_EQ(one.out, many.out) << "d=" << d << ", " << threads << " threads";
      EXPECT_EQ(one.lse, many.lse) << "d=" << d << ", " << threads << " threads";
      EXPECT_EQ(one.dq, many.dq) << "d=" << d << ", " << threads << " threads";
      EXPECT_EQ(one.dk, many.dk) << "d=" << d << ", " << threads << " threads";
      EXPECT_EQ(one.dv, many.dv) << "d=" << d << ", " << threads << " threads";
    }
    omp_set_num_threads(saved_threads);
  }
}

TEST_P(AttentionBf16, RingAccumulateWithinBoundOfAllGather) {
  // 100 keys in ring blocks of 30, 1, 0 and 69: folded block by block (accumulate) the forward, and the
  // backward added block by block onto initial gradients, stay within the bound of the reference of the
  // whole set (P and dS are rounded relative to each block's running maximum, so bitwise equality with one
  // call is not expected; the bound is the same).
  const Problem p = context_problem(2, 80, 100, 4, 2, 64, 150, 2, 800);
  const Expected e = run_reference(p);
  const std::vector<float> q = to_float(p.q), dout = to_float(p.dout);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(q.size(), nan), lse(e.value.lse.size(), nan);
  const std::vector<int64_t> sizes = {30, 1, 0, 69};
  const auto block_rows = [&](const std::vector<double>& x, int64_t begin, int64_t size, int64_t width) {
    std::vector<float> rows;
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t j = begin; j < begin + size; ++j) {
        for (int64_t c = 0; c < width; ++c)
          rows.push_back(static_cast<float>(x[static_cast<size_t>((b * p.Skv + j) * width + c)]));
      }
    }
    return rows;
  };
  const auto block_tokens = [&](const std::vector<int32_t>& x, int64_t begin, int64_t size) {
    std::vector<int32_t> rows;
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t j = begin; j < begin + size; ++j) rows.push_back(x[static_cast<size_t>(b * p.Skv + j)]);
    }
    return rows;
  };
  int64_t begin = 0;
  for (size_t index = 0; index < sizes.size(); ++index) {
    const int64_t size = sizes[index];
    const std::vector<float> k = block_rows(p.k, begin, size, p.K * p.d),
                             v = block_rows(p.v, begin, size, p.K * p.d);
    const std::vector<int32_t> positions = block_tokens(p.kv_positions, begin, size);
    const std::vector<int32_t> segments = block_tokens(p.kv_segment_ids, begin, size);
    kernels().context_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p.q_positions.data(),
                              p.q_segments(), positions.data(), segments.data(), p.B, p.Sq, size, p.H, p.K,
                              p.d, index > 0);
    begin += size;
  }
  const Result forward{to_double(out), to_double(lse), {}, {}, {}};
  expect_within_bound(forward.out, e.value.out, e.first.out, e.magnitude.out, 1.0, "ring out");
  expect_within_bound(forward.lse, e.value.lse, e.first.lse, e.magnitude.lse, 1.0, "ring lse");

  // Backward with the reference's final out and lse, onto initial gradients.
  const std::vector<float> reference_out = to_float(e.value.out), reference_lse = to_float(e.value.lse);
  const std::vector<double> initial_q = random_values(p.q.size(), 810),
                            initial_kv = random_values(p.k.size(), 811);
  std::vector<float> dq = to_float(initial_q);
  std::vector<float> scratch(static_cast<size_t>(context_attention_backward_scratch_floats(p.B, p.Sq, p.H)));
  std::vector<double> dk(p.k.size()), dv(p.v.size());
  begin = 0;
  for (const int64_t size : sizes) {
    const std::vector<float> k = block_rows(p.k, begin, size, p.K * p.d),
                             v = block_rows(p.v, begin, size, p.K * p.d);
    const std::vector<int32_t> positions = block_tokens(p.kv_positions, begin, size);
    const std::vector<int32_t> segments = block_tokens(p.kv_segment_ids, begin, size);
    std::vector<float> block_dk = block_rows(initial_kv, begin, size, p.K * p.d), block_dv = block_dk;
    kernels().context_backward(dq.data(), block_dk.data(), block_dv.data(), dout.data(), reference_out.data(),
                               reference_lse.data(), q.data(), k.data(), v.data(), p.q_positions.data(),
                               p.q_segments(), positions.data(), segments.data(), p.B, p.Sq, size, p.H, p.K,
                               p.d, true, scratch.data());
    // Back to the whole set's rows, less the initial values.
    const int64_t width = p.K * p.d;
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t j = 0; j < size; ++j) {
        for (int64_t c = 0; c < width; ++c) {
          const auto here = static_cast<size_t>((b * size + j) * width + c);
          const auto there = static_cast<size_t>((b * p.Skv + begin + j) * width + c);
          dk[there] = block_dk[here] - initial_kv[there];
          dv[there] = block_dv[here] - initial_kv[there];
        }
      }
    }
    begin += size;
  }
  std::vector<double> dq_added = to_double(dq);
  for (size_t i = 0; i < dq_added.size(); ++i) dq_added[i] -= initial_q[i];
  // The gradients now accumulate onto values near 1 (|initial| < 1): each of the at most Skv additions
  // rounds by up to 2^-23 of a running value below 2, which Skv * 2^-18 in the bound covers.
  std::vector<double> dq_magnitude = e.magnitude.dq, dk_magnitude = e.magnitude.dk,
                      dv_magnitude = e.magnitude.dv;
  for (auto* magnitude : {&dq_magnitude, &dk_magnitude, &dv_magnitude}) {
    for (double& m : *magnitude) m += static_cast<double>(p.Skv);
  }
  expect_within_bound(dq_added, e.value.dq, e.first.dq, dq_magnitude, 1.0, "ring dq (accumulated)");
  expect_within_bound(dk, e.value.dk, e.first.dk, dk_magnitude, 1.0, "ring dk (accumulated)");
  expect_within_bound(dv, e.value.dv, e.first.dv, dv_magnitude, 1.0, "ring dv (accumulated)");
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionBf16, ::testing::Values(kAvx512Bf16, kAmx),
                         [](const ::testing::TestParamInfo<Bf16Kernels>& kernel) {
                           return kernel.param.name;
                         });

}  // namespace
