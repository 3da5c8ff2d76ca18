// Attention over separate query and key / value token sets (kernels/cpu/attention.h, context_attention_*):
// the reference against finite differences, the fast kernels against the reference (including the ring's
// accumulate / merge and queries that see no key), and the property context parallelism rests on: shards
// of a sequence under every reorder, each attending to the gathered keys and values or running the ring
// schedule of model/parallel/context_attention.h on threads that pass blocks to each other, reproduce the
// single-rank attention of the natural sequence.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/data/context_reorder.h"
#include "meshtrain/kernels/cpu/attention.h"
#include "meshtrain/kernels/cpu/backend.h"
#include "meshtrain/model/parallel/context_attention.h"

namespace {

using meshtrain::context_reorder_name;
using meshtrain::ContextLayout;
using meshtrain::ContextReorder;
using meshtrain::DType;
using meshtrain::ring_attention_backward;
using meshtrain::ring_attention_forward;
using meshtrain::RingAttentionArguments;
using meshtrain::shape_of;
using meshtrain::TensorView;
using meshtrain::kernels::attention_backward;
using meshtrain::kernels::attention_backward_scratch_floats;
using meshtrain::kernels::attention_forward;
using meshtrain::kernels::attention_reference_backward;
using meshtrain::kernels::attention_reference_forward;
using meshtrain::kernels::context_attention_backward;
using meshtrain::kernels::context_attention_backward_scratch_floats;
using meshtrain::kernels::context_attention_forward;
using meshtrain::kernels::context_attention_reference_backward;
using meshtrain::kernels::context_attention_reference_forward;
using meshtrain::kernels::context_attention_reference_merge;
using meshtrain::kernels::ContextRing;
using meshtrain::kernels::cpu_backend;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::report_error;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();

// Values rounded to float, so the float kernels and the double reference see identical inputs.
std::vector<double> float_exact(std::vector<double> values, double magnitude) {
  for (double& value : values) value = static_cast<double>(static_cast<float>(value * magnitude));
  return values;
}

// One problem: a query set and a key / value set of B sequences.
struct Problem {
  int64_t B, Sq, Skv, H, K, d;
  std::vector<double> q, dout, k, v;    // q, dout [B,Sq,H,d]; k, v [B,Skv,K,d]
  std::vector<int32_t> q_positions;     // [B,Sq]
  std::vector<int32_t> q_segment_ids;   // [B,Sq] or empty (= nullptr)
  std::vector<int32_t> kv_positions;    // [B,Skv]
  std::vector<int32_t> kv_segment_ids;  // [B,Skv] or empty (= nullptr)

  const int32_t* q_segments() const { return q_segment_ids.empty() ? nullptr : q_segment_ids.data(); }
  const int32_t* kv_segments() const { return kv_segment_ids.empty() ? nullptr : kv_segment_ids.data(); }
};

// Random values; positions uniform in [0, max_position], segment ids in [0, segments) (none when 0).
Problem make_problem(int64_t B, int64_t Sq, int64_t Skv, int64_t H, int64_t K, int64_t d,
                     int32_t max_position, int32_t segments, uint64_t seed) {
  Problem p{B, Sq, Skv, H, K, d, {}, {}, {}, {}, {}, {}, {}, {}};
  const auto q_count = static_cast<size_t>(B * Sq * H * d), kv_count = static_cast<size_t>(B * Skv * K * d);
  p.q = float_exact(random_values(q_count, seed), 2.0);  // sharper softmax than q ~ k
  p.dout = float_exact(random_values(q_count, seed + 1), 1.0);
  p.k = float_exact(random_values(kv_count, seed + 2), 1.0);
  p.v = float_exact(random_values(kv_count, seed + 3), 1.0);
  std::mt19937_64 generator(seed + 4);
  std::uniform_int_distribution<int32_t> position(0, max_position), segment(0, std::max(segments - 1, 0));
  const auto fill = [&](std::vector<int32_t>& positions, std::vector<int32_t>& segment_ids, int64_t count) {
    positions.resize(static_cast<size_t>(count));
    for (int32_t& value : positions) value = position(generator);
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
  std::vector<double> out, lse, dq, dk, dv;  // out, dq [B,Sq,H,d]; lse [B,H,Sq]; dk, dv [B,Skv,K,d]
};

Result run_reference(const Problem& p) {
  Result r{std::vector<double>(p.q.size()), std::vector<double>(static_cast<size_t>(p.B * p.H * p.Sq)),
           std::vector<double>(p.q.size()), std::vector<double>(p.k.size()), std::vector<double>(p.v.size())};
  context_attention_reference_forward(r.out.data(), r.lse.data(), p.q.data(), p.k.data(), p.v.data(),
                                      p.q_positions.data(), p.q_segments(), p.kv_positions.data(),
                                      p.kv_segments(), p.B, p.Sq, p.Skv, p.H, p.K, p.d);
  context_attention_reference_backward(r.dq.data(), r.dk.data(), r.dv.data(), p.dout.data(), r.out.data(),
                                       r.lse.data(), p.q.data(), p.k.data(), p.v.data(), p.q_positions.data(),
                                       p.q_segments(), p.kv_positions.data(), p.kv_segments(), p.B, p.Sq,
                                       p.Skv, p.H, p.K, p.d);
  return r;
}

Result run_fast(const Problem& p) {
  const std::vector<float> q = to_float(p.q), k = to_float(p.k), v = to_float(p.v), dout = to_float(p.dout);
  // Outputs start as NaN so a row the kernels forget to write shows up.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(q.size(), nan), lse(static_cast<size_t>(p.B * p.H * p.Sq), nan);
  std::vector<float> dq(q.size(), nan), dk(k.size(), nan), dv(v.size(), nan);
  std::vector<float> scratch(static_cast<size_t>(context_attention_backward_scratch_floats(p.B, p.Sq, p.H)),
                             nan);
  context_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p.q_positions.data(),
                            p.q_segments(), p.kv_positions.data(), p.kv_segments(), p.B, p.Sq, p.Skv, p.H,
                            p.K, p.d, false);
  context_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(),
                             k.data(), v.data(), p.q_positions.data(), p.q_segments(), p.kv_positions.data(),
                             p.kv_segments(), p.B, p.Sq, p.Skv, p.H, p.K, p.d, false, scratch.data());
  return Result{to_double(out), to_double(lse), to_double(dq), to_double(dk), to_double(dv)};
}

