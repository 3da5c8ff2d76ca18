#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/attention.h"

namespace {

using meshtrain::kernels::attention_backward;
using meshtrain::kernels::attention_backward_scratch_floats;
using meshtrain::kernels::attention_decode;
using meshtrain::kernels::attention_forward;
using meshtrain::kernels::attention_forward_scratch_floats;
using meshtrain::kernels::attention_reference_backward;
using meshtrain::kernels::attention_reference_forward;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::report_error;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

// Values rounded to float, so the float kernels and the double reference see identical inputs.
std::vector<double> float_exact(std::vector<double> values, double magnitude) {
  for (double& value : values) value = static_cast<double>(static_cast<float>(value * magnitude));
  return values;
}

// One attention problem: inputs, the upstream gradient dout, positions and optional segment ids.
struct Problem {
  int64_t B, S, H, K, d;
  std::vector<double> q, k, v, dout;  // q, dout [B,S,H,d]; k, v [B,S,K,d]
  std::vector<int32_t> positions;     // [B,S]
  std::vector<int32_t> segment_ids;   // [B,S] or empty (= nullptr)

  const int32_t* segments() const { return segment_ids.empty() ? nullptr : segment_ids.data(); }
};

// Random inputs with positions 0..S-1 in every sequence and no segment ids. q is twice as large as k so the
// softmax is less uniform.
Problem make_problem(int64_t B, int64_t S, int64_t H, int64_t K, int64_t d, uint64_t seed) {
  Problem problem{B, S, H, K, d, {}, {}, {}, {}, {}, {}};
  const auto q_count = static_cast<size_t>(B * S * H * d), kv_count = static_cast<size_t>(B * S * K * d);
  problem.q = float_exact(random_values(q_count, seed), 2.0);
  problem.k = float_exact(random_values(kv_count, seed + 1), 1.0);
  problem.v = float_exact(random_values(kv_count, seed + 2), 1.0);
  problem.dout = float_exact(random_values(q_count, seed + 3), 1.0);
  problem.positions.resize(static_cast<size_t>(B * S));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < S; ++i) {
      problem.positions[static_cast<size_t>(b * S + i)] = static_cast<int32_t>(i);
    }
  }
  return problem;
}

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

Result run_reference(const Problem& p) {
  Result r;
  r.out.resize(p.q.size());
  r.lse.resize(static_cast<size_t>(p.B * p.H * p.S));
  r.dq.resize(p.q.size());
  r.dk.resize(p.k.size());
  r.dv.resize(p.v.size());
  attention_reference_forward(r.out.data(), r.lse.data(), p.q.data(), p.k.data(), p.v.data(),
                              p.positions.data(), p.segments(), p.B, p.S, p.H, p.K, p.d);
  attention_reference_backward(r.dq.data(), r.dk.data(), r.dv.data(), p.dout.data(), r.out.data(),
                               r.lse.data(), p.q.data(), p.k.data(), p.v.data(), p.positions.data(),
                               p.segments(), p.B, p.S, p.H, p.K, p.d);
  return r;
}

Result run_fast(const Problem& p) {
  const std::vector<float> q = to_float(p.q), k = to_float(p.k), v = to_float(p.v), dout = to_float(p.dout);
  EXPECT_EQ(attention_forward_scratch_floats(p.B, p.S, p.H, p.K, p.d, omp_get_max_threads()), 0);
  // Output buffers start as NaN so a row the kernels forget to write shows up.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(q.size(), nan), lse(static_cast<size_t>(p.B * p.H * p.S), nan);
  std::vector<float> dq(q.size(), nan), dk(k.size(), nan), dv(v.size(), nan);
  std::vector<float> scratch(
      static_cast<size_t>(attention_backward_scratch_floats(p.B, p.S, p.H, p.K, p.d, omp_get_max_threads())),
      nan);
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p.positions.data(), p.segments(),
                    p.B, p.S, p.H, p.K, p.d);
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                     v.data(), p.positions.data(), p.segments(), p.B, p.S, p.H, p.K, p.d, scratch.data());
  return Result{to_double(out), to_double(lse), to_double(dq), to_double(dk), to_double(dv)};
}

