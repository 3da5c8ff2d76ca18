// The CUDA attention kernels against the cpu kernels of the same name: forward (out, lse) and backward
// (dq, dk, dv) on grouped-query shapes with sequence lengths that are not tile multiples and head widths from
// every width bucket, with plain positions, packed documents (segments, positions restarting at 0) and a
// shuffled token order (as context parallelism reorders tokens, positions and segment ids travelling along).
// The bf16 tensor-core kernels (attention_*_bf16) against the double reference within the bound of the cpu
// bf16 kernels (kernels/attention_bf16_bound.h), and against the cpu bf16 kernels themselves where this
// CPU has them; both bitwise deterministic. Last, the kernels' speed at the models' shapes (printed only).
// Legend: B batch, S sequence, H query heads, K kv heads, d head width.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "kernels/attention_bf16_bound.h"
#include "meshtrain/core/cpu_features.h"
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

// One problem's device inputs (normal values, q twice as large: a sharper softmax), dout, and the outputs of
// forward and backward (the backward taking the forward's out and lse), for the tests that run the CUDA
// kernels without a cpu comparison.
struct DeviceProblem {
  DeviceProblem(const Shape& problem_shape, const Tokens& tokens)
      : shape(problem_shape),
        inputs(normal_values(q_count(), 1, 2.0f), normal_values(kv_count(), 2), normal_values(kv_count(), 3),
               tokens),
        dout(normal_values(q_count(), 4)),
        out(q_count()),
        lse(lse_count()),
        dq(q_count()),
        dk(kv_count()),
        dv(kv_count()),
        scratch(lse_count()) {}
  size_t q_count() const { return static_cast<size_t>(shape.B * shape.S * shape.H * shape.d); }
  size_t kv_count() const { return static_cast<size_t>(shape.B * shape.S * shape.K * shape.d); }
  size_t lse_count() const { return static_cast<size_t>(shape.B * shape.H * shape.S); }
  void forward(kernels::AttentionForward* kernel) {
    kernel(out.get(), lse.get(), inputs.q.get(), inputs.k.get(), inputs.v.get(), inputs.positions.get(),
           inputs.segment_ids(), shape.B, shape.S, shape.H, shape.K, shape.d);
  }
  void backward(kernels::AttentionBackward* kernel) {
    kernel(dq.get(), dk.get(), dv.get(), dout.get(), out.get(), lse.get(), inputs.q.get(), inputs.k.get(),
           inputs.v.get(), inputs.positions.get(), inputs.segment_ids(), shape.B, shape.S, shape.H, shape.K,
           shape.d, scratch.get());
  }
  std::vector<std::vector<float>> results() const {
    return {out.read(), lse.read(), dq.read(), dk.read(), dv.read()};
  }

  Shape shape;
  DeviceInputs inputs;
  DeviceBuffer<float> dout, out, lse, dq, dk, dv, scratch;  // scratch [B, H, S]
};

// No atomics, a fixed order in every sum: forward and backward run twice on the same inputs give bitwise the
// same outputs.
void expect_deterministic(kernels::AttentionForward* forward, kernels::AttentionBackward* backward,
                          const Shape& shape) {
  SCOPED_TRACE(describe(shape));
  DeviceProblem problem(shape, shuffled(packed_tokens(shape, 7), shape, 8));
  problem.forward(forward);
  problem.backward(backward);
  const std::vector<std::vector<float>> first = problem.results();
  problem.forward(forward);
  problem.backward(backward);
  const std::vector<std::vector<float>> second = problem.results();
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(first[i] == second[i]) << "output " << i;
}

TEST(CudaAttention, IsDeterministic) {
  MT_REQUIRE_GPU();
  expect_deterministic(cuda().attention_forward, cuda().attention_backward, {2, 150, 8, 2, 64});
}

// Head widths above 256 are refused before any launch.
TEST(CudaAttention, RefusesHeadsWiderThan256) {
  MT_REQUIRE_GPU();
  EXPECT_THROW(cuda().attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1,
                                        1, 1, 264),
               std::logic_error);
}

// ---- bf16 (tensor cores) ----

namespace bf16 = testing::attention_bf16;

// A self-attention problem of bf16-exact inputs (attention_bf16_bound.h's self_problem) over the given
// tokens.
bf16::Problem bf16_problem(const Shape& shape, const Tokens& tokens, uint64_t seed) {
  bf16::Problem problem = bf16::self_problem(shape.B, shape.S, shape.H, shape.K, shape.d, seed);
  problem.q_positions = problem.kv_positions = tokens.positions;
  problem.q_segment_ids = problem.kv_segment_ids = tokens.segment_ids;
  return problem;
}

