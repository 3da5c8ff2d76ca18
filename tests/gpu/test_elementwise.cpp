// The elementwise CUDA kernels (rope, swiglu, gelu, residual, column_slice) against the cpu kernels and the
// double references of the cpu headers, on odd sizes, with outputs pre-filled (NaN or sentinels) so that
// every element the kernel must write is proven written and every other one proven untouched. Tolerances are
// on gpu_test.h's metric |gpu - expected| / (1 + |expected|), each justified where defined.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "meshtrain/kernels/cpu/column_slice.h"
#include "meshtrain/kernels/cpu/gelu.h"
#include "meshtrain/kernels/cpu/residual.h"
#include "meshtrain/kernels/cpu/rope.h"
#include "meshtrain/kernels/cpu/swiglu.h"

namespace meshtrain::gpu_test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<double> widened(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

std::vector<float> rounded(const std::vector<double>& values) {
  std::vector<float> result(values.size());
  for (size_t i = 0; i < values.size(); ++i) result[i] = static_cast<float>(values[i]);
  return result;
}

// ---- RoPE ----------------------------------------------------------------------------------------------

// Both sides form the angle in double and round cos / sin to float (error <= 2^-24 each, cpu and gpu), then
// two float products and a sum: |error| <= ~3 * 2^-24 * (|x_i| + |x_{i+half}|) <= 2e-6 for normal inputs
// (|x| < 6). 4e-6 against the double reference leaves a factor 2; the cpu kernel carries the same bound, so
// 8e-6 between the two. A wrong pairing, sign or frequency gives O(1).
constexpr double kRopeTolerance = 4e-6;
constexpr double kRopeCpuTolerance = 8e-6;

// Forward and backward of N tokens at random positions in [0, max_position] (both ends present), compared
// with rope_reference_*<double> and the cpu kernels; then in place (out = x, dx = dout), which must give
// bitwise the out-of-place results, and backward(forward(x)) = x.
void check_rope(int64_t N, int64_t H, int64_t d, float theta, int32_t max_position, uint32_t seed) {
  const std::string what = "rope N=" + std::to_string(N) + " H=" + std::to_string(H) +
                           " d=" + std::to_string(d) + " theta=" + std::to_string(theta) +
                           " positions<=" + std::to_string(max_position);
  const size_t count = static_cast<size_t>(N * H * d);
  std::mt19937 generator(seed);
  std::uniform_int_distribution<int32_t> position_of(0, max_position);
  std::vector<int32_t> positions(static_cast<size_t>(N));
  for (int32_t& position : positions) position = position_of(generator);
  positions.front() = max_position;
  if (N > 1) positions[1] = 0;
  const std::vector<float> x = normal_values(count, seed + 1), dout = normal_values(count, seed + 2);

  // [N, H, d] references: double, and the cpu kernels.
  std::vector<double> out_double(count), dx_double(count);
  kernels::rope_reference_forward(out_double.data(), widened(x).data(), positions.data(), N, H, d,
                                  static_cast<double>(theta));
  kernels::rope_reference_backward(dx_double.data(), widened(dout).data(), positions.data(), N, H, d,
                                   static_cast<double>(theta));
  std::vector<float> out_cpu(count), dx_cpu(count);
  kernels::rope_forward(out_cpu.data(), x.data(), positions.data(), N, H, d, theta);
  kernels::rope_backward(dx_cpu.data(), dout.data(), positions.data(), N, H, d, theta);

  const DeviceBuffer<int32_t> positions_gpu(positions);
  const DeviceBuffer<float> x_gpu(x), dout_gpu(dout);
  const DeviceBuffer<float> out_gpu(std::vector<float>(count, kNaN)), dx_gpu(std::vector<float>(count, kNaN));
  cuda().rope_forward(out_gpu.get(), x_gpu.get(), positions_gpu.get(), N, H, d, theta);
  cuda().rope_backward(dx_gpu.get(), dout_gpu.get(), positions_gpu.get(), N, H, d, theta);
  const std::vector<float> out = out_gpu.read(), dx = dx_gpu.read();
  expect_close(out, rounded(out_double), kRopeTolerance, what + " forward vs double reference");
  expect_close(dx, rounded(dx_double), kRopeTolerance, what + " backward vs double reference");
  expect_close(out, out_cpu, kRopeCpuTolerance, what + " forward vs cpu kernel");
  expect_close(dx, dx_cpu, kRopeCpuTolerance, what + " backward vs cpu kernel");
  // The gpu input buffers are untouched.
  expect_close(x_gpu.read(), x, 0.0, what + " x unchanged");
  expect_close(dout_gpu.read(), dout, 0.0, what + " dout unchanged");

  // In place: each pair is read before it is written by one thread, so bitwise the out-of-place result.
  const DeviceBuffer<float> in_place_forward(x), in_place_backward(dout);
  cuda().rope_forward(in_place_forward.get(), in_place_forward.get(), positions_gpu.get(), N, H, d, theta);
  cuda().rope_backward(in_place_backward.get(), in_place_backward.get(), positions_gpu.get(), N, H, d, theta);
  expect_close(in_place_forward.read(), out, 0.0, what + " forward in place");
  expect_close(in_place_backward.read(), dx, 0.0, what + " backward in place");

  // The backward is the inverse rotation: two passes' errors (2 * kRopeTolerance).
  cuda().rope_backward(in_place_forward.get(), in_place_forward.get(), positions_gpu.get(), N, H, d, theta);
  expect_close(in_place_forward.read(), x, 2 * kRopeTolerance, what + " backward(forward(x)) = x");
}

TEST(CudaRope, HeadWidth24MatchesCpu) {
  MT_REQUIRE_GPU();
  check_rope(37, 5, 24, 1e4f, 4096, 11);
  check_rope(37, 5, 24, 1e6f, 4096, 12);
}

TEST(CudaRope, HeadWidth128MatchesCpu) {
  MT_REQUIRE_GPU();
  check_rope(37, 5, 128, 1e4f, 4096, 21);
  check_rope(37, 5, 128, 1e6f, 4096, 22);
}

TEST(CudaRope, OneTokenOneHead) {
  MT_REQUIRE_GPU();
  check_rope(1, 1, 2, 1e4f, 7, 31);
  check_rope(1, 1, 128, 1e6f, 4096, 32);
}

// More tokens than one launch's blocks (the grid stride over tokens), long-context positions (the angle is
// formed in double on both sides; the gpu's pow differs from the host's by a few double ulps, which at
// position 2^20 moves the angle by ~1e-9 rad, far below float), and a head wider than a block's threads
// (pairs > 256: the stride over pairs).
TEST(CudaRope, ManyTokensLongPositionsWideHeads) {
  MT_REQUIRE_GPU();
  check_rope(20011, 2, 8, 1e4f, 1 << 20, 41);
  check_rope(3, 2, 600, 1e6f, 4096, 42);
  check_rope(5, 33, 64, 5e5f, 131072, 43);
}

// ---- SwiGLU and GELU -----------------------------------------------------------------------------------

// Inputs: normal values with the saturating extremes placed first (where they fit).
std::vector<float> with_extremes(size_t count, uint32_t seed, float scale) {
  std::vector<float> values = normal_values(count, seed, scale);
  const float extremes[] = {0.0f,  -0.0f,  1.0f,  -1.0f,  -1.2785f, 8.0f,    -8.0f,  20.0f,  -20.0f,
                            87.5f, -87.5f, 89.0f, -89.0f, 100.0f,   -100.0f, 1e-20f, -1e-20f};
  std::copy_n(extremes, std::min(count, std::size(extremes)), values.begin());
  return values;
}

// swiglu: expf (CUDA: <= 2 ulp) and the division put sigmoid within ~3 ulp; the products add 2 more. The one
// cancellation, 1 + g (1 - sigmoid) near g = -1.28, is absolute ~1e-7 times |dout up sigmoid|. A host
// simulation (libm expf, 4M samples) shows 1.6e-7 forward and 4.5e-7 backward against double; 2e-6 leaves
// room for CUDA's expf, and the cpu kernel's sigmoid_approx (2.2 ulp, test_fast_math.cpp) is as close.
constexpr double kSwigluTolerance = 2e-6;
constexpr double kSwigluCpuTolerance = 4e-6;

void check_swiglu(size_t count, uint32_t seed) {
  const std::string what = "swiglu count=" + std::to_string(count);
  const int64_t n = static_cast<int64_t>(count);
  const std::vector<float> gate = with_extremes(count, seed, 2.0f), up = normal_values(count, seed + 1),
                           dout = normal_values(count, seed + 2);
  std::vector<double> out_double(count), dgate_double(count), dup_double(count);
  kernels::swiglu_reference_forward(out_double.data(), widened(gate).data(), widened(up).data(), n);
  kernels::swiglu_reference_backward(dgate_double.data(), dup_double.data(), widened(dout).data(),
                                     widened(gate).data(), widened(up).data(), n);
  std::vector<float> out_cpu(count), dgate_cpu(count), dup_cpu(count);
  kernels::swiglu_forward(out_cpu.data(), gate.data(), up.data(), n);
  kernels::swiglu_backward(dgate_cpu.data(), dup_cpu.data(), dout.data(), gate.data(), up.data(), n);

  const DeviceBuffer<float> gate_gpu(gate), up_gpu(up), dout_gpu(dout);
  const DeviceBuffer<float> out_gpu(std::vector<float>(count, kNaN)),
      dgate_gpu(std::vector<float>(count, kNaN)), dup_gpu(std::vector<float>(count, kNaN));
  cuda().swiglu_forward(out_gpu.get(), gate_gpu.get(), up_gpu.get(), n);
  cuda().swiglu_backward(dgate_gpu.get(), dup_gpu.get(), dout_gpu.get(), gate_gpu.get(), up_gpu.get(), n);
  const std::vector<float> out = out_gpu.read(), dgate = dgate_gpu.read(), dup = dup_gpu.read();
  expect_close(out, rounded(out_double), kSwigluTolerance, what + " forward vs double reference");
  expect_close(dgate, rounded(dgate_double), kSwigluTolerance, what + " dgate vs double reference");
  expect_close(dup, rounded(dup_double), kSwigluTolerance, what + " dup vs double reference");
  expect_close(out, out_cpu, kSwigluCpuTolerance, what + " forward vs cpu kernel");
  expect_close(dgate, dgate_cpu, kSwigluCpuTolerance, what + " dgate vs cpu kernel");
  expect_close(dup, dup_cpu, kSwigluCpuTolerance, what + " dup vs cpu kernel");

  // bf16 out (dtype=bfloat16, the down projection's input): the float32 forward rounded once, bit for bit
  // (the same kernel code); against the cpu's bf16 out, one bf16 ulp plus the float32 tolerance.
  const std::vector<uint16_t> out_bf16 = run_bf16_output(
      count, [&](uint16_t* target) { cuda().swiglu_forward_bf16(target, gate_gpu.get(), up_gpu.get(), n); },
      what + " forward_bf16");
  EXPECT_TRUE(out_bf16 == bf16_rounded(out)) << what << " forward_bf16: not the float32 out rounded once";
  std::vector<uint16_t> out_cpu_bf16(count);
  kernels::swiglu_forward_bf16(out_cpu_bf16.data(), gate.data(), up.data(), n);
  expect_bf16_close(out_bf16, out_cpu_bf16, kSwigluCpuTolerance, what + " forward_bf16 vs cpu kernel");
}

TEST(CudaSwiglu, MatchesCpuOnOddSizes) {
  MT_REQUIRE_GPU();
  check_swiglu(1, 51);
  check_swiglu(1000003, 52);  // more than one launch's 2048 x 256 threads: the grid stride
}

// gelu forward: tanhf (CUDA: <= 2 ulp) of an argument with ~3 float roundings; 0.5 x (1 + t) carries t's
// absolute error times |x| / 2 where t -> -1. Host simulation (libm tanhf, 4M samples, x ~ N(0, 2)): 8e-8;
// 1e-6 leaves room. The backward's 1 - t^2 loses all relative precision as t -> 1 (before t rounds to exactly
// 1 at |x| ~ 4.9): its absolute error of a few ulps of 1 is multiplied by 0.5 |x| sqrt(2/pi) (1 + 0.134 x^2)
// <= ~9, and the simulation shows 1.9e-6 with libm's tanhf already (the cpu kernel's tanh_approx, <= 2 ulp,
// the same); 1e-5 covers CUDA's 2 ulp tanhf on both sides.
constexpr double kGeluForwardTolerance = 1e-6;
constexpr double kGeluForwardCpuTolerance = 2e-6;
constexpr double kGeluBackwardTolerance = 1e-5;

void check_gelu(size_t count, uint32_t seed) {
  const std::string what = "gelu count=" + std::to_string(count);
  const int64_t n = static_cast<int64_t>(count);
  const std::vector<float> x = with_extremes(count, seed, 2.0f), dout = normal_values(count, seed + 1);
  std::vector<double> out_double(count), dx_double(count);
  kernels::gelu_reference_forward(out_double.data(), widened(x).data(), n);
  kernels::gelu_reference_backward(dx_double.data(), widened(dout).data(), widened(x).data(), n);
  std::vector<float> out_cpu(count), dx_cpu(count);
  kernels::gelu_forward(out_cpu.data(), x.data(), n);
  kernels::gelu_backward(dx_cpu.data(), dout.data(), x.data(), n);

  const DeviceBuffer<float> x_gpu(x), dout_gpu(dout);
  const DeviceBuffer<float> out_gpu(std::vector<float>(count, kNaN)), dx_gpu(std::vector<float>(count, kNaN));
  cuda().gelu_forward(out_gpu.get(), x_gpu.get(), n);
  cuda().gelu_backward(dx_gpu.get(), dout_gpu.get(), x_gpu.get(), n);
  const std::vector<float> out = out_gpu.read(), dx = dx_gpu.read();
  expect_close(out, rounded(out_double), kGeluForwardTolerance, what + " forward vs double reference");
  expect_close(dx, rounded(dx_double), kGeluBackwardTolerance, what + " backward vs double reference");
  expect_close(out, out_cpu, kGeluForwardCpuTolerance, what + " forward vs cpu kernel");
  expect_close(dx, dx_cpu, kGeluBackwardTolerance, what + " backward vs cpu kernel");

  // bf16 out, as check_swiglu's.
  const std::vector<uint16_t> out_bf16 = run_bf16_output(
      count, [&](uint16_t* target) { cuda().gelu_forward_bf16(target, x_gpu.get(), n); },
      what + " forward_bf16");
  EXPECT_TRUE(out_bf16 == bf16_rounded(out)) << what << " forward_bf16: not the float32 out rounded once";
  std::vector<uint16_t> out_cpu_bf16(count);
  kernels::gelu_forward_bf16(out_cpu_bf16.data(), x.data(), n);
  expect_bf16_close(out_bf16, out_cpu_bf16, kGeluForwardCpuTolerance, what + " forward_bf16 vs cpu kernel");
}

TEST(CudaGelu, MatchesCpuOnOddSizes) {
  MT_REQUIRE_GPU();
  check_gelu(1, 61);
  check_gelu(1000003, 62);  // more than one launch's 2048 x 256 threads: the grid stride
}

// ---- Residual ------------------------------------------------------------------------------------------

// One float addition per element on both sides: bitwise equal (tolerance 0).
TEST(CudaResidual, BitwiseEqualToCpu) {
  MT_REQUIRE_GPU();
  for (const size_t count : {size_t{1}, size_t{1000003}}) {
    const std::vector<float> out = normal_values(count, 71), x = normal_values(count, 72);
    std::vector<float> expected = out;
    kernels::residual_add(expected.data(), x.data(), static_cast<int64_t>(count));
    const DeviceBuffer<float> out_gpu(out), x_gpu(x);
    cuda().residual_add(out_gpu.get(), x_gpu.get(), static_cast<int64_t>(count));
    expect_close(out_gpu.read(), expected, 0.0, "residual count=" + std::to_string(count));
    expect_close(x_gpu.read(), x, 0.0, "residual x unchanged");
  }
  // count 0 launches nothing and touches nothing.
  const DeviceBuffer<float> untouched(std::vector<float>{3.0f});
  cuda().residual_add(untouched.get(), untouched.get(), 0);
  EXPECT_EQ(untouched.read(), std::vector<float>{3.0f});
}

// ---- Column slices -------------------------------------------------------------------------------------

// A slice's geometry: W columns at column offset `*_offset` of rows `*_stride` wide.
struct Slice {
  int64_t R, W, repeat;
  int64_t out_stride, out_offset;  // the wide side: forward out, backward dout ([R * repeat rows])
  int64_t x_stride, x_offset;      // the narrow side: forward x, backward dx ([R rows])
};

std::string describe(const Slice& s) {
  return "column_slice R=" + std::to_string(s.R) + " W=" + std::to_string(s.W) +
         " repeat=" + std::to_string(s.repeat) + " strides " + std::to_string(s.out_stride) + "/" +
         std::to_string(s.x_stride);
}

// Copies and sums of floats in the cpu's t order: bitwise equal (tolerance 0) over the whole buffers, so the
// columns outside the slice (sentinel values) must be untouched.
void check_column_slice(const Slice& s, uint32_t seed) {
  const std::string what = describe(s);
  const size_t wide = static_cast<size_t>(s.R * s.repeat * s.out_stride),
               narrow = static_cast<size_t>(s.R * s.x_stride);
  const std::vector<float> out_before = normal_values(wide, seed), x = normal_values(narrow, seed + 1);

  for (const bool zeros : {false, true}) {
    // Forward: out [R * repeat, out_stride] (sentinels) <- x [R, x_stride], or zeros.
    std::vector<float> expected = out_before;
    kernels::column_slice_forward(expected.data() + s.out_offset, zeros ? nullptr : x.data() + s.x_offset,
                                  s.R, s.W, s.repeat, s.out_stride, s.x_stride);
    const DeviceBuffer<float> out_gpu(out_before), x_gpu(x);
    cuda().column_slice_forward(out_gpu.get() + s.out_offset, zeros ? nullptr : x_gpu.get() + s.x_offset, s.R,
                                s.W, s.repeat, s.out_stride, s.x_stride);
    expect_close(out_gpu.read(), expected, 0.0, what + (zeros ? " forward, x null" : " forward"));
  }

  // Backward: dx [R, x_stride] (sentinels) <- sums of dout [R * repeat, out_stride] over t, in t order; also
  // against the float reference, which sums the same values in the same order from 0.
  const std::vector<float> dout = normal_values(wide, seed + 2), dx_before = normal_values(narrow, seed + 3);
  std::vector<float> expected = dx_before, reference = dx_before;
  kernels::column_slice_backward(expected.data() + s.x_offset, dout.data() + s.out_offset, s.R, s.W, s.repeat,
                                 s.x_stride, s.out_stride);
  kernels::column_slice_reference_backward(reference.data() + s.x_offset, dout.data() + s.out_offset, s.R,
                                           s.W, s.repeat, s.x_stride, s.out_stride);
  const DeviceBuffer<float> dx_gpu(dx_before), dout_gpu(dout);
  cuda().column_slice_backward(dx_gpu.get() + s.x_offset, dout_gpu.get() + s.out_offset, s.R, s.W, s.repeat,
                               s.x_stride, s.out_stride);
  const std::vector<float> dx = dx_gpu.read();
  expect_close(dx, expected, 0.0, what + " backward vs cpu kernel");
  expect_close(dx, reference, 0.0, what + " backward vs reference");
}

TEST(CudaColumnSlice, RepeatedRowsStridesAndZeros) {
  MT_REQUIRE_GPU();
  check_column_slice(
      {.R = 7, .W = 13, .repeat = 3, .out_stride = 20, .out_offset = 5, .x_stride = 17, .x_offset = 2}, 81);
  check_column_slice(
      {.R = 1, .W = 1, .repeat = 1, .out_stride = 1, .out_offset = 0, .x_stride = 1, .x_offset = 0}, 82);
  // One shared key broadcast over 5 heads (MLA's rotary key): x is exactly the slice, out rows wider.
  check_column_slice(
      {.R = 37, .W = 64, .repeat = 5, .out_stride = 192, .out_offset = 128, .x_stride = 64, .x_offset = 0},
      83);
}

// Grid strides: more source rows than one launch's row blocks (W = 200 puts one row in each 200-thread
// block; 16384 row blocks), and more columns than its column blocks (1024 x 256).
TEST(CudaColumnSlice, GridStrides) {
  MT_REQUIRE_GPU();
  check_column_slice(
      {.R = 20011, .W = 200, .repeat = 2, .out_stride = 210, .out_offset = 7, .x_stride = 203, .x_offset = 3},
      91);
  check_column_slice({.R = 2,
                      .W = 300007,
                      .repeat = 2,
                      .out_stride = 300010,
                      .out_offset = 1,
                      .x_stride = 300008,
                      .x_offset = 1},
                     92);
}

}  // namespace
}  // namespace meshtrain::gpu_test