void expect_close(const Result& actual, const Result& expected, const std::string& what, double bound) {
  const std::pair<const char*, double> errors[] = {{"out", relative_error(actual.out, expected.out)},
                                                   {"lse", relative_error(actual.lse, expected.lse)},
                                                   {"dq", relative_error(actual.dq, expected.dq)},
                                                   {"dk", relative_error(actual.dk, expected.dk)},
                                                   {"dv", relative_error(actual.dv, expected.dv)}};
  for (const auto& [name, error] : errors) {
    report_error(what + " " + name, error, bound);
    EXPECT_LE(error, bound) << what << " " << name;  // also fails on NaN
  }
}

// Reorders the tokens of every sequence: new token t is old token order[t] (rows of q, k, v, dout,
// positions and segment ids move together).
Problem permute_tokens(const Problem& p, const std::vector<int64_t>& order) {
  Problem permuted = p;
  const auto move_rows = [&](const auto& from, auto& to, int64_t width) {
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t t = 0; t < p.S; ++t) {
        std::copy_n(from.begin() + (b * p.S + order[t]) * width, width, to.begin() + (b * p.S + t) * width);
      }
    }
  };
  move_rows(p.q, permuted.q, p.H * p.d);
  move_rows(p.dout, permuted.dout, p.H * p.d);
  move_rows(p.k, permuted.k, p.K * p.d);
  move_rows(p.v, permuted.v, p.K * p.d);
  move_rows(p.positions, permuted.positions, 1);
  if (!p.segment_ids.empty()) move_rows(p.segment_ids, permuted.segment_ids, 1);
  return permuted;
}

// Inverse of permute_tokens on a result: row t of `r` goes back to row order[t].
Result unpermute_tokens(const Result& r, const Problem& p, const std::vector<int64_t>& order) {
  Result back = r;
  const auto move_rows = [&](const std::vector<double>& from, std::vector<double>& to, int64_t width) {
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t t = 0; t < p.S; ++t) {
        std::copy_n(from.begin() + (b * p.S + t) * width, width, to.begin() + (b * p.S + order[t]) * width);
      }
    }
  };
  move_rows(r.out, back.out, p.H * p.d);
  move_rows(r.dq, back.dq, p.H * p.d);
  move_rows(r.dk, back.dk, p.K * p.d);
  move_rows(r.dv, back.dv, p.K * p.d);
  // lse is [B,H,S]: token index is the innermost one.
  for (int64_t bh = 0; bh < p.B * p.H; ++bh) {
    for (int64_t t = 0; t < p.S; ++t) back.lse[bh * p.S + order[t]] = r.lse[bh * p.S + t];
  }
  return back;
}

std::vector<int64_t> random_order(int64_t S, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(S));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 generator(seed);
  std::shuffle(order.begin(), order.end(), generator);
  return order;
}

TEST(Attention, ReferenceBackwardMatchesFiniteDifferences) {
  // GQA (H=4, K=2); sequence 1 packs two documents so the segment mask is exercised too.
  Problem p = make_problem(2, 7, 4, 2, 4, 11);
  p.segment_ids = {0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 5, 5, 5, 5};
  for (int64_t i = 10; i < 14; ++i) p.positions[static_cast<size_t>(i)] -= 3;
  const std::vector<double> weights = random_values(p.q.size(), 99);
  std::vector<double> out(p.q.size()), lse(static_cast<size_t>(p.B * p.H * p.S));
  const auto loss = [&] {
    attention_reference_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(),
                                p.positions.data(), p.segments(), p.B, p.S, p.H, p.K, p.d);
    return weighted_sum(out, weights);
  };
  loss();
  std::vector<double> dq(p.q.size()), dk(p.k.size()), dv(p.v.size());
  attention_reference_backward(dq.data(), dk.data(), dv.data(), weights.data(), out.data(), lse.data(),
                               p.q.data(), p.k.data(), p.v.data(), p.positions.data(), p.segments(), p.B, p.S,
                               p.H, p.K, p.d);
  const double bound = 1e-7;
  const double error_q = relative_error(dq, numeric_gradient(loss, p.q));
  const double error_k = relative_error(dk, numeric_gradient(loss, p.k));
  const double error_v = relative_error(dv, numeric_gradient(loss, p.v));
  report_error("reference dq vs finite differences", error_q, bound);
  report_error("reference dk vs finite differences", error_k, bound);
  report_error("reference dv vs finite differences", error_v, bound);
  EXPECT_LE(error_q, bound);
  EXPECT_LE(error_k, bound);
  EXPECT_LE(error_v, bound);
}

