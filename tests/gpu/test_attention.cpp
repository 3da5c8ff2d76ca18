// The CUDA attention kernels against the cpu kernels of the same name: forward (out, lse) and backward
// (dq, dk, dv) on grouped-query shapes with sequence lengths that are not tile multiples and head widths from
// every width bucket, with plain positions, packed documents (segments, positions restarting at 0) and a
// shuffled token order (as context parallelism reorders tokens, positions and segment ids travelling along).
// Legend: B batch, S sequence, H query heads, K kv heads, d head width.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "meshtrain/kernels/cpu/attention.h"

namespace meshtrain::gpu_test {
namespace {

struct Shape {
  int64_t B, S, H, K, d;
};

std::string describe(const Shape& shape) {
  return "B=" + std::to_string(shape.B) + " S=" + std::to_string(shape.S) + " H=" + std::to_string(shape.H) +
         " K=" + std::to_string(shape.K) + " d=" + std::to_string(shape.d);
}

// Per-token positions [B, S] and segment ids [B, S] (empty: none, nullptr to the kernels).
struct Tokens {
  std::vector<int32_t> positions, segment_ids;
};

// Positions 0..S-1 in every sequence, one segment.
Tokens plain_tokens(const Shape& shape) {
  Tokens tokens;
  tokens.positions.resize(static_cast<size_t>(shape.B * shape.S));
  for (int64_t b = 0; b < shape.B; ++b) {
    for (int64_t i = 0; i < shape.S; ++i)
      tokens.positions[static_cast<size_t>(b * shape.S + i)] = static_cast<int32_t>(i);
  }
  return tokens;
}

// Packed documents: each sequence is cut into documents of random lengths (1 to S / 3 + 1 tokens), each
// with its own segment id and positions restarting at 0, so a late key tile holds small positions.
Tokens packed_tokens(const Shape& shape, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_int_distribution<int64_t> length(1, shape.S / 3 + 1);
  Tokens tokens;
  tokens.positions.resize(static_cast<size_t>(shape.B * shape.S));
  tokens.segment_ids.resize(static_cast<size_t>(shape.B * shape.S));
  for (int64_t b = 0; b < shape.B; ++b) {
    int32_t segment = static_cast<int32_t>(b * 1000);  // ids need not start at 0 or be dense
    for (int64_t i = 0; i < shape.S; ++segment) {
      const int64_t end = std::min(shape.S, i + length(generator));
      for (int64_t position = 0; i < end; ++i, ++position) {
        tokens.positions[static_cast<size_t>(b * shape.S + i)] = static_cast<int32_t>(position);
        tokens.segment_ids[static_cast<size_t>(b * shape.S + i)] = segment;
      }
    }
  }
  return tokens;
}

// The tokens of every sequence in a random order (positions and segment ids move with them), as under
// context parallelism: masking must come from positions alone, never from indices.
Tokens shuffled(Tokens tokens, const Shape& shape, uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<size_t> order(static_cast<size_t>(shape.S));
  for (int64_t b = 0; b < shape.B; ++b) {
    std::iota(order.begin(), order.end(), static_cast<size_t>(b * shape.S));
    std::shuffle(order.begin(), order.end(), generator);
    const Tokens before = tokens;
    for (size_t i = 0; i < order.size(); ++i) {
      const size_t to = static_cast<size_t>(b * shape.S) + i;
      tokens.positions[to] = before.positions[order[i]];
      if (!tokens.segment_ids.empty()) tokens.segment_ids[to] = before.segment_ids[order[i]];
    }
  }
  return tokens;
}

// Tolerances, relative to the largest magnitude of the cpu tensor. Both sides compute in float32 but in
// different orders (tile order and fused multiply-adds on the GPU, SIMD partial sums on the cpu; expf against
// the cpu's polynomial exp), so each element carries rounding of about sqrt(terms) * 6e-8 times the size of
// its terms. The forward's out is a convex combination of v rows and lse is a single log-sum-exp, so 1e-4 of
// the largest value holds with a wide margin. A gradient element sums up to S * H / K terms of both signs
// that may cancel to near 0, so its error is bounded relative to the tensor's scale, not to itself: 1e-3 of
// the largest element (still far below any indexing or masking mistake, which moves elements by O(1) of it).
constexpr double kForwardTolerance = 1e-4;
constexpr double kGradientTolerance = 1e-3;

// max |gpu - cpu| <= tolerance * max(1, max |cpu|) over the tensor; NaN (or an unwritten sentinel) fails. The
// floor of 1 (inputs are O(1)) keeps a tensor that is rounding noise around 0 from being compared to its own
// noise: with S = 1, dq and dk are exactly 0 in real arithmetic (dS = dout . v - dout . out and out = v).
void expect_close_scaled(const std::vector<float>& gpu, const std::vector<float>& cpu, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double largest = 0.0;
  for (const float value : cpu) largest = std::max(largest, static_cast<double>(std::abs(value)));
  const double allowed = tolerance * std::max(largest, 1.0);
  double worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double error = std::abs(static_cast<double>(gpu[i]) - static_cast<double>(cpu[i]));
    if (!(error <= worst)) {  // NaN counts as worst
      worst = error;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, allowed) << what << ": element " << worst_at << " gpu " << gpu[worst_at] << " cpu "
                            << cpu[worst_at] << " (largest |cpu| " << largest << ")";
}

// Device copies of one problem's inputs. Segment ids travel as a one-element placeholder when there are none
// (a DeviceBuffer of nothing would copy from a null host pointer) and reach the kernels as nullptr.
struct DeviceInputs {
  DeviceInputs(const std::vector<float>& q_host, const std::vector<float>& k_host,
               const std::vector<float>& v_host, const Tokens& tokens)
      : q(q_host),
        k(k_host),
        v(v_host),
        positions(tokens.positions),
        segments(tokens.segment_ids.empty() ? std::vector<int32_t>(1, 0) : tokens.segment_ids),
        has_segments(!tokens.segment_ids.empty()) {}
  const int32_t* segment_ids() const { return has_segments ? segments.get() : nullptr; }