// Relative error of two lse tensors, which may hold -inf (a query that saw no key): relative_error would
// turn an infinite magnitude into 0, so -inf must sit at the same entries and the rest is compared finite.
double lse_error(const std::vector<double>& actual, const std::vector<double>& expected) {
  std::vector<double> a, e;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::isnan(actual[i]) || std::isnan(expected[i])) return std::numeric_limits<double>::infinity();
    if (std::isinf(actual[i]) || std::isinf(expected[i])) {
      if (actual[i] != expected[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    a.push_back(actual[i]);
    e.push_back(expected[i]);
  }
  return relative_error(a, e);
}

bool all_finite(const std::vector<double>& values) {
  return std::all_of(values.begin(), values.end(), [](double x) { return std::isfinite(x); });
}

void expect_close(const Result& actual, const Result& expected, const std::string& what, double bound) {
  for (const auto* tensor : {&actual.out, &actual.dq, &actual.dk, &actual.dv}) {
    EXPECT_TRUE(all_finite(*tensor)) << what << ": NaN or inf in an output";
  }
  const std::pair<const char*, double> errors[] = {{"out", relative_error(actual.out, expected.out)},
                                                   {"lse", lse_error(actual.lse, expected.lse)},
                                                   {"dq", relative_error(actual.dq, expected.dq)},
                                                   {"dk", relative_error(actual.dk, expected.dk)},
                                                   {"dv", relative_error(actual.dv, expected.dv)}};
  for (const auto& [name, error] : errors) {
    report_error(what + " " + name, error, bound);
    EXPECT_LE(error, bound) << what << " " << name;
  }
}

// Does query i of sequence b see any key of the problem?
bool sees_a_key(const Problem& p, int64_t b, int64_t i) {
  for (int64_t j = 0; j < p.Skv; ++j) {
    if (meshtrain::kernels::attention_detail::visible(
            p.q_positions.data() + b * p.Sq, p.q_segment_ids.empty() ? nullptr : p.q_segments() + b * p.Sq, i,
            p.kv_positions.data() + b * p.Skv,
            p.kv_segment_ids.empty() ? nullptr : p.kv_segments() + b * p.Skv, j))
      return true;
  }
  return false;
}

// Queries that see no key: out and dq rows exactly 0, lse exactly -inf. Returns how many there were, so a
// test can insist that it exercised some.
int64_t expect_blind_queries_zero(const Problem& p, const Result& r, const std::string& what) {
  int64_t blind = 0;
  for (int64_t b = 0; b < p.B; ++b) {
    for (int64_t i = 0; i < p.Sq; ++i) {
      if (sees_a_key(p, b, i)) continue;
      ++blind;
      for (int64_t h = 0; h < p.H; ++h) {
        EXPECT_EQ(r.lse[static_cast<size_t>((b * p.H + h) * p.Sq + i)], kNegativeInfinity) << what;
        for (int64_t c = 0; c < p.d; ++c) {
          const auto index = static_cast<size_t>(((b * p.Sq + i) * p.H + h) * p.d + c);
          EXPECT_EQ(r.out[index], 0.0) << what;
          EXPECT_EQ(r.dq[index], 0.0) << what;
        }
      }
    }
  }
  return blind;
}

TEST(ContextAttention, ReferenceBackwardMatchesFiniteDifferences) {
  // 5 queries over 7 keys, GQA (H=4, K=2), two segments: some queries see several keys, some none (their
  // position precedes every key of their segment, or their segment has no keys).
  Problem p = make_problem(2, 5, 7, 4, 2, 4, 6, 0, 11);
  p.q_positions = {3, 0, 6, 5, 2, /**/ 4, 1, 6, 3, 0};
  p.q_segment_ids = {0, 0, 1, 0, 2, /**/ 1, 1, 1, 0, 1};
  p.kv_positions = {1, 2, 4, 2, 5, 1, 3, /**/ 0, 4, 1, 2, 6, 3, 5};
  p.kv_segment_ids = {0, 1, 0, 0, 1, 1, 0, /**/ 1, 1, 0, 1, 0, 1, 1};
  const std::vector<double> weights = random_values(p.q.size(), 99);
  std::vector<double> out(p.q.size()), lse(static_cast<size_t>(p.B * p.H * p.Sq));
  const auto loss = [&] {
    context_attention_reference_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(),
                                        p.q_positions.data(), p.q_segments(), p.kv_positions.data(),
                                        p.kv_segments(), p.B, p.Sq, p.Skv, p.H, p.K, p.d);
    return weighted_sum(out, weights);
  };
  loss();
  Result r{out, lse, std::vector<double>(p.q.size()), std::vector<double>(p.k.size()),
           std::vector<double>(p.v.size())};
  context_attention_reference_backward(r.dq.data(), r.dk.data(), r.dv.data(), weights.data(), out.data(),
                                       lse.data(), p.q.data(), p.k.data(), p.v.data(), p.q_positions.data(),
                                       p.q_segments(), p.kv_positions.data(), p.kv_segments(), p.B, p.Sq,
                                       p.Skv, p.H, p.K, p.d);
  const double bound = 1e-7;
  const double error_q = relative_error(r.dq, numeric_gradient(loss, p.q));
  const double error_k = relative_error(r.dk, numeric_gradient(loss, p.k));
  const double error_v = relative_error(r.dv, numeric_gradient(loss, p.v));
  report_error("reference dq vs finite differences", error_q, bound);
  report_error("reference dk vs finite differences", error_k, bound);
  report_error("reference dv vs finite differences", error_v, bound);
  EXPECT_LE(error_q, bound);
  EXPECT_LE(error_k, bound);
  EXPECT_LE(error_v, bound);
  // Queries 1 (position 0, segment 0's keys start at 1) and 4 (segment 2 has no keys) of the first row
  // see nothing: exactly zero.
  EXPECT_EQ(expect_blind_queries_zero(p, r, "finite differences problem"), 2);
}

