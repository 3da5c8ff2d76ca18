// The bound of the bf16 attention kernels, shared by the cpu tests (test_attention_bf16.cpp) and the
// CUDA ones (tests/gpu/test_attention.cpp): problems with bf16-exact inputs, the double reference, and
// per element the bound derived from what the kernels round.
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
// run_reference computes both sums per element from the reference quantities (not from the kernels).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/kernels/cpu/attention.h"

namespace meshtrain::testing::attention_bf16 {

using kernels::context_attention_reference_backward;
using kernels::context_attention_reference_forward;

constexpr double kUnitRoundoff = 1.0 / 256.0;      // bf16: 8 significant bits, round to nearest
constexpr double kFloat32Slack = 1.0 / (1 << 18);  // float32 arithmetic, relative to the magnitudes
constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();

// Values rounded to bf16 (then exact in float and double).
inline std::vector<double> bf16_exact(std::vector<double> values, double magnitude) {
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
inline Problem self_problem(int64_t B, int64_t S, int64_t H, int64_t K, int64_t d, uint64_t seed) {
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
inline Problem context_problem(int64_t B, int64_t Sq, int64_t Skv, int64_t H, int64_t K, int64_t d,
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

inline Expected run_reference(const Problem& p) {
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

// Every element within u * first + slack * magnitude of the reference (lse: -inf exactly where the
// reference has it). Reports the largest error as a fraction of its bound.
inline void expect_within_bound(const std::vector<double>& actual, const std::vector<double>& expected,
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
  std::printf("  %-48s largest deviation / bound %.3f\n", what.c_str(), worst);
}

inline void expect_bf16_close(const Result& actual, const Expected& e, const std::string& what,
                              double first_factor = 1.0) {
  expect_within_bound(actual.out, e.value.out, e.first.out, e.magnitude.out, first_factor, what + " out");
  expect_within_bound(actual.lse, e.value.lse, e.first.lse, e.magnitude.lse, first_factor, what + " lse");
  expect_within_bound(actual.dq, e.value.dq, e.first.dq, e.magnitude.dq, first_factor, what + " dq");
  expect_within_bound(actual.dk, e.value.dk, e.first.dk, e.magnitude.dk, first_factor, what + " dk");
  expect_within_bound(actual.dv, e.value.dv, e.first.dv, e.magnitude.dv, first_factor, what + " dv");
}

inline std::string describe(const Problem& p) {
  return "B=" + std::to_string(p.B) + " Sq=" + std::to_string(p.Sq) + " Skv=" + std::to_string(p.Skv) +
         " H=" + std::to_string(p.H) + " K=" + std::to_string(p.K) + " d=" + std::to_string(p.d);
}

}  // namespace meshtrain::testing::attention_bf16
