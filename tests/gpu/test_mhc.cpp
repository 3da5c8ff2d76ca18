// The CUDA kernels of an mHC site against the cpu kernels of the same name on the same inputs: the
// coefficients and their parameter gradients, Sinkhorn forward and backward through every iteration (few
// iterations too, where each one changes the result at O(1e-1)), the collapse and the expand, the streams'
// entry and exit. Odd shapes; outputs pre-filled with NaN where the kernel must write and with random values
// where it must add; every backward run twice, bitwise equal (fixed reduction orders, no atomics).
// Tolerances are on gpu_test.h's metric |gpu - cpu| / (1 + |cpu|), each justified where defined.
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test.h"
#include "meshtrain/kernels/cpu/mhc_mix.h"
#include "meshtrain/kernels/cpu/sinkhorn.h"

namespace meshtrain::gpu_test {
namespace {

// Elementwise chains of a few operations (a sigmoid with expf against std::exp, <= 2 ulp each; sums over G
// <= 8 streams in the cpu's order): <= ~1e-6 on the metric; 1e-5 leaves a factor 10. A wrong stream, column
// or scale gives O(1e-1).
constexpr double kElementTolerance = 1e-5;
// Sums over D <= 257 (d_pre, d_post, d_mixing) or over N <= 300 tokens (the betas' and scales' gradients) in
// different orders (cpu: in order / simd lanes; GPU: a 256-thread tree or 32 lanes then in order): typical
// error ~sqrt(terms) 2^-24 |sum| on sums ~sqrt(terms), ~1e-6 on the metric; 1e-4 allows float summation's
// worst case over 300 terms with margin. A missed token or column is O(1).
constexpr double kReductionTolerance = 1e-4;
// Sinkhorn: the same float operations in the same order on both sides but for expf (<= 2 ulp against
// std::exp) and contracted multiply-adds, through 2 iterations stages of normalisations whose denominators
// are ~1 (no amplification): measured on the cpu, float against double stays below 1e-5 (forward) and 1e-4
// (backward) (tests/unit/kernels/test_sinkhorn.cpp); between two float implementations of the same order,
// 2e-5 and 1e-4. One iteration more or less changes the result by O(1e-1) at 2 or 3 iterations.
constexpr double kSinkhornTolerance = 2e-5;
constexpr double kSinkhornBackwardTolerance = 1e-4;

size_t elements(int64_t count) {
  return static_cast<size_t>(count);
}

std::string shape(int64_t N, int64_t G, int64_t D) {
  return "N=" + std::to_string(N) + " G=" + std::to_string(G) + " D=" + std::to_string(D);
}

// ---- Coefficients --------------------------------------------------------------------------------------

// h, the scales and the betas random (scales O(1), not the init's 0.01, so every term matters); pre, post,
// logits and d_h NaN-filled (written); the parameters' gradients random (+=).
void check_coefficients(int64_t N, int64_t G, uint32_t seed) {
  const std::string what = "mhc_coefficients N=" + std::to_string(N) + " G=" + std::to_string(G);
  const int64_t W = 2 * G + G * G;
  const std::vector<float> h = normal_values(elements(N * W), seed, 1.5f);
  const std::vector<float> scales = normal_values(3, seed + 1);
  const std::vector<float> pre_beta = normal_values(elements(G), seed + 2),
                           post_beta = normal_values(elements(G), seed + 3),
                           res_beta = normal_values(elements(G * G), seed + 4);
  const std::vector<float> d_pre = normal_values(elements(N * G), seed + 5),
                           d_post = normal_values(elements(N * G), seed + 6),
                           d_logits = normal_values(elements(N * G * G), seed + 7);
  std::vector<float> start[4] = {normal_values(3, seed + 8), normal_values(elements(G), seed + 9),
                                 normal_values(elements(G), seed + 10),
                                 normal_values(elements(G * G), seed + 11)};

  std::vector<float> pre_cpu(elements(N * G)), post_cpu(elements(N * G)), logits_cpu(elements(N * G * G));
  kernels::mhc_coefficients_forward(pre_cpu.data(), post_cpu.data(), logits_cpu.data(), h.data(),
                                    scales.data(), pre_beta.data(), post_beta.data(), res_beta.data(), N, G);
  std::vector<float> d_h_cpu(elements(N * W)), cpu[4] = {start[0], start[1], start[2], start[3]};
  kernels::mhc_coefficients_backward(d_h_cpu.data(), cpu[0].data(), cpu[1].data(), cpu[2].data(),
                                     cpu[3].data(), d_pre.data(), d_post.data(), d_logits.data(), h.data(),
                                     scales.data(), pre_beta.data(), post_beta.data(), N, G);

  const DeviceBuffer<float> h_gpu(h), scales_gpu(scales), pre_beta_gpu(pre_beta), post_beta_gpu(post_beta),
      res_beta_gpu(res_beta), d_pre_gpu(d_pre), d_post_gpu(d_post), d_logits_gpu(d_logits);
  {
    const DeviceBuffer<float> pre(nan_filled(N * G)), post(nan_filled(N * G)), logits(nan_filled(N * G * G));
    cuda().mhc_coefficients_forward(pre.get(), post.get(), logits.get(), h_gpu.get(), scales_gpu.get(),
                                    pre_beta_gpu.get(), post_beta_gpu.get(), res_beta_gpu.get(), N, G);
    expect_close(pre.read(), pre_cpu, kElementTolerance, what + " forward pre");
    expect_close(post.read(), post_cpu, kElementTolerance, what + " forward post");
    expect_close(logits.read(), logits_cpu, kElementTolerance, what + " forward logits");
  }
  std::vector<float> runs[2][5];
  for (int run = 0; run < 2; ++run) {
    const DeviceBuffer<float> d_h(nan_filled(N * W)), d_scales(start[0]), d_pre_beta(start[1]),
        d_post_beta(start[2]), d_res_beta(start[3]);
    cuda().mhc_coefficients_backward(d_h.get(), d_scales.get(), d_pre_beta.get(), d_post_beta.get(),
                                     d_res_beta.get(), d_pre_gpu.get(), d_post_gpu.get(), d_logits_gpu.get(),
                                     h_gpu.get(), scales_gpu.get(), pre_beta_gpu.get(), post_beta_gpu.get(),
                                     N, G);
    runs[run][0] = d_h.read();
    runs[run][1] = d_scales.read();
    runs[run][2] = d_pre_beta.read();
    runs[run][3] = d_post_beta.read();
    runs[run][4] = d_res_beta.read();
  }
  expect_close(runs[0][0], d_h_cpu, kElementTolerance, what + " backward d_h");
  const char* names[4] = {" d_scales", " d_pre_beta", " d_post_beta", " d_res_beta"};
  for (int i = 0; i < 4; ++i) expect_close(runs[0][i + 1], cpu[i], kReductionTolerance, what + names[i]);
  for (int i = 0; i < 5; ++i) expect_same_bits(runs[1][i], runs[0][i], what + " backward, second run");
}

TEST(CudaMhcCoefficients, OddShapes) {
  MT_REQUIRE_GPU();
  check_coefficients(37, 4, 1601);
  check_coefficients(300, 3, 1602);  // tokens over all 32 lanes; W + 3 = 18 columns
  check_coefficients(5, 6, 1603);    // W + 3 = 51 columns: two column blocks
  check_coefficients(1, 1, 1604);
}

// ---- Sinkhorn ------------------------------------------------------------------------------------------

void check_sinkhorn(int64_t N, int64_t G, int64_t iterations, uint32_t seed) {
  const std::string what = "sinkhorn N=" + std::to_string(N) + " G=" + std::to_string(G) +
                           " iterations=" + std::to_string(iterations);
  const std::vector<float> logits = normal_values(elements(N * G * G), seed, 2.0f);
  const std::vector<float> d_mixing = normal_values(elements(N * G * G), seed + 1);
  std::vector<float> mixing_cpu(elements(N * G * G)), d_logits_cpu(elements(N * G * G));
  kernels::sinkhorn_forward(mixing_cpu.data(), logits.data(), N, G, iterations);
  kernels::sinkhorn_backward(d_logits_cpu.data(), d_mixing.data(), logits.data(), N, G, iterations);
  const DeviceBuffer<float> logits_gpu(logits), d_mixing_gpu(d_mixing);
  const DeviceBuffer<float> mixing(nan_filled(N * G * G));
  cuda().sinkhorn_forward(mixing.get(), logits_gpu.get(), N, G, iterations);
  expect_close(mixing.read(), mixing_cpu, kSinkhornTolerance, what + " forward");
  std::vector<float> runs[2];
  for (int run = 0; run < 2; ++run) {
    const DeviceBuffer<float> d_logits(nan_filled(N * G * G));
    cuda().sinkhorn_backward(d_logits.get(), d_mixing_gpu.get(), logits_gpu.get(), N, G, iterations);
    runs[run] = d_logits.read();
  }
  expect_close(runs[0], d_logits_cpu, kSinkhornBackwardTolerance, what + " backward");
  expect_same_bits(runs[1], runs[0], what + " backward, second run");
}

TEST(CudaSinkhorn, IterationsAndStreams) {
  MT_REQUIRE_GPU();
  check_sinkhorn(37, 4, 20, 1701);  // mHC's
  check_sinkhorn(29, 3, 2, 1702);   // few iterations: each one matters
  check_sinkhorn(11, 5, 3, 1703);
  check_sinkhorn(7, 1, 1, 1704);
  check_sinkhorn(5, 8, 32, 1705);  // the largest the kernels hold (2 x 32 x 64 = 4096 stage values)
  check_sinkhorn(3, 33, 1, 1706);  // more lines than the block's 32 threads
}

// ---- Collapse and expand -------------------------------------------------------------------------------

// collapse: xin NaN (written); d_x random (+=), d_pre NaN (written).
void check_collapse(int64_t N, int64_t G, int64_t D, uint32_t seed) {
  const std::string what = "mhc_collapse " + shape(N, G, D);
  const std::vector<float> x = normal_values(elements(N * G * D), seed);
  const std::vector<float> pre = normal_values(elements(N * G), seed + 1);
  const std::vector<float> d_xin = normal_values(elements(N * D), seed + 2);
  const std::vector<float> d_x_start = normal_values(elements(N * G * D), seed + 3);
  std::vector<float> xin_cpu(elements(N * D)), d_x_cpu = d_x_start, d_pre_cpu(elements(N * G));
  kernels::mhc_collapse_forward(xin_cpu.data(), x.data(), pre.data(), N, G, D);
  kernels::mhc_collapse_backward(d_x_cpu.data(), d_pre_cpu.data(), d_xin.data(), x.data(), pre.data(), N, G,
                                 D);
  const DeviceBuffer<float> x_gpu(x), pre_gpu(pre), d_xin_gpu(d_xin), xin(nan_filled(N * D));
  cuda().mhc_collapse_forward(xin.get(), x_gpu.get(), pre_gpu.get(), N, G, D);
  expect_close(xin.read(), xin_cpu, kElementTolerance, what + " forward");
  std::vector<float> runs[2][2];
  for (int run = 0; run < 2; ++run) {
    const DeviceBuffer<float> d_x(d_x_start), d_pre(nan_filled(N * G));
    cuda().mhc_collapse_backward(d_x.get(), d_pre.get(), d_xin_gpu.get(), x_gpu.get(), pre_gpu.get(), N, G,
                                 D);
    runs[run][0] = d_x.read();
    runs[run][1] = d_pre.read();
  }
  expect_close(runs[0][0], d_x_cpu, kElementTolerance, what + " backward d_x");
  expect_close(runs[0][1], d_pre_cpu, kReductionTolerance, what + " backward d_pre");
  for (int i = 0; i < 2; ++i) expect_same_bits(runs[1][i], runs[0][i], what + " backward, second run");
}

// expand: out NaN (written); every gradient NaN (written).
void check_expand(int64_t N, int64_t G, int64_t D, uint32_t seed) {
  const std::string what = "mhc_expand " + shape(N, G, D);
  const std::vector<float> x = normal_values(elements(N * G * D), seed);
  const std::vector<float> mixing = normal_values(elements(N * G * G), seed + 1, 0.5f);
  const std::vector<float> post = normal_values(elements(N * G), seed + 2);
  const std::vector<float> o = normal_values(elements(N * D), seed + 3);
  const std::vector<float> d_out = normal_values(elements(N * G * D), seed + 4);
  std::vector<float> out_cpu(elements(N * G * D)), d_x_cpu(elements(N * G * D)),
      d_mixing_cpu(elements(N * G * G)), d_post_cpu(elements(N * G)), d_o_cpu(elements(N * D));
  kernels::mhc_expand_forward(out_cpu.data(), x.data(), mixing.data(), post.data(), o.data(), N, G, D);
  kernels::mhc_expand_backward(d_x_cpu.data(), d_mixing_cpu.data(), d_post_cpu.data(), d_o_cpu.data(),
                               d_out.data(), x.data(), mixing.data(), post.data(), o.data(), N, G, D);
  const DeviceBuffer<float> x_gpu(x), mixing_gpu(mixing), post_gpu(post), o_gpu(o), d_out_gpu(d_out);
  const DeviceBuffer<float> out(nan_filled(N * G * D));
  cuda().mhc_expand_forward(out.get(), x_gpu.get(), mixing_gpu.get(), post_gpu.get(), o_gpu.get(), N, G, D);
  expect_close(out.read(), out_cpu, kElementTolerance, what + " forward");
  std::vector<float> runs[2][4];
  for (int run = 0; run < 2; ++run) {
    const DeviceBuffer<float> d_x(nan_filled(N * G * D)), d_mixing(nan_filled(N * G * G)),
        d_post(nan_filled(N * G)), d_o(nan_filled(N * D));
    cuda().mhc_expand_backward(d_x.get(), d_mixing.get(), d_post.get(), d_o.get(), d_out_gpu.get(),
                               x_gpu.get(), mixing_gpu.get(), post_gpu.get(), o_gpu.get(), N, G, D);
    runs[run][0] = d_x.read();
    runs[run][1] = d_mixing.read();
    runs[run][2] = d_post.read();
    runs[run][3] = d_o.read();
  }
  expect_close(runs[0][0], d_x_cpu, kElementTolerance, what + " backward d_x");
  expect_close(runs[0][1], d_mixing_cpu, kReductionTolerance, what + " backward d_mixing");
  expect_close(runs[0][2], d_post_cpu, kReductionTolerance, what + " backward d_post");
  expect_close(runs[0][3], d_o_cpu, kElementTolerance, what + " backward d_o");
  for (int i = 0; i < 4; ++i) expect_same_bits(runs[1][i], runs[0][i], what + " backward, second run");
}

TEST(CudaMhcMix, CollapseAndExpand) {
  MT_REQUIRE_GPU();
  for (const auto& [N, G, D] :
       {std::tuple<int64_t, int64_t, int64_t>{37, 4, 53}, {9, 3, 257}, {300, 2, 40}, {2, 1, 33}}) {
    check_collapse(N, G, D, 1801);
    check_expand(N, G, D, 1802);
  }
}

// The entry repeats x into G streams (every element written: NaN-filled); the exit sums them, written or
// added onto random values. Each element is one thread's sum in stream order, as on the cpu: bitwise.
TEST(CudaMhcStreams, RepeatAndSum) {
  MT_REQUIRE_GPU();
  const int64_t N = 37, G = 3, D = 53;
  const std::vector<float> x = normal_values(elements(N * D), 1901);
  const std::vector<float> streams = normal_values(elements(N * G * D), 1902);
  std::vector<float> repeated_cpu(elements(N * G * D));
  kernels::mhc_streams_repeat(repeated_cpu.data(), x.data(), N, G, D);
  const DeviceBuffer<float> x_gpu(x), streams_gpu(streams), repeated(nan_filled(N * G * D));
  cuda().mhc_streams_repeat(repeated.get(), x_gpu.get(), N, G, D);
  expect_same_bits(repeated.read(), repeated_cpu, "mhc_streams_repeat");
  for (const bool accumulate : {false, true}) {
    const std::vector<float> start = accumulate ? normal_values(elements(N * D), 1903) : nan_filled(N * D);
    std::vector<float> sum_cpu = start;
    kernels::mhc_streams_sum(sum_cpu.data(), streams.data(), N, G, D, accumulate);
    const DeviceBuffer<float> sum(start);
    cuda().mhc_streams_sum(sum.get(), streams_gpu.get(), N, G, D, accumulate);
    expect_same_bits(sum.read(), sum_cpu, accumulate ? "mhc_streams_sum (+=)" : "mhc_streams_sum (=)");
  }
}

}  // namespace
}  // namespace meshtrain::gpu_test