TEST(ContextAttention, ReferenceOnOneSetIsSelfAttention) {
  // With the query set equal to the key / value set the two references compute the same thing: the
  // self-attention reference is that case of the context one, so this checks how it passes its arguments
  // (both references are checked against finite differences on their own).
  Problem p = make_problem(2, 30, 30, 4, 2, 8, 20, 3, 40);
  p.kv_positions = p.q_positions;
  p.kv_segment_ids = p.q_segment_ids;
  p.k = float_exact(random_values(p.k.size(), 41), 1.0);
  const Result context = run_reference(p);
  Result self{std::vector<double>(p.q.size()), std::vector<double>(context.lse.size()),
              std::vector<double>(p.q.size()), std::vector<double>(p.k.size()),
              std::vector<double>(p.v.size())};
  attention_reference_forward(self.out.data(), self.lse.data(), p.q.data(), p.k.data(), p.v.data(),
                              p.q_positions.data(), p.q_segments(), p.B, p.Sq, p.H, p.K, p.d);
  attention_reference_backward(self.dq.data(), self.dk.data(), self.dv.data(), p.dout.data(), self.out.data(),
                               self.lse.data(), p.q.data(), p.k.data(), p.v.data(), p.q_positions.data(),
                               p.q_segments(), p.B, p.Sq, p.H, p.K, p.d);
  expect_close(context, self, "context reference vs self-attention reference", 1e-14);
}