  DeviceBuffer<float> q, k, v;                // q [B,S,H,d]; k, v [B,S,K,d]
  DeviceBuffer<int32_t> positions, segments;  // [B,S]
  bool has_segments;
};

// A value no kernel computes here: an element the kernel forgot to write stays at it and fails the check.
constexpr float kUnwritten = 1e30f;

// Runs the cpu and CUDA forward and backward on one problem and compares every output. The backward of both
// takes the cpu forward's out and lse, so the gradient check sees the backward alone.
void check_problem(const Shape& shape, const Tokens& tokens, uint32_t seed) {
  SCOPED_TRACE(describe(shape) + (tokens.segment_ids.empty() ? " (one segment)" : " (packed documents)"));
  const auto q_count = static_cast<size_t>(shape.B * shape.S * shape.H * shape.d);
  const auto kv_count = static_cast<size_t>(shape.B * shape.S * shape.K * shape.d);
  const auto lse_count = static_cast<size_t>(shape.B * shape.H * shape.S);
  // q twice as large as k: a less uniform softmax, so masking mistakes show.
  const std::vector<float> q = normal_values(q_count, seed, 2.0f);
  const std::vector<float> k = normal_values(kv_count, seed + 1);
  const std::vector<float> v = normal_values(kv_count, seed + 2);
  const std::vector<float> dout = normal_values(q_count, seed + 3);
  const int32_t* cpu_segments = tokens.segment_ids.empty() ? nullptr : tokens.segment_ids.data();

  std::vector<float> out(q_count), lse(lse_count);
  kernels::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), tokens.positions.data(),
                             cpu_segments, shape.B, shape.S, shape.H, shape.K, shape.d);
  std::vector<float> dq(q_count), dk(kv_count), dv(kv_count), scratch(lse_count);
  kernels::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(),
                              k.data(), v.data(), tokens.positions.data(), cpu_segments, shape.B, shape.S,
                              shape.H, shape.K, shape.d, scratch.data());

  const DeviceInputs inputs(q, k, v, tokens);
  DeviceBuffer<float> gpu_out(std::vector<float>(q_count, kUnwritten));
  DeviceBuffer<float> gpu_lse(std::vector<float>(lse_count, kUnwritten));
  cuda().attention_forward(gpu_out.get(), gpu_lse.get(), inputs.q.get(), inputs.k.get(), inputs.v.get(),
                           inputs.positions.get(), inputs.segment_ids(), shape.B, shape.S, shape.H, shape.K,
                           shape.d);
  expect_close_scaled(gpu_out.read(), out, kForwardTolerance, "out");
  expect_close_scaled(gpu_lse.read(), lse, kForwardTolerance, "lse");

  const DeviceBuffer<float> cpu_out(out), cpu_lse(lse), gpu_dout(dout);
  DeviceBuffer<float> gpu_dq(std::vector<float>(q_count, kUnwritten));
  DeviceBuffer<float> gpu_dk(std::vector<float>(kv_count, kUnwritten));
  DeviceBuffer<float> gpu_dv(std::vector<float>(kv_count, kUnwritten));
  DeviceBuffer<float> gpu_scratch(lse_count);
  cuda().attention_backward(gpu_dq.get(), gpu_dk.get(), gpu_dv.get(), gpu_dout.get(), cpu_out.get(),
                            cpu_lse.get(), inputs.q.get(), inputs.k.get(), inputs.v.get(),
                            inputs.positions.get(), inputs.segment_ids(), shape.B, shape.S, shape.H, shape.K,
                            shape.d, gpu_scratch.get());
  expect_close_scaled(gpu_dq.read(), dq, kGradientTolerance, "dq");
  expect_close_scaled(gpu_dk.read(), dk, kGradientTolerance, "dk");
  expect_close_scaled(gpu_dv.read(), dv, kGradientTolerance, "dv");
}