// The bf16 forward and backward of one problem: the CUDA entries of the table, or the cpu bf16 kernels
// (on host memory). The backward takes the reference's out and lse, so its error is its own.
bf16::Result run_bf16_cuda(const bf16::Problem& p, const bf16::Expected& reference) {
  const Shape shape{p.B, p.Sq, p.H, p.K, p.d};
  const Tokens tokens{p.q_positions, p.q_segment_ids};
  const size_t q_count = p.q.size(), kv_count = p.k.size(), lse_count = reference.value.lse.size();
  const DeviceInputs inputs(testing::to_float(p.q), testing::to_float(p.k), testing::to_float(p.v), tokens);
  DeviceBuffer<float> out(std::vector<float>(q_count, kUnwritten)),
      lse(std::vector<float>(lse_count, kUnwritten));
  cuda().attention_forward_bf16(out.get(), lse.get(), inputs.q.get(), inputs.k.get(), inputs.v.get(),
                                inputs.positions.get(), inputs.segment_ids(), shape.B, shape.S, shape.H,
                                shape.K, shape.d);
  const DeviceBuffer<float> reference_out(testing::to_float(reference.value.out)),
      reference_lse(testing::to_float(reference.value.lse)), dout(testing::to_float(p.dout));
  DeviceBuffer<float> dq(std::vector<float>(q_count, kUnwritten)),
      dk(std::vector<float>(kv_count, kUnwritten)), dv(std::vector<float>(kv_count, kUnwritten)),
      scratch(lse_count);
  cuda().attention_backward_bf16(dq.get(), dk.get(), dv.get(), dout.get(), reference_out.get(),
                                 reference_lse.get(), inputs.q.get(), inputs.k.get(), inputs.v.get(),
                                 inputs.positions.get(), inputs.segment_ids(), shape.B, shape.S, shape.H,
                                 shape.K, shape.d, scratch.get());
  return {testing::to_double(out.read()), testing::to_double(lse.read()), testing::to_double(dq.read()),
          testing::to_double(dk.read()), testing::to_double(dv.read())};
}

bf16::Result run_bf16_cpu(const bf16::Problem& p, const bf16::Expected& reference) {
  const std::vector<float> q = testing::to_float(p.q), k = testing::to_float(p.k), v = testing::to_float(p.v),
                           dout = testing::to_float(p.dout);
  const std::vector<float> reference_out = testing::to_float(reference.value.out),
                           reference_lse = testing::to_float(reference.value.lse);
  std::vector<float> out(q.size()), lse(reference_lse.size()), dq(q.size()), dk(k.size()), dv(v.size()),
      scratch(reference_lse.size());
  // The bf16 kernels the cpu table runs on this CPU (AMX or AVX512-BF16).
  const kernels::KernelBackend& cpu = kernels::cpu_backend();
  cpu.attention_forward_bf16(out.data(), lse.data(), q.data(), k.data(), v.data(), p.q_positions.data(),
                             p.q_segments(), p.B, p.Sq, p.H, p.K, p.d);
  cpu.attention_backward_bf16(dq.data(), dk.data(), dv.data(), dout.data(), reference_out.data(),
                              reference_lse.data(), q.data(), k.data(), v.data(), p.q_positions.data(),
                              p.q_segments(), p.B, p.Sq, p.H, p.K, p.d, scratch.data());
  return {testing::to_double(out), testing::to_double(lse), testing::to_double(dq), testing::to_double(dk),
          testing::to_double(dv)};
}

// A bound twice as wide: two results each within the bound of the reference are within it of each other.
bf16::Expected doubled_bound(bf16::Expected bound) {
  for (bf16::Result* part : {&bound.first, &bound.magnitude}) {
    for (std::vector<double>* sums : {&part->out, &part->lse, &part->dq, &part->dk, &part->dv}) {
      for (double& sum : *sums) sum *= 2.0;
    }
  }
  return bound;
}

// The CUDA bf16 kernels within the bound of the double reference; where this CPU runs the cpu bf16 kernels,
// within twice the bound of them too (they round at the same points but take exp and the float32 sums in
// different orders, so bitwise equality is not expected).
void check_bf16_problem(const Shape& shape, const Tokens& tokens, uint64_t seed) {
  const std::string what = describe(shape) + (tokens.segment_ids.empty() ? "" : " packed");
  SCOPED_TRACE(what);
  const bf16::Problem problem = bf16_problem(shape, tokens, seed);
  const bf16::Expected expected = bf16::run_reference(problem);
  const bf16::Result gpu = run_bf16_cuda(problem, expected);
  bf16::expect_bf16_close(gpu, expected, "cuda " + what);
  if (!cpu_features().avx512_bf16) {
    std::printf("  (no cpu bf16 kernels on this CPU: %s; the reference check above stands alone)\n",
                cpu_features().describe().c_str());
    return;
  }
  const bf16::Result cpu = run_bf16_cpu(problem, expected);
  bf16::Expected around_cpu = doubled_bound(expected);
  around_cpu.value = cpu;
  bf16::expect_bf16_close(gpu, around_cpu, "cuda - cpu " + what);
}

