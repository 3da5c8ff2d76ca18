// The bf16 attention kernels (attention.h: attention_kernels_with(avx512_bf16) and (amx), each test run
// for both where the CPU has them) against the double reference run on the same bf16-exact inputs, element
// by element within a bound derived from what the kernels round.
//
// The bound. Inputs are bf16 values, so rounding q, k, v, dout when tiles are packed is exact, and every
// product of two bf16 is exact in float32. What the kernels round beyond float32 arithmetic is P (for
// out = P V and dV = P^T dO) and dS (for dQ = dS K and dK = dS^T Q), each to the nearest bf16: a relative
// error of at most u = 2^-8 per element. To first order the error of an output element is therefore at most
//   out[i][c]: u sum_j P_ij |v_jc|,            dv[j][c]: u sum_i P_ij |dout_ic|,
//   dq[i][c]:  u scale sum_j |dS_ij| |k_jc|,   dk[j][c]: u scale sum_i |dS_ij| |q_ic|,
// (P normalised as the reference's, dS = P (dout_i . v_j - D_i)), plus float32 arithmetic (sums of d or
// Skv terms, exp, the online softmax), bounded by 2^-18 of the same sums taken over the magnitudes that
// enter them (|P| (1 + scale sum_c |q_ic k_jc|) for a probability, |dout_i . v_j| + |D_i| for dP - D).
// The test computes both sums per element from the reference quantities (not from the kernels).
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

#include "gradcheck.h"
#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/kernels/cpu/attention.h"

namespace {

using meshtrain::bfloat16_from_float;
using meshtrain::cpu_features;
using meshtrain::float_from_bfloat16;
using meshtrain::kernels::attention_backward_scratch_floats;
using meshtrain::kernels::context_attention_backward_scratch_floats;
using meshtrain::kernels::context_attention_reference_backward;
using meshtrain::kernels::context_attention_reference_forward;
using meshtrain::testing::random_values;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;

constexpr double kUnitRoundoff = 1.0 / 256.0;      // bf16: 8 significant bits, round to nearest
constexpr double kFloat32Slack = 1.0 / (1 << 18);  // float32 arithmetic, relative to the magnitudes
constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();

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

// Values rounded to bf16 (then exact in float and double).
std::vector<double> bf16_exact(std::vector<double> values, double magnitude) {
  for (double& value : values)
    value = float_from_bfloat16(bfloat16_from_float(static_cast<float>(value * magnitude)));
  return values;
}

// A query set against a key / value set (self-attention: the same positions and segment ids, Sq = Skv).
struct Problem {
  int64_t B, Sq, Skv, H, K, d;
  std::vector<double> q, dout, k, v;  // q, dout [B,Sq,H,d]; k, v [B,Skv,K,d]
  std::vector<int32_t> q_positions, q_segment_ids, kv_positions, kv_segment_ids;  // [B,S*] or empty ids

  const int32_t* q_segments() const { return q_segment_ids.empty() ? nullptr : q_segment_ids.data(); }
  const int32_t* kv_segments() const { return kv_segment_ids.empty() ? nullptr : kv_segment_ids.data(); }
};

// Causal self-attention, positions 0..S-1.
Problem self_problem(int64_t B, int64_t S, int64_t H, int64_t K, int64_t d, uint64_t seed) {
  Problem p{B, S, S, H, K, d, {}, {}, {}, {}, {}, {}, {}, {}};
  const auto q_count = static_cast<size_t>(B * S * H * d), kv_count = static_cast<size_t>(B * S * K * d);
  p.q = bf16_exact(random_values(q_count, seed), 2.0);  // sharper softmax than q ~ k
  p.dout = bf16_exact(random_values(q_count, seed + 1), 1.0);
  p.k = bf16_exact(random_values(kv_count, seed + 2), 1.0);
  p.v = bf16_exact(random_values(kv_count, seed + 3), 1.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < S; ++i) p.q_positions.push_back(static_cast<int32_t>(i));
  }
  p.kv_positions = p.q_positions;
  return p;
}