TEST(ContextAttention, FastMatchesReference) {
  struct Shape {
    int64_t B, Sq, Skv, H, K, d;
    int32_t max_position, segments;
  };
  // Fewer and more keys than queries, neither a multiple of the 64-row tile; GQA, MHA and one kv head;
  // d = 300 spans two packed slices and a column tail; positions spread so that some queries see nothing.
  const Shape shapes[] = {{2, 37, 70, 4, 2, 8, 100, 0},
                          {1, 70, 129, 4, 4, 64, 200, 3},
                          {1, 129, 50, 4, 1, 128, 80, 2},
                          {2, 150, 140, 2, 1, 16, 120, 3},
                          {1, 70, 90, 2, 1, 300, 100, 2}};
  uint64_t seed = 100;
  int64_t blind = 0;
  for (const Shape& s : shapes) {
    const Problem p = make_problem(s.B, s.Sq, s.Skv, s.H, s.K, s.d, s.max_position, s.segments, seed += 10);
    const std::string what = "B" + std::to_string(s.B) + " Sq" + std::to_string(s.Sq) + " Skv" +
                             std::to_string(s.Skv) + " H" + std::to_string(s.H) + " K" + std::to_string(s.K) +
                             " d" + std::to_string(s.d);
    const Result fast = run_fast(p);
    expect_close(fast, run_reference(p), what, 1e-5);
    blind += expect_blind_queries_zero(p, fast, what);
  }
  EXPECT_GT(blind, 0) << "no shape had a query that sees no key";
}

TEST(ContextAttention, EmptyKeySetGivesZerosNotNaN) {
  // A ring block may hold no key that a query can see; an empty key set is the extreme case.
  Problem p = make_problem(1, 20, 0, 2, 1, 16, 10, 0, 150);
  const Result fast = run_fast(p);
  EXPECT_EQ(expect_blind_queries_zero(p, fast, "no keys"), 20);
}

// Splits the key / value set of `p` into consecutive blocks of the given sizes (in one sequence each).
std::vector<Problem> split_keys(const Problem& p, const std::vector<int64_t>& sizes) {
  std::vector<Problem> blocks;
  int64_t begin = 0;
  for (const int64_t size : sizes) {
    Problem block = p;
    block.Skv = size;
    block.k.clear(), block.v.clear(), block.kv_positions.clear(), block.kv_segment_ids.clear();
    for (int64_t b = 0; b < p.B; ++b) {
      const auto row = [&](int64_t width) { return (b * p.Skv + begin) * width; };
      block.k.insert(block.k.end(), p.k.begin() + row(p.K * p.d),
                     p.k.begin() + row(p.K * p.d) + size * p.K * p.d);
      block.v.insert(block.v.end(), p.v.begin() + row(p.K * p.d),
                     p.v.begin() + row(p.K * p.d) + size * p.K * p.d);
      block.kv_positions.insert(block.kv_positions.end(), p.kv_positions.begin() + row(1),
                                p.kv_positions.begin() + row(1) + size);
      if (!p.kv_segment_ids.empty()) {
        block.kv_segment_ids.insert(block.kv_segment_ids.end(), p.kv_segment_ids.begin() + row(1),
                                    p.kv_segment_ids.begin() + row(1) + size);
      }
    }
    blocks.push_back(std::move(block));
    begin += size;
  }
  return blocks;
}