TEST(Attention, FastMatchesReference) {
  struct Shape {
    int64_t B, S, H, K, d;
  };
  // GQA, MHA and single-kv-head shapes; S not a multiple of the 64-row tile; d up to 128.
  // d = 300 exercises the widths beyond one packed slice (256) and the column tail that is no multiple of 16.
  const Shape shapes[] = {
      {2, 37, 4, 2, 8}, {1, 70, 4, 4, 64}, {1, 129, 4, 1, 128}, {2, 129, 2, 1, 8}, {1, 70, 2, 1, 300}};
  uint64_t seed = 100;
  for (const Shape& s : shapes) {
    const Problem p = make_problem(s.B, s.S, s.H, s.K, s.d, seed += 10);
    const std::string what = "B" + std::to_string(s.B) + " S" + std::to_string(s.S) + " H" +
                             std::to_string(s.H) + " K" + std::to_string(s.K) + " d" + std::to_string(s.d);
    expect_close(run_fast(p), run_reference(p), what, 1e-5);
  }
}

TEST(Attention, ArbitraryPositionsAndSegmentsMatchReference) {
  // Unsorted positions with repeats and gaps, three interleaved segments: no tile can rely on order.
  Problem p = make_problem(2, 150, 4, 2, 16, 300);
  std::mt19937_64 generator(301);
  std::uniform_int_distribution<int32_t> position(0, 120), segment(0, 2);
  p.segment_ids.resize(p.positions.size());
  for (size_t t = 0; t < p.positions.size(); ++t) {
    p.positions[t] = position(generator);
    p.segment_ids[t] = segment(generator);
  }
  expect_close(run_fast(p), run_reference(p), "random positions and segments", 1e-5);
}

TEST(Attention, PositionsNeedNotStartAtZero) {
  // Positions 100, 103, 106, ...: only their order matters, so the result equals the 0..S-1 run.
  const Problem p = make_problem(1, 100, 4, 2, 32, 400);
  Problem shifted = p;
  for (int32_t& position : shifted.positions) position = 100 + 3 * position;
  const Result fast_shifted = run_fast(shifted);
  expect_close(fast_shifted, run_reference(shifted), "offset positions vs reference", 1e-5);
  expect_close(fast_shifted, run_fast(p), "offset positions vs 0..S-1", 1e-6);
}

TEST(Attention, PermutedTokensGiveSameResult) {
  // Context-parallel reorders tokens; with positions moving along, outputs and gradients follow the tokens.
  for (const bool packed : {false, true}) {
    Problem p = make_problem(2, 150, 4, 2, 16, 500);
    if (packed) {
      p.segment_ids.resize(p.positions.size());
      for (size_t t = 0; t < p.positions.size(); ++t) p.segment_ids[t] = (t % 150) < 60 ? 1 : 2;
    }
    const std::vector<int64_t> order = random_order(p.S, packed ? 501 : 502);
    const Result direct = run_fast(p);
    const Result permuted = unpermute_tokens(run_fast(permute_tokens(p, order)), p, order);
    expect_close(permuted, direct, packed ? "permuted packed tokens" : "permuted tokens", 2e-6);
  }
}