// Separate sets: positions uniform in [0, max_position], segment ids in [0, segments) (none when 0).
Problem context_problem(int64_t B, int64_t Sq, int64_t Skv, int64_t H, int64_t K, int64_t d,
                        int32_t max_position, int32_t segments, uint64_t seed) {
  Problem p = self_problem(B, 1, H, K, d, seed);
  p.Sq = Sq;
  p.Skv = Skv;
  p.q = bf16_exact(random_values(static_cast<size_t>(B * Sq * H * d), seed), 2.0);
  p.dout = bf16_exact(random_values(static_cast<size_t>(B * Sq * H * d), seed + 1), 1.0);
  p.k = bf16_exact(random_values(static_cast<size_t>(B * Skv * K * d), seed + 2), 1.0);
  p.v = bf16_exact(random_values(static_cast<size_t>(B * Skv * K * d), seed + 3), 1.0);
  std::mt19937_64 generator(seed + 4);
  std::uniform_int_distribution<int32_t> position(0, max_position), segment(0, std::max(segments - 1, 0));
  const auto fill = [&](std::vector<int32_t>& positions, std::vector<int32_t>& segment_ids, int64_t count) {
    positions.assign(static_cast<size_t>(count), 0);
    for (int32_t& value : positions) value = position(generator);
    segment_ids.clear();
    if (segments > 0) {
      segment_ids.resize(static_cast<size_t>(count));
      for (int32_t& value : segment_ids) value = segment(generator);
    }
  };
  fill(p.q_positions, p.q_segment_ids, B * Sq);
  fill(p.kv_positions, p.kv_segment_ids, B * Skv);
  return p;
}

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

// The double reference, and per element the two bound sums of the header comment: `first` (times u) and
// `magnitude` (times the float32 slack).
struct Expected {
  Result value, first, magnitude;
};

Expected run_reference(const Problem& p) {
  Expected e;
  Result& r = e.value;
  r = Result{std::vector<double>(p.q.size()), std::vector<double>(static_cast<size_t>(p.B * p.H * p.Sq)),
             std::vector<double>(p.q.size()), std::vector<double>(p.k.size()),
             std::vector<double>(p.v.size())};
  context_attention_reference_forward(r.out.data(), r.lse.data(), p.q.data(), p.k.data(), p.v.data(),
                                      p.q_positions.data(), p.q_segments(), p.kv_positions.data(),
                                      p.kv_segments(), p.B, p.Sq, p.Skv, p.H, p.K, p.d);
  context_attention_reference_backward(r.dq.data(), r.dk.data(), r.dv.data(), p.dout.data(), r.out.data(),
                                       r.lse.data(), p.q.data(), p.k.data(), p.v.data(), p.q_positions.data(),
                                       p.q_segments(), p.kv_positions.data(), p.kv_segments(), p.B, p.Sq,
                                       p.Skv, p.H, p.K, p.d);
  const Result zeros{std::vector<double>(p.q.size()), std::vector<double>(r.lse.size()),
                     std::vector<double>(p.q.size()), std::vector<double>(p.k.size()),
                     std::vector<double>(p.v.size())};
  e.first = zeros;
  e.magnitude = zeros;
  const int64_t d = p.d, group = p.H / p.K;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < p.Sq; ++i) {
        const int64_t row = ((b * p.Sq + i) * p.H + h) * d;
        const double lse = r.lse[static_cast<size_t>((b * p.H + h) * p.Sq + i)];
        e.magnitude.lse[static_cast<size_t>((b * p.H + h) * p.Sq + i)] = std::abs(lse) + 1.0;
        if (lse == kNegativeInfinity) continue;
        double row_dot = 0.0, row_dot_magnitude = 0.0;
        for (int64_t c = 0; c < d; ++c) {
          row_dot += p.dout[row + c] * r.out[row + c];
          row_dot_magnitude += std::abs(p.dout[row + c] * r.out[row + c]);
        }
        for (int64_t c = 0; c < d; ++c) e.magnitude.out[row + c] += std::abs(r.out[row + c]);
        for (int64_t j = 0; j < p.Skv; ++j) {
          const int64_t key = b * p.Skv + j, query = b * p.Sq + i;
          if (!meshtrain::kernels::attention_detail::visible(p.q_positions.data(), p.q_segments(), query,
                                                             p.kv_positions.data(), p.kv_segments(), key))
            continue;
          const int64_t kv_row = (key * p.K + g) * d;
          double score = 0.0, score_magnitude = 0.0, dp = 0.0, dp_magnitude = 0.0;
          for (int64_t c = 0; c < d; ++c) {
            score += p.q[row + c] * p.k[kv_row + c];
            score_magnitude += std::abs(p.q[row + c] * p.k[kv_row + c]);
            dp += p.dout[row + c] * p.v[kv_row + c];
            dp_magnitude += std::abs(p.dout[row + c] * p.v[kv_row + c]);
          }
          const double prob = std::exp(scale * score - lse);
          const double prob_magnitude = prob * (1.0 + scale * score_magnitude);
          const double ds = prob * (dp - row_dot);
          const double ds_magnitude =
              prob_magnitude * (std::abs(dp - row_dot) + dp_magnitude + row_dot_magnitude);
          for (int64_t c = 0; c < d; ++c) {
            e.first.out[row + c] += prob * std::abs(p.v[kv_row + c]);
            e.first.dv[kv_row + c] += prob * std::abs(p.dout[row + c]);
            e.first.dq[row + c] += scale * std::abs(ds) * std::abs(p.k[kv_row + c]);
            e.first.dk[kv_row + c] += scale * std::abs(ds) * std::abs(p.q[row + c]);
            e.magnitude.out[row + c] += prob_magnitude * std::abs(p.v[kv_row + c]);
            e.magnitude.dv[kv_row + c] += prob_magnitude * std::abs(p.dout[row + c]);
            e.magnitude.dq[row + c] += scale * ds_magnitude * std::abs(p.k[kv_row + c]);
            e.magnitude.dk[kv_row + c] += scale * ds_magnitude * std::abs(p.q[row + c]);
          }
        }
      }
    }
  }
  return e;
}

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