// The cpu bf16 tests' shapes that the CUDA kernels take (d up to 256: 192 runs the float32 kernels, so it
// checks the fallback), each width bucket's edges (5, 8, 64 in the 64 bucket; 80, 128 in the 128 bucket),
// ragged S (1, 37, 65, 70, 100, 129, 130: never a multiple of the 64- and 32-token tiles but one past them),
// GQA groups of 1 to 4, and the models' heads: gpt2-124m (12 heads of 64) and qwen3-0.6b (16 query heads,
// 8 kv heads, 128 wide).
const std::vector<Shape>& bf16_shapes() {
  static const std::vector<Shape> list{{2, 37, 4, 2, 8},    {1, 70, 4, 4, 64},  {1, 129, 4, 1, 128},
                                       {2, 129, 2, 1, 8},   {1, 100, 2, 1, 80}, {1, 130, 2, 2, 192},
                                       {1, 65, 3, 1, 5},    {2, 1, 2, 1, 64},   {1, 150, 12, 12, 64},
                                       {1, 150, 16, 8, 128}};
  return list;
}

TEST(CudaAttentionBf16, WithinBf16BoundWithPlainPositions) {
  MT_REQUIRE_GPU();
  uint64_t seed = 1000;
  for (const Shape& shape : bf16_shapes()) check_bf16_problem(shape, plain_tokens(shape), seed += 10);
}

TEST(CudaAttentionBf16, WithinBf16BoundWithPackedDocuments) {
  MT_REQUIRE_GPU();
  uint64_t seed = 2000;
  for (const Shape& shape : bf16_shapes()) {
    seed += 10;
    check_bf16_problem(shape, packed_tokens(shape, static_cast<uint32_t>(seed + 5)), seed);
  }
}

// Context parallelism's token order: positions (and documents) shuffled within each sequence.
TEST(CudaAttentionBf16, WithinBf16BoundWithShuffledPositions) {
  MT_REQUIRE_GPU();
  uint64_t seed = 3000;
  for (const Shape& shape : bf16_shapes()) {
    seed += 10;
    const auto token_seed = static_cast<uint32_t>(seed);
    check_bf16_problem(shape, shuffled(plain_tokens(shape), shape, token_seed + 5), seed);
    check_bf16_problem(shape, shuffled(packed_tokens(shape, token_seed + 6), shape, token_seed + 7),
                       seed + 1);
  }
}

// Both widths, GQA, packed documents in a shuffled order.
TEST(CudaAttentionBf16, IsDeterministic) {
  MT_REQUIRE_GPU();
  for (const Shape& shape : {Shape{2, 150, 8, 2, 64}, Shape{1, 133, 4, 2, 128}})
    expect_deterministic(cuda().attention_forward_bf16, cuda().attention_backward_bf16, shape);
}

// ---- speed (printed, never a failure) ----

// Seconds per call of `run`, the median of 5 after one warm-up, the device synchronised around each.
template <class Run>
double seconds_per_call(const Run& run) {
  std::vector<double> times;
  for (int repeat = 0; repeat < 6; ++repeat) {
    cuda().device_synchronize();
    const auto start = std::chrono::steady_clock::now();
    run();
    cuda().device_synchronize();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  times.erase(times.begin());
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The attention kernels at the models' training shapes (causal, one document): GFLOP/s by the usual count,
// forward 4 B H S^2 d / 2 (two products, half the pairs visible) and backward 2.5 times that (five
// products; these kernels compute seven, recomputing S and dP in the dq pass). float32 and bf16 entries,
// so one run shows the tensor cores' gain. Lines start "attention speed" (tests/gpu/run.sh collects them).
TEST(CudaAttentionTiming, ModelShapes) {
  MT_REQUIRE_GPU();
  struct Case {
    const char* model;
    Shape shape;
  };
  for (const Case& c :
       {Case{"gpt2-124m", {16, 1024, 12, 12, 64}}, Case{"qwen3-0.6b", {8, 1024, 16, 8, 128}}}) {
    const Shape& shape = c.shape;
    DeviceProblem problem(shape, plain_tokens(shape));
    const double forward_flops = 2.0 * static_cast<double>(shape.B * shape.H * shape.S * shape.S * shape.d);
    const struct {
      const char* dtype;
      kernels::AttentionForward* forward;
      kernels::AttentionBackward* backward;
    } entries[] = {{"float32", cuda().attention_forward, cuda().attention_backward},
                   {"bf16", cuda().attention_forward_bf16, cuda().attention_backward_bf16}};
    for (const auto& entry : entries) {
      const double forward = seconds_per_call([&] { problem.forward(entry.forward); });
      const double backward = seconds_per_call([&] { problem.backward(entry.backward); });
      std::printf("attention speed %s %s (%s): forward %.3f ms %.0f GFLOP/s, backward %.3f ms %.0f GFLOP/s\n",
                  c.model, describe(shape).c_str(), entry.dtype, forward * 1e3, forward_flops / forward / 1e9,
                  backward * 1e3, 2.5 * forward_flops / backward / 1e9);
    }
  }
}

}  // namespace
}  // namespace meshtrain::gpu_test