TEST(ContextAttention, AccumulateMergesBlocksAndAddsGradients) {
  // 100 keys in blocks of 30, 1, 0 and 69: the forward folded block by block equals the one-call forward and
  // the reference merge of per-block references; the backward per block (accumulate) adds up to the
  // one-call backward, on top of what the gradient buffers held.
  const Problem p = make_problem(2, 80, 100, 4, 2, 16, 150, 2, 200);
  const std::vector<Problem> blocks = split_keys(p, {30, 1, 0, 69});
  const Result whole = run_fast(p);

  const std::vector<float> q = to_float(p.q), dout = to_float(p.dout);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(q.size(), nan), lse(whole.lse.size(), nan);
  std::vector<double> merged_out(q.size()), merged_lse(whole.lse.size());
  for (size_t index = 0; index < blocks.size(); ++index) {
    const Problem& block = blocks[index];
    const std::vector<float> k = to_float(block.k), v = to_float(block.v);
    context_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p.q_positions.data(),
                              p.q_segments(), block.kv_positions.data(), block.kv_segments(), p.B, p.Sq,
                              block.Skv, p.H, p.K, p.d, index > 0);
    const Result reference = run_reference(block);
    if (index == 0) {
      merged_out = reference.out;
      merged_lse = reference.lse;
    } else {
      context_attention_reference_merge(merged_out.data(), merged_lse.data(), reference.out.data(),
                                        reference.lse.data(), p.B, p.Sq, p.H, p.d);
    }
  }
  const double bound = 1e-5;
  const std::pair<const char*, double> forward_errors[] = {
      {"block-merged out vs one call", relative_error(to_double(out), whole.out)},
      {"block-merged lse vs one call", lse_error(to_double(lse), whole.lse)},
      {"block-merged out vs reference merge", relative_error(to_double(out), merged_out)},
      {"block-merged lse vs reference merge", lse_error(to_double(lse), merged_lse)},
      {"reference merge out vs one call", relative_error(merged_out, whole.out)}};
  for (const auto& [what, error] : forward_errors) {
    report_error(what, error, bound);
    EXPECT_LE(error, bound) << what;
  }

  // Backward: gradient buffers start at `initial`; each block adds its share with the final out and lse.
  const std::vector<double> initial_q = random_values(p.q.size(), 210);
  std::vector<float> dq = to_float(initial_q);
  std::vector<float> scratch(static_cast<size_t>(context_attention_backward_scratch_floats(p.B, p.Sq, p.H)));
  std::vector<double> dk, dv, expected_dk, expected_dv;
  int64_t begin = 0;
  for (size_t index = 0; index < blocks.size(); ++index) {
    const Problem& block = blocks[index];
    const std::vector<float> k = to_float(block.k), v = to_float(block.v);
    const std::vector<double> initial_k = random_values(block.k.size(), 220 + index);
    std::vector<float> block_dk = to_float(initial_k), block_dv = to_float(initial_k);
    context_attention_backward(dq.data(), block_dk.data(), block_dv.data(), dout.data(), out.data(),
                               lse.data(), q.data(), k.data(), v.data(), p.q_positions.data(), p.q_segments(),
                               block.kv_positions.data(), block.kv_segments(), p.B, p.Sq, block.Skv, p.H, p.K,
                               p.d, true, scratch.data());
    // Block rows of the whole problem's dk / dv, plus the initial values.
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t j = 0; j < block.Skv * p.K * p.d; ++j) {
        const auto here = static_cast<size_t>(b * block.Skv * p.K * p.d + j);
        const auto there = static_cast<size_t>((b * p.Skv + begin) * p.K * p.d + j);
        dk.push_back(block_dk[here]);
        dv.push_back(block_dv[here]);
        expected_dk.push_back(whole.dk[there] + initial_k[here]);
        expected_dv.push_back(whole.dv[there] + initial_k[here]);
      }
    }
    begin += block.Skv;
  }
  std::vector<double> expected_dq = whole.dq;
  for (size_t i = 0; i < expected_dq.size(); ++i) expected_dq[i] += initial_q[i];
  const std::pair<const char*, double> backward_errors[] = {
      {"block-accumulated dq vs initial + one call", relative_error(to_double(dq), expected_dq)},
      {"block-accumulated dk vs initial + one call", relative_error(dk, expected_dk)},
      {"block-accumulated dv vs initial + one call", relative_error(dv, expected_dv)}};
  for (const auto& [what, error] : backward_errors) {
    report_error(what, error, bound);
    EXPECT_LE(error, bound) << what;
  }
}

TEST(ContextAttention, BitwiseIndependentOfThreadCount) {
  // One thread takes the backward's owner schedule, three threads with B*K = 2 owners the split one.
  for (const int64_t d : {16, 300}) {
    const Problem p = make_problem(1, 130, 200, 4, 2, d, 150, 2, 300);
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

// ---- Context-parallel shards ----

// Rows `rows` (natural indices) of every sequence of x [B, S, width]: [B, rows.size(), width].
template <class T>
std::vector<T> take_rows(const std::vector<T>& x, int64_t B, int64_t S, int64_t width,
                         const std::vector<int64_t>& rows) {
  std::vector<T> taken;
  for (int64_t b = 0; b < B; ++b) {
    for (const int64_t row : rows) {
      const auto begin = x.begin() + (b * S + row) * width;
      taken.insert(taken.end(), begin, begin + width);
    }
  }
  return taken;
}

// x [B, S, width] rows rows[t] += part [B, rows.size(), width] row t.
void add_rows(std::vector<double>& x, int64_t B, int64_t S, int64_t width, const std::vector<int64_t>& rows,
              const std::vector<float>& part) {
  const auto n = static_cast<int64_t>(rows.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t c = 0; c < width; ++c) {
        x[static_cast<size_t>((b * S + rows[static_cast<size_t>(t)]) * width + c)] +=
            part[static_cast<size_t>((b * n + t) * width + c)];
      }
    }
  }
}

// A natural sequence of B rows: inputs of the single-rank attention.
struct Sequence {
  int64_t B, S, H, K, d;
  std::vector<float> q, dout, k, v;  // q, dout [B,S,H,d]; k, v [B,S,K,d]
  std::vector<int32_t> positions;    // [B,S]
  std::vector<int32_t> segment_ids;  // [B,S] or empty