TEST(Attention, PackedDocumentsMatchSeparateRuns) {
  // Two documents of 50 and 83 tokens in one row, positions restarting at 0: without the segment mask the
  // second document would see the first one's early tokens.
  const int64_t first = 50, second = 83, H = 4, K = 2, d = 16;
  const Problem a = make_problem(1, first, H, K, d, 600);
  const Problem b = make_problem(1, second, H, K, d, 610);
  Problem packed = make_problem(1, first + second, H, K, d, 620);
  const auto concat = [](const std::vector<double>& x, const std::vector<double>& y) {
    std::vector<double> joined = x;
    joined.insert(joined.end(), y.begin(), y.end());
    return joined;
  };
  packed.q = concat(a.q, b.q);
  packed.k = concat(a.k, b.k);
  packed.v = concat(a.v, b.v);
  packed.dout = concat(a.dout, b.dout);
  packed.positions = a.positions;
  packed.positions.insert(packed.positions.end(), b.positions.begin(), b.positions.end());
  packed.segment_ids.assign(static_cast<size_t>(first), 7);
  packed.segment_ids.resize(static_cast<size_t>(first + second), 8);
  const Result together = run_fast(packed);
  const Result ra = run_fast(a), rb = run_fast(b);
  Result separate{
      concat(ra.out, rb.out), {}, concat(ra.dq, rb.dq), concat(ra.dk, rb.dk), concat(ra.dv, rb.dv)};
  for (int64_t h = 0; h < H; ++h) {  // lse is [B,H,S]: interleave the two documents per head
    separate.lse.insert(separate.lse.end(), ra.lse.begin() + h * first, ra.lse.begin() + (h + 1) * first);
    separate.lse.insert(separate.lse.end(), rb.lse.begin() + h * second, rb.lse.begin() + (h + 1) * second);
  }
  expect_close(together, separate, "packed vs separate documents", 1e-6);
}

TEST(Attention, BitwiseIndependentOfThreadCount) {
  // One thread takes the owner schedule, three threads with B*K = 2 owners take the split schedule; both
  // must add the same terms in the same order.
  // d = 300 also covers scores accumulated over several packed slices.
  for (const int64_t d : {16, 300}) {
    Problem p = make_problem(1, 200, 4, 2, d, 700);
    p.segment_ids.assign(p.positions.size(), 0);
    std::fill(p.segment_ids.begin() + 120, p.segment_ids.end(), 1);
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const Result one = run_fast(p);
    omp_set_num_threads(3);
    const Result three = run_fast(p);
    omp_set_num_threads(saved_threads);
    EXPECT_EQ(one.out, three.out) << "d=" << d;
    EXPECT_EQ(one.lse, three.lse) << "d=" << d;
    EXPECT_EQ(one.dq, three.dq) << "d=" << d;
    EXPECT_EQ(one.dk, three.dk) << "d=" << d;
    EXPECT_EQ(one.dv, three.dv) << "d=" << d;
  }
}

// Decoding a sequence token by token (each step appending to the caches) gives, at every position, the
// causal attention of that token over the sequence so far: the reference's row, per head.
TEST(Attention, DecodeStepsMatchTheCausalReference) {
  for (const auto& [H, K] : {std::pair<int64_t, int64_t>{4, 2}, {4, 1}, {2, 2}}) {
    const int64_t S = 20, d = 16;
    const Problem p = make_problem(1, S, H, K, d, 700 + static_cast<uint64_t>(H * 10 + K));
    const Result reference = run_reference(p);
    const std::vector<float> q = to_float(p.q), k = to_float(p.k), v = to_float(p.v);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // Caches one row longer than the sequence: the last row must stay untouched.
    std::vector<float> key_cache(static_cast<size_t>((S + 1) * K * d), nan), value_cache = key_cache;
    std::vector<float> scores(static_cast<size_t>(S + 1), nan), out(static_cast<size_t>(H * d), nan);
    for (int64_t i = 0; i < S; ++i) {
      attention_decode(out.data(), key_cache.data(), value_cache.data(), scores.data(), q.data() + i * H * d,
                       k.data() + i * K * d, v.data() + i * K * d, i, H, K, d);
      const auto begin = reference.out.begin() + i * H * d;
      const std::vector<double> expected(begin, begin + H * d);
      // relative_error skips NaN: a row the kernel forgot to write is checked apart.
      EXPECT_TRUE(std::none_of(out.begin(), out.end(), [](float x) { return std::isnan(x); }));
      EXPECT_LT(relative_error(to_double(out), expected), 1e-5) << "H" << H << " K" << K << " position " << i;
    }
    EXPECT_TRUE(std::isnan(key_cache.back()) && std::isnan(value_cache.back()));
  }
}

}  // namespace