// The brief's shapes: odd d in the smallest bucket, a 64-wide head without grouping, qwen3's 128 with four
// query heads per kv head; S never a multiple of a tile.
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> list{{2, 37, 4, 2, 24}, {1, 200, 6, 6, 64}, {2, 130, 8, 2, 128}};
  return list;
}

TEST(CudaAttention, MatchesCpuWithPlainPositions) {
  MT_REQUIRE_GPU();
  uint32_t seed = 10;
  for (const Shape& shape : shapes()) {
    check_problem(shape, plain_tokens(shape), seed);
    seed += 10;
  }
}

TEST(CudaAttention, MatchesCpuWithPackedDocuments) {
  MT_REQUIRE_GPU();
  uint32_t seed = 110;
  for (const Shape& shape : shapes()) {
    check_problem(shape, packed_tokens(shape, seed + 5), seed);
    seed += 10;
  }
}

TEST(CudaAttention, MatchesCpuWithShuffledTokenOrder) {
  MT_REQUIRE_GPU();
  uint32_t seed = 210;
  for (const Shape& shape : shapes()) {
    check_problem(shape, shuffled(plain_tokens(shape), shape, seed + 5), seed);
    seed += 10;
  }
}

TEST(CudaAttention, MatchesCpuWithShuffledPackedDocuments) {
  MT_REQUIRE_GPU();
  uint32_t seed = 310;
  for (const Shape& shape : shapes()) {
    check_problem(shape, shuffled(packed_tokens(shape, seed + 5), shape, seed + 6), seed);
    seed += 10;
  }
}

// Every width bucket and its edges: d = 8 and 32 (bucket 32), 33 (64), 96 (128), 200 and 256 (256), groups
// of 1 to 3 query heads per kv head, and S = 1 and S = 65 (one query beyond a 64-row tile).
TEST(CudaAttention, MatchesCpuAcrossHeadWidths) {
  MT_REQUIRE_GPU();
  const std::vector<Shape> list{{1, 70, 2, 1, 8},  {1, 1, 2, 2, 32},   {2, 65, 3, 1, 33},
                                {1, 97, 6, 2, 96}, {1, 45, 2, 1, 200}, {1, 65, 4, 2, 256}};
  uint32_t seed = 410;
  for (const Shape& shape : list) {
    check_problem(shape, plain_tokens(shape), seed);
    check_problem(shape, shuffled(packed_tokens(shape, seed + 5), shape, seed + 6), seed + 7);
    seed += 10;
  }
}

// No atomics: the same inputs give bitwise the same outputs, run after run.
TEST(CudaAttention, IsDeterministic) {
  MT_REQUIRE_GPU();
  const Shape shape{2, 150, 8, 2, 64};
  const Tokens tokens = shuffled(packed_tokens(shape, 7), shape, 8);
  const auto q_count = static_cast<size_t>(shape.B * shape.S * shape.H * shape.d);
  const auto kv_count = static_cast<size_t>(shape.B * shape.S * shape.K * shape.d);
  const auto lse_count = static_cast<size_t>(shape.B * shape.H * shape.S);
  const DeviceInputs inputs(normal_values(q_count, 1, 2.0f), normal_values(kv_count, 2),
                            normal_values(kv_count, 3), tokens);
  const DeviceBuffer<float> dout(normal_values(q_count, 4));
  DeviceBuffer<float> out(q_count), lse(lse_count), dq(q_count), dk(kv_count), dv(kv_count),
      scratch(lse_count);
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 2; ++run) {
    cuda().attention_forward(out.get(), lse.get(), inputs.q.get(), inputs.k.get(), inputs.v.get(),
                             inputs.positions.get(), inputs.segment_ids(), shape.B, shape.S, shape.H, shape.K,
                             shape.d);
    cuda().attention_backward(dq.get(), dk.get(), dv.get(), dout.get(), out.get(), lse.get(), inputs.q.get(),
                              inputs.k.get(), inputs.v.get(), inputs.positions.get(), inputs.segment_ids(),
                              shape.B, shape.S, shape.H, shape.K, shape.d, scratch.get());
    const std::vector<std::vector<float>> results{out.read(), lse.read(), dq.read(), dk.read(), dv.read()};
    if (run == 0) {
      first = results;
      continue;
    }
    for (size_t i = 0; i < results.size(); ++i) EXPECT_TRUE(results[i] == first[i]) << "output " << i;
  }
}

// Head widths above 256 are refused before any launch.
TEST(CudaAttention, RefusesHeadsWiderThan256) {
  MT_REQUIRE_GPU();
  EXPECT_THROW(cuda().attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1,
                                        1, 1, 264),
               std::logic_error);
}

}  // namespace
}  // namespace meshtrain::gpu_test