  const int32_t* segments() const { return segment_ids.empty() ? nullptr : segment_ids.data(); }
};

// Positions 0..S-1, or with `packed` documents of the given lengths (cycled to fill S, the last one cut;
// sequence b starts at the b-th length) with positions restarting at 0 and one segment id per document.
Sequence make_sequence(int64_t B, int64_t S, int64_t H, int64_t K, int64_t d, bool packed,
                       const std::vector<int64_t>& document_lengths, uint64_t seed) {
  Sequence s{B, S, H, K, d, {}, {}, {}, {}, {}, {}};
  s.q = to_float(float_exact(random_values(static_cast<size_t>(B * S * H * d), seed), 2.0));
  s.dout = to_float(random_values(static_cast<size_t>(B * S * H * d), seed + 1));
  s.k = to_float(random_values(static_cast<size_t>(B * S * K * d), seed + 2));
  s.v = to_float(random_values(static_cast<size_t>(B * S * K * d), seed + 3));
  for (int64_t b = 0; b < B; ++b) {
    int64_t document = 0, start = 0;
    for (int64_t i = 0; i < S; ++i) {
      const auto length = document_lengths[static_cast<size_t>(b + document) % document_lengths.size()];
      if (packed && i - start == length) {
        ++document;
        start = i;
      }
      s.positions.push_back(static_cast<int32_t>(i - start));
      if (packed) s.segment_ids.push_back(static_cast<int32_t>(b * 1000 + document));
    }
  }
  return s;
}

enum class Strategy { all_gather, ring };

// C context ranks as threads for ring attention: each rank's passes go to the mailbox of the next rank, and
// its wait takes the messages of the previous rank from its own mailbox, in the order they were sent (the
// order MPI keeps between two ranks). Counts the passes each rank started.
class ThreadRing {
 public:
  explicit ThreadRing(int64_t ranks) : mailboxes_(static_cast<size_t>(ranks)), ranks_(ranks) {}

  ContextRing ring(int64_t rank) {
    Mailbox& next = mailboxes_[static_cast<size_t>((rank + 1) % ranks_)];
    Mailbox& own = mailboxes_[static_cast<size_t>(rank)];
    return {rank, ranks_,
            [&next, &own](const TensorView& send, const TensorView& receive, const std::string&) {
              const auto* bytes = static_cast<const uint8_t*>(send.data);
              {
                const std::lock_guard<std::mutex> lock(next.mutex);
                next.messages.emplace_back(bytes, bytes + send.bytes());
              }
              next.arrived.notify_all();
              own.receives.push_back(receive);  // only this rank's thread touches its receives
              ++own.passes;
            },
            [&own](const std::string&) {
              for (const TensorView& receive : own.receives) {
                std::unique_lock<std::mutex> lock(own.mutex);
                own.arrived.wait(lock, [&own] { return !own.messages.empty(); });
                ASSERT_EQ(own.messages.front().size(), receive.bytes())
                    << "a pass met a block of another size";
                std::memcpy(receive.data, own.messages.front().data(), receive.bytes());
                own.messages.pop_front();
              }
              own.receives.clear();
            },
            [] {}};  // a thread's pass is in the next mailbox at once: nothing to move along
  }
  int64_t passes(int64_t rank) const { return mailboxes_[static_cast<size_t>(rank)].passes; }

 private:
  struct Mailbox {
    std::mutex mutex;
    std::condition_variable arrived;
    std::deque<std::vector<uint8_t>> messages;  // from the previous rank, oldest first
    std::vector<TensorView> receives;           // this rank's passes waiting for their block
    int64_t passes = 0;
  };
  std::vector<Mailbox> mailboxes_;
  int64_t ranks_;
};