// Every element within u * first + slack * magnitude of the reference (lse: -inf exactly where the
// reference has it). Reports the largest error as a fraction of its bound.
void expect_within_bound(const std::vector<double>& actual, const std::vector<double>& expected,
                         const std::vector<double>& first, const std::vector<double>& magnitude,
                         double first_factor, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double worst = 0.0;
  int64_t failures = 0;
  for (size_t index = 0; index < actual.size(); ++index) {
    if (std::isinf(expected[index])) {
      if (actual[index] != expected[index]) ++failures;
      continue;
    }
    const double bound = first_factor * kUnitRoundoff * first[index] + kFloat32Slack * magnitude[index];
    const double error = std::abs(actual[index] - expected[index]);
    if (!(error <= bound)) {  // also NaN
      if (failures++ < 3)
        ADD_FAILURE() << what << "[" << index << "]: " << actual[index] << " vs " << expected[index]
                      << " (bound " << bound << ")";
    }
    if (bound > 0.0) worst = std::max(worst, error / bound);
  }
  EXPECT_EQ(failures, 0) << what;
  std::printf("  %-48s worst error / bound %.3f\n", what.c_str(), worst);
}

void expect_bf16_close(const Result& actual, const Expected& e, const std::string& what,
                       double first_factor = 1.0) {
  expect_within_bound(actual.out, e.value.out, e.first.out, e.magnitude.out, first_factor, what + " out");
  expect_within_bound(actual.lse, e.value.lse, e.first.lse, e.magnitude.lse, first_factor, what + " lse");
  expect_within_bound(actual.dq, e.value.dq, e.first.dq, e.magnitude.dq, first_factor, what + " dq");
  expect_within_bound(actual.dk, e.value.dk, e.first.dk, e.magnitude.dk, first_factor, what + " dk");
  expect_within_bound(actual.dv, e.value.dv, e.first.dv, e.magnitude.dv, first_factor, what + " dv");
}

std::string describe(const Problem& p) {
  return "B=" + std::to_string(p.B) + " Sq=" + std::to_string(p.Sq) + " Skv=" + std::to_string(p.Skv) +
         " H=" + std::to_string(p.H) + " K=" + std::to_string(p.K) + " d=" + std::to_string(p.d);
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