// Runs the C shards of `s` under `layout` with the context kernels and assembles, in natural order, out,
// lse and dq per token and dk, dv summed over the shards (what the reduce-scatter, or the ring's travelling
// gradients, deliver): a Result over the natural sequence.
//   all-gather: each rank's queries against every rank's tokens (in rank order) in one call each way,
//     accumulate = false; dk, dv of the gathered set are summed over ranks.
//   ring: the engine's schedule (model/parallel/context_attention.h) on C threads passing blocks through a
//     ThreadRing, forward then backward.
Result run_shards(const Sequence& s, const ContextLayout& layout, Strategy strategy) {
  const int64_t S = s.S, C = layout.context_ranks(), Sq = layout.rank_length(), B = s.B, H = s.H, K = s.K,
                d = s.d;
  std::vector<int64_t> order;  // natural index of each reordered position
  for (int64_t p = 0; p < S; ++p) order.push_back(layout.source(p));
  std::vector<std::vector<int64_t>> rank_rows;  // natural rows of each rank's tokens, in the rank's order
  for (int64_t r = 0; r < C; ++r) rank_rows.push_back(layout.rank_sources(r));
  // One token set in the layout the kernels take.
  struct Tokens {
    std::vector<float> q, dout, k, v;
    std::vector<int32_t> positions, segment_ids;
    const int32_t* segments() const { return segment_ids.empty() ? nullptr : segment_ids.data(); }
  };
  const auto tokens = [&](const std::vector<int64_t>& rows) {
    return Tokens{take_rows(s.q, B, S, H * d, rows),
                  take_rows(s.dout, B, S, H * d, rows),
                  take_rows(s.k, B, S, K * d, rows),
                  take_rows(s.v, B, S, K * d, rows),
                  take_rows(s.positions, B, S, 1, rows),
                  s.segment_ids.empty() ? std::vector<int32_t>{} : take_rows(s.segment_ids, B, S, 1, rows)};
  };
  const Tokens gathered = tokens(order);
  struct RankResult {
    std::vector<float> out, lse, dq, dk, dv;  // dk, dv: [B, S, K, d] gathered (all-gather) or own block
  };
  std::vector<RankResult> results(static_cast<size_t>(C));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto run_rank = [&](int64_t r, const ContextRing* ring) {
    const Tokens mine = tokens(rank_rows[static_cast<size_t>(r)]);
    RankResult& result = results[static_cast<size_t>(r)];
    result.out.assign(mine.q.size(), nan);
    result.lse.assign(static_cast<size_t>(B * H * Sq), nan);
    result.dq.assign(mine.q.size(), nan);
    std::vector<float> scratch(static_cast<size_t>(context_attention_backward_scratch_floats(B, Sq, H)), nan);
    if (strategy == Strategy::all_gather) {
      result.dk.assign(gathered.k.size(), nan);
      result.dv.assign(gathered.v.size(), nan);
      context_attention_forward(result.out.data(), result.lse.data(), mine.q.data(), gathered.k.data(),
                                gathered.v.data(), mine.positions.data(), mine.segments(),
                                gathered.positions.data(), gathered.segments(), B, Sq, S, H, K, d, false);
      context_attention_backward(result.dq.data(), result.dk.data(), result.dv.data(), mine.dout.data(),
                                 result.out.data(), result.lse.data(), mine.q.data(), gathered.k.data(),
                                 gathered.v.data(), mine.positions.data(), mine.segments(),
                                 gathered.positions.data(), gathered.segments(), B, Sq, S, H, K, d, false,
                                 scratch.data());
      return;
    }
    result.dk.assign(mine.k.size(), nan);
    result.dv.assign(mine.v.size(), nan);
    const int64_t kv_floats = B * Sq * K * d, token_fields = mine.segment_ids.empty() ? 1 : 2;
    const meshtrain::Shape kv_shape = shape_of({{"key_value", 2}, {"floats", kv_floats}});
    const meshtrain::Shape token_shape = shape_of({{"token_fields", token_fields}, {"tokens", B * Sq}});
    std::vector<std::vector<float>> kv(2, std::vector<float>(static_cast<size_t>(2 * kv_floats), nan));
    std::vector<std::vector<float>> d_kv = kv;
    std::vector<std::vector<int32_t>> token_blocks(
        2, std::vector<int32_t>(static_cast<size_t>(token_fields * B * Sq), -7));
    std::vector<float> d_kv_step(static_cast<size_t>(2 * kv_floats), nan);
    RingAttentionArguments a;
    a.B = B, a.L = Sq, a.H = H, a.K = K, a.d = d;
    a.q = mine.q.data(), a.k = mine.k.data(), a.v = mine.v.data();
    a.positions = mine.positions.data(), a.segment_ids = mine.segments();
    a.out = result.out.data(), a.lse = result.lse.data();
    for (size_t slot = 0; slot < 2; ++slot) {
      a.kv_blocks[slot] = {kv[slot].data(), DType::f32, kv_shape};
      a.d_kv_blocks[slot] = {d_kv[slot].data(), DType::f32, kv_shape};
      a.token_blocks[slot] = {token_blocks[slot].data(), DType::i32, token_shape};
    }
    a.dout = mine.dout.data();
    a.dq = result.dq.data(), a.dk = result.dk.data(), a.dv = result.dv.data();
    a.d_kv_step = d_kv_step.data();
    a.scratch = scratch.data();
    ring_attention_forward(*ring, cpu_backend(), a, "ring forward");
    ring_attention_backward(*ring, cpu_backend(), a, "ring backward");
  };
  if (strategy == Strategy::all_gather) {
    for (int64_t r = 0; r < C; ++r) run_rank(r, nullptr);
  } else {
    ThreadRing ring(C);
    std::vector<ContextRing> rings;
    for (int64_t r = 0; r < C; ++r) rings.push_back(ring.ring(r));
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < C; ++r)
      threads.emplace_back([&, r] { run_rank(r, &rings[static_cast<size_t>(r)]); });
    for (std::thread& thread : threads) thread.join();
    // K / V and the token fields pass C - 1 times each way, the dK / dV sums C times.
    for (int64_t r = 0; r < C; ++r) EXPECT_EQ(ring.passes(r), 2 * (C - 1) + 2 * (C - 1) + C) << "rank " << r;
  }

  Result natural{std::vector<double>(s.q.size()), std::vector<double>(static_cast<size_t>(B * H * S)),
                 std::vector<double>(s.q.size()), std::vector<double>(s.k.size()),
                 std::vector<double>(s.v.size())};
  for (int64_t r = 0; r < C; ++r) {
    const std::vector<int64_t>& rows = rank_rows[static_cast<size_t>(r)];
    const RankResult& result = results[static_cast<size_t>(r)];
    add_rows(natural.out, B, S, H * d, rows, result.out);
    add_rows(natural.dq, B, S, H * d, rows, result.dq);
    // all-gather: this rank's share of every token's dk / dv (the reduce-scatter's sum); ring: its own
    // block's complete dk / dv.
    add_rows(natural.dk, B, S, K * d, strategy == Strategy::all_gather ? order : rows, result.dk);
    add_rows(natural.dv, B, S, K * d, strategy == Strategy::all_gather ? order : rows, result.dv);
    for (int64_t bh = 0; bh < B * H; ++bh) {  // lse [B,H,S]: the token index is the innermost one
      for (int64_t t = 0; t < Sq; ++t) {
        natural.lse[static_cast<size_t>(bh * S + rows[static_cast<size_t>(t)])] =
            result.lse[static_cast<size_t>(bh * Sq + t)];
      }
    }
  }
  return natural;
}

Result run_single_rank(const Sequence& s) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(s.q.size(), nan), lse(static_cast<size_t>(s.B * s.H * s.S), nan);
  std::vector<float> dq(s.q.size(), nan), dk(s.k.size(), nan), dv(s.v.size(), nan);
  std::vector<float> scratch(
      static_cast<size_t>(attention_backward_scratch_floats(s.B, s.S, s.H, s.K, s.d, omp_get_max_threads())));
  attention_forward(out.data(), lse.data(), s.q.data(), s.k.data(), s.v.data(), s.positions.data(),
                    s.segments(), s.B, s.S, s.H, s.K, s.d);
  attention_backward(dq.data(), dk.data(), dv.data(), s.dout.data(), out.data(), lse.data(), s.q.data(),
                     s.k.data(), s.v.data(), s.positions.data(), s.segments(), s.B, s.S, s.H, s.K, s.d,
                     scratch.data());
  return Result{to_double(out), to_double(lse), to_double(dq), to_double(dk), to_double(dv)};
}

TEST(ContextAttention, ShardsOfEveryReorderMatchSingleRank) {
  // Each rank's S/C queries (original positions) against the gathered keys and values, or against the ring
  // of blocks passed between threads and merged, give the single-rank attention of the natural sequence:
  // out, lse, dq per token and dk, dv summed over the ranks. GQA (4 query heads over 2 kv heads); packed
  // documents include ones shorter than a chunk (g = 30 or 60) and ones crossing chunk boundaries.
  const std::vector<int64_t> documents = {17, 5, 90, 41, 3, 70};
  for (const int64_t C : {2, 4}) {
    for (const bool packed : {false, true}) {
      const Sequence s = make_sequence(2, 240, 4, 2, 16, packed, documents, 400 + static_cast<uint64_t>(C));
      const Result single = run_single_rank(s);
      for (const ContextReorder reorder :
           {ContextReorder::dual_chunk_swap, ContextReorder::striped, ContextReorder::none}) {
        const ContextLayout layout(reorder, s.S, C);
        for (const Strategy strategy : {Strategy::all_gather, Strategy::ring}) {
          const std::string what = std::string(strategy == Strategy::ring ? "ring" : "all-gather") + " " +
                                   context_reorder_name(reorder) + " C" + std::to_string(C) +
                                   (packed ? " packed" : "");
          expect_close(run_shards(s, layout, strategy), single, what, 2e-6);
        }
      }
    }
  }
}

}  // namespace
