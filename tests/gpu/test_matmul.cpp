// The cuBLASLt GEMM seam (gemm_f32, gemm_bf16, round_to_bf16 of kernels/cuda/gemm.h) and the matmul kernels
// against double references and the cpu kernels, on odd shapes and a training-sized one, with outputs the
// kernel must write pre-filled with NaN (every element written; beta = 0 reads nothing).
// Legend: GEMM C [M, N] = op(A) [M, K] @ op(B) [K, N]; matmul N tokens, I input width, O output width.
//
// Tolerances are on |gpu - expected| / (1 + scale), where scale is the element's |initial value| plus the sum
// over k of |a_k b_k| (from the double reference): the quantity float32 accumulation errors scale with, so an
// element near zero by cancellation is not held to a relative bound no float32 sum meets.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpu_test.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/kernels/cpu/gemm.h"
#include "meshtrain/kernels/cpu/matmul.h"
#include "meshtrain/kernels/cuda/gemm.h"

namespace meshtrain::gpu_test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Float32 (CUBLAS_COMPUTE_32F): a K-term float32 sum's rounding errors, ~u |partial sum| each with random
// signs, total ~u K / sqrt(6) for normal inputs (partial sums ~sqrt(k)), against a scale of ~0.64 K: the
// metric is ~0.6 u = 4e-8 per element, ~2e-7 at the worst of 10^6 elements, whatever K. 5e-6 leaves 25x.
// TF32 (inputs rounded to 10 mantissa bits) would give ~1e-3 / sqrt(K) per element, >= 2e-5 at K = 2304; a
// wrong transpose, leading dimension or beta gives O(1).
constexpr double kF32Tolerance = 5e-6;
// bf16 operands: products of two bf16 values are exact in float32, so against the double reference on the
// same rounded inputs only the float32 accumulation differs, as above; tensor cores may truncate rather than
// round when they align one MMA step's products (a biased error of a few u per step), so 2x the float32
// bound. Inputs rounded differently from the cpu's rounding would err by ~2^-9 per product: ~3e-3 / sqrt(K).
constexpr double kBf16Tolerance = 1e-5;

size_t elements(int64_t count) {
  return static_cast<size_t>(count);
}

std::vector<uint16_t> bf16_bits(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = bfloat16_from_float(values[i]);
  return bits;
}

// The values a bf16 GEMM multiplies: each input rounded to bf16 (the cpu rounding) and widened back.
std::vector<float> bf16_values(const std::vector<float>& values) {
  std::vector<float> rounded(values.size());
  for (size_t i = 0; i < values.size(); ++i) rounded[i] = float_from_bfloat16(bfloat16_from_float(values[i]));
  return rounded;
}

// An expected result in double and the scale its float32 error is measured against (file comment).
struct Expected {
  std::vector<double> value;
  std::vector<double> scale;
};

// op(A) op(B) in double: A stored [M, K] (or [K, M] when transposed_a), B [K, N] (or [N, K] when
// transposed_b).
Expected reference_product(const std::vector<float>& a, const std::vector<float>& b, int64_t M, int64_t N,
                           int64_t K, bool transposed_a, bool transposed_b) {
  std::vector<double> a_MK(elements(M * K)), b_KN(elements(K * N));  // the operands as op() gives them
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k)
      a_MK[elements(m * K + k)] = transposed_a ? a[elements(k * M + m)] : a[elements(m * K + k)];
  }
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n)
      b_KN[elements(k * N + n)] = transposed_b ? b[elements(n * K + k)] : b[elements(k * N + n)];
  }
  Expected expected{std::vector<double>(elements(M * N), 0.0), std::vector<double>(elements(M * N), 0.0)};
  for (int64_t m = 0; m < M; ++m) {
    double* value = expected.value.data() + m * N;  // [N]
    double* scale = expected.scale.data() + m * N;  // [N]
    for (int64_t k = 0; k < K; ++k) {
      const double a_mk = a_MK[elements(m * K + k)];
      const double* b_row = b_KN.data() + k * N;  // [N]
      for (int64_t n = 0; n < N; ++n) {
        const double product = a_mk * b_row[n];
        value[n] += product;
        scale[n] += std::abs(product);
      }
    }
  }
  return expected;
}

// initial + expected (an accumulating call): the initial values join both the value and the scale.
Expected plus_initial(Expected expected, const std::vector<float>& initial) {
  for (size_t i = 0; i < initial.size(); ++i) {
    expected.value[i] += initial[i];
    expected.scale[i] += std::abs(static_cast<double>(initial[i]));
  }
  return expected;
}

// The cpu kernel's result measured against the reference's scale.
Expected as_expected(const std::vector<float>& values, const Expected& reference) {
  return {std::vector<double>(values.begin(), values.end()), reference.scale};
}

// |found - expected| / (1 + scale) <= tolerance for every element, reporting the worst (NaN counts as worst).
void expect_within(const std::vector<float>& found, const Expected& expected, double tolerance,
                   const std::string& what) {
  ASSERT_EQ(found.size(), expected.value.size()) << what;
  if (found.empty()) return;
  double worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < found.size(); ++i) {
    const double error =
        std::abs(static_cast<double>(found[i]) - expected.value[i]) / (1.0 + expected.scale[i]);
    if (std::isnan(error) || error > worst) {  // a NaN stays the worst
      worst = std::isnan(error) ? std::numeric_limits<double>::infinity() : error;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, tolerance) << what << ": element " << worst_at << " found " << found[worst_at]
                              << " expected " << expected.value[worst_at] << " (scale "
                              << expected.scale[worst_at] << ")";
}

// ---- GEMM ----------------------------------------------------------------------------------------------

struct GemmShape {
  int64_t M, N, K;
};

std::string gemm_name(const GemmShape& shape, bool transposed_a, bool transposed_b, bool accumulate,
                      bool bf16) {
  return std::string(bf16 ? "gemm_bf16" : "gemm_f32") + " M=" + std::to_string(shape.M) +
         " N=" + std::to_string(shape.N) + " K=" + std::to_string(shape.K) + (transposed_a ? " A^T" : " A") +
         (transposed_b ? " B^T" : " B") + (accumulate ? " accumulate" : " overwrite");
}

// One GEMM against the double reference and the cpu GEMM seam (kernels/cpu/gemm.h) on the same inputs.
void check_gemm(const GemmShape& shape, bool transposed_a, bool transposed_b, bool accumulate, bool bf16,
                uint32_t seed) {
  const auto [M, N, K] = shape;
  const std::string what = gemm_name(shape, transposed_a, transposed_b, accumulate, bf16);
  const std::vector<float> a = normal_values(elements(M * K), seed);            // [M, K] or [K, M]
  const std::vector<float> b = normal_values(elements(K * N), seed + 1);        // [K, N] or [N, K]
  const std::vector<float> initial = normal_values(elements(M * N), seed + 2);  // [M, N]
  Expected expected = reference_product(bf16 ? bf16_values(a) : a, bf16 ? bf16_values(b) : b, M, N, K,
                                        transposed_a, transposed_b);
  if (accumulate) expected = plus_initial(std::move(expected), initial);

  const DeviceBuffer<float> c_gpu(accumulate ? initial : std::vector<float>(elements(M * N), kNaN));
  std::vector<float> c_cpu = accumulate ? initial : std::vector<float>(elements(M * N), 0.0f);
  const int64_t lda = transposed_a ? M : K, ldb = transposed_b ? K : N;
  if (bf16) {
    const std::vector<uint16_t> a_bits = bf16_bits(a), b_bits = bf16_bits(b);
    const DeviceBuffer<uint16_t> a_gpu(a_bits), b_gpu(b_bits);
    kernels::cuda::gemm_bf16(c_gpu.get(), a_gpu.get(), b_gpu.get(), M, N, K, transposed_a, transposed_b,
                             accumulate);
    kernels::gemm_bf16(transposed_a, transposed_b, M, N, K, a_bits.data(), lda, b_bits.data(), ldb,
                       accumulate, c_cpu.data(), N);
  } else {
    const DeviceBuffer<float> a_gpu(a), b_gpu(b);
    kernels::cuda::gemm_f32(c_gpu.get(), a_gpu.get(), b_gpu.get(), M, N, K, transposed_a, transposed_b,
                            accumulate);
    kernels::gemm(transposed_a, transposed_b, M, N, K, a.data(), lda, b.data(), ldb, accumulate, c_cpu.data(),
                  N);
  }
  const double tolerance = bf16 ? kBf16Tolerance : kF32Tolerance;
  const std::vector<float> c = c_gpu.read();
  expect_within(c, expected, tolerance, what + " vs double reference");
  // Both within the tolerance of the reference: within twice it of each other.
  expect_within(c, as_expected(c_cpu, expected), 2 * tolerance, what + " vs cpu gemm");
}

const GemmShape kGemmShapes[] = {{37, 29, 53}, {131, 67, 515}, {1, 1, 1}, {1, 300, 7}, {64, 128, 96}};

void check_all_layouts(bool bf16) {
  uint32_t seed = bf16 ? 2000 : 1000;
  for (const GemmShape& shape : kGemmShapes) {
    for (const bool transposed_a : {false, true}) {
      for (const bool transposed_b : {false, true}) {
        for (const bool accumulate : {false, true}) {
          check_gemm(shape, transposed_a, transposed_b, accumulate, bf16, seed);
          seed += 3;
        }
      }
    }
  }
}

TEST(CudaGemm, F32AllTransposesAndAccumulate) {
  MT_REQUIRE_GPU();
  check_all_layouts(false);
}

TEST(CudaGemm, Bf16AllTransposesAndAccumulate) {
  MT_REQUIRE_GPU();
  check_all_layouts(true);
}

// A product whose exact result is representable: C = A P with P a permutation matrix, so every output is
// one element of A times 1 plus zeros. CUBLAS_COMPUTE_32F reproduces A's elements bit for bit; TF32
// (10-bit mantissas) would round nearly all of them, a wrong transpose or leading dimension would move
// them. With bf16 operands the outputs are exactly A's rounded elements.
TEST(CudaGemm, PermutationProductIsExact) {
  MT_REQUIRE_GPU();
  constexpr int64_t M = 67, K = 96, N = 96;
  std::vector<int64_t> permutation(elements(K));
  std::iota(permutation.begin(), permutation.end(), int64_t{0});
  std::shuffle(permutation.begin(), permutation.end(), std::mt19937(7));
  const std::vector<float> a_MK = normal_values(elements(M * K), 3);  // [M, K]
  for (const bool bf16 : {false, true}) {
    const std::vector<float> a_values = bf16 ? bf16_values(a_MK) : a_MK;  // [M, K]
    std::vector<float> expected(elements(M * N));                         // [M, N]: C[m, perm[k]] = A[m, k]
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k)
        expected[elements(m * N + permutation[elements(k)])] = a_values[elements(m * K + k)];
    }
    for (const bool transposed_a : {false, true}) {
      for (const bool transposed_b : {false, true}) {
        std::vector<float> a(elements(M * K)), b(elements(K * N), 0.0f);  // as stored
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t k = 0; k < K; ++k)
            a[elements(transposed_a ? k * M + m : m * K + k)] = a_MK[elements(m * K + k)];
        }
        for (int64_t k = 0; k < K; ++k) {
          const int64_t n = permutation[elements(k)];  // P[k, n] = 1
          b[elements(transposed_b ? n * K + k : k * N + n)] = 1.0f;
        }
        const std::string what =
            gemm_name({M, N, K}, transposed_a, transposed_b, false, bf16) + " A @ permutation";
        const DeviceBuffer<float> c_gpu(std::vector<float>(elements(M * N), kNaN));
        if (bf16) {
          const DeviceBuffer<uint16_t> a_gpu(bf16_bits(a)), b_gpu(bf16_bits(b));
          kernels::cuda::gemm_bf16(c_gpu.get(), a_gpu.get(), b_gpu.get(), M, N, K, transposed_a, transposed_b,
                                   false);
        } else {
          const DeviceBuffer<float> a_gpu(a), b_gpu(b);
          kernels::cuda::gemm_f32(c_gpu.get(), a_gpu.get(), b_gpu.get(), M, N, K, transposed_a, transposed_b,
                                  false);
        }
        expect_same_bits(c_gpu.read(), expected, what);
      }
    }
  }
}

// K == 0 zeroes C (or leaves it, accumulating); M or N == 0 touches nothing.
TEST(CudaGemm, EmptyProducts) {
  MT_REQUIRE_GPU();
  const DeviceBuffer<float> a_f32(std::vector<float>(1, 1.0f)), b_f32(std::vector<float>(1, 1.0f));
  const DeviceBuffer<uint16_t> a_bf16(std::vector<uint16_t>(1, 0x3f80)),
      b_bf16(std::vector<uint16_t>(1, 0x3f80));
  const auto run = [&](bool bf16, float* c, int64_t M, int64_t N, int64_t K, bool accumulate) {
    if (bf16) {
      kernels::cuda::gemm_bf16(c, a_bf16.get(), b_bf16.get(), M, N, K, false, false, accumulate);
    } else {
      kernels::cuda::gemm_f32(c, a_f32.get(), b_f32.get(), M, N, K, false, false, accumulate);
    }
  };
  for (const bool bf16 : {false, true}) {
    const std::string what = bf16 ? "gemm_bf16" : "gemm_f32";
    const DeviceBuffer<float> zeroed(std::vector<float>(35, kNaN));  // [5, 7]
    run(bf16, zeroed.get(), 5, 7, 0, false);
    expect_same_bits(zeroed.read(), std::vector<float>(35, 0.0f), what + " K=0 overwrite zeroes C");
    const DeviceBuffer<float> kept(std::vector<float>(35, 3.0f));  // [5, 7]
    run(bf16, kept.get(), 5, 7, 0, true);
    expect_same_bits(kept.read(), std::vector<float>(35, 3.0f), what + " K=0 accumulate leaves C");
    const DeviceBuffer<float> untouched(std::vector<float>(8, 4.0f));
    for (const bool accumulate : {false, true}) {
      run(bf16, untouched.get(), 0, 7, 5, accumulate);
      run(bf16, untouched.get(), 5, 0, 5, accumulate);
      run(bf16, untouched.get(), 0, 0, 0, accumulate);
    }
    expect_same_bits(untouched.read(), std::vector<float>(8, 4.0f), what + " M or N = 0 touches nothing");
  }
}

// Operands at offsets from the allocation (the arena hands out such pointers; the bf16 matmul scratch splits
// at odd element counts): the plan cache keys on pointer alignment, and the heuristic must be told it.
// The same shape aligned before and after gives bitwise the same result (a cached plan, deterministic).
TEST(CudaGemm, UnalignedOperandsAndRepeatedShapes) {
  MT_REQUIRE_GPU();
  const GemmShape shapes[] = {{64, 128, 96}, {37, 29, 53}};
  uint32_t seed = 3000;
  for (const GemmShape& shape : shapes) {
    const auto [M, N, K] = shape;
    for (const bool bf16 : {false, true}) {
      for (const bool transposed_b : {false, true}) {
        const std::string what = gemm_name(shape, false, transposed_b, true, bf16);
        const std::vector<float> a = normal_values(elements(M * K), seed++);
        const std::vector<float> b = normal_values(elements(K * N), seed++);
        const std::vector<float> initial = normal_values(elements(M * N), seed++);
        const Expected expected =
            plus_initial(reference_product(bf16 ? bf16_values(a) : a, bf16 ? bf16_values(b) : b, M, N, K,
                                           false, transposed_b),
                         initial);
        // Each buffer holds its values at `offset` elements from the start (0: 256-byte aligned).
        const auto padded = [](const auto& values, int64_t offset) {
          std::remove_cvref_t<decltype(values)> result(values.size() + 3);
          std::copy(values.begin(), values.end(), result.begin() + offset);
          return result;
        };
        const auto unpadded = [&](const std::vector<float>& values, int64_t offset) {
          return std::vector<float>(values.begin() + offset, values.begin() + offset + M * N);
        };
        std::vector<float> results[3];
        const int64_t offsets[3][3] = {{0, 0, 0}, {1, 3, 1}, {0, 0, 0}};  // a, b, c
        for (int run = 0; run < 3; ++run) {
          const int64_t oa = offsets[run][0], ob = offsets[run][1], oc = offsets[run][2];
          const DeviceBuffer<float> c_gpu(padded(initial, oc));
          if (bf16) {
            const DeviceBuffer<uint16_t> a_gpu(padded(bf16_bits(a), oa)), b_gpu(padded(bf16_bits(b), ob));
            kernels::cuda::gemm_bf16(c_gpu.get() + oc, a_gpu.get() + oa, b_gpu.get() + ob, M, N, K, false,
                                     transposed_b, true);
          } else {
            const DeviceBuffer<float> a_gpu(padded(a, oa)), b_gpu(padded(b, ob));
            kernels::cuda::gemm_f32(c_gpu.get() + oc, a_gpu.get() + oa, b_gpu.get() + ob, M, N, K, false,
                                    transposed_b, true);
          }
          results[run] = unpadded(c_gpu.read(), oc);
          expect_within(results[run], expected, bf16 ? kBf16Tolerance : kF32Tolerance,
                        what + " run " + std::to_string(run) + (run == 1 ? " (unaligned)" : " (aligned)"));
        }
        expect_same_bits(results[2], results[0], what + " the same aligned call twice");
      }
    }
  }
}

// Bit-exact against the cpu rounding (core/dtype.h): ties to even, overflow to infinity, subnormals, every
// NaN kept a NaN with the quiet bit set (a signalling NaN's payload must not turn it into an infinity), and
// a million random bit patterns. The element past the end stays untouched.
TEST(CudaGemm, RoundToBf16IsBitExact) {
  MT_REQUIRE_GPU();
  std::vector<uint32_t> patterns = {
      0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u, 0x7f800000u, 0xff800000u,  // 0, -0, 1, -1, inf,
                                                                                     // -inf
      0x7f7fffffu, 0xff7fffffu, 0x7f7f7fffu, 0x7f7f8000u,  // largest float rounds to inf; just below, at a
                                                           // tie
      0x00000001u, 0x00008000u, 0x00018000u, 0x80018000u, 0x007fffffu,  // subnormals and their ties
      0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u,  // ties: to even (down), to even (up), negative
      0x3f808001u, 0x3f807fffu, 0x3f80ffffu,               // just above and below a tie
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7f80ffffu, 0x7fffffffu, 0xffffffffu,
      0x7f810000u};  // NaNs: quiet, negative, signalling, low payload only, all ones
  std::mt19937 generator(99);
  for (int i = 0; i < (1 << 20) + 13; ++i) patterns.push_back(static_cast<uint32_t>(generator()));
  std::vector<float> in(patterns.size());
  for (size_t i = 0; i < patterns.size(); ++i) in[i] = std::bit_cast<float>(patterns[i]);
  const int64_t count = static_cast<int64_t>(in.size());

  const DeviceBuffer<float> in_gpu(in);
  const DeviceBuffer<uint16_t> out_gpu(std::vector<uint16_t>(in.size() + 1, 0xabcd));
  kernels::cuda::round_to_bf16(out_gpu.get(), in_gpu.get(), count);
  kernels::cuda::round_to_bf16(out_gpu.get(), in_gpu.get(), 0);  // nothing
  const std::vector<uint16_t> out = out_gpu.read();
  int mismatches = 0, nan_failures = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t expected = bfloat16_from_float(std::bit_cast<float>(patterns[i]));
    if (out[i] != expected && ++mismatches <= 10) {
      ADD_FAILURE() << "round_to_bf16 of 0x" << std::hex << patterns[i] << " gave 0x" << out[i]
                    << ", expected 0x" << expected << std::dec;
    }
    const bool nan_in = (patterns[i] & 0x7fffffffu) > 0x7f800000u;
    const bool quiet_nan_out = (out[i] & 0x7f80u) == 0x7f80u && (out[i] & 0x0040u) != 0;
    if (nan_in && !quiet_nan_out && ++nan_failures <= 10) {
      ADD_FAILURE() << "round_to_bf16 of the NaN 0x" << std::hex << patterns[i] << " gave 0x" << out[i]
                    << ", not a quiet NaN" << std::dec;
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(nan_failures, 0);
  EXPECT_EQ(out.back(), 0xabcd) << "round_to_bf16 wrote past count";
}

// ---- matmul --------------------------------------------------------------------------------------------

struct MatmulShape {
  int64_t N, I, O;
};

// One shape and mode: the inputs and the double references of the three products and the column sums.
struct MatmulCase {
  MatmulShape shape;
  bool bf16 = false;
  std::string name;
  std::vector<float> x, w, bias, dout;  // [N, I], [I, O], [O], [N, O]
  Expected forward;                     // x @ w, [N, O]
  Expected dx;                          // dout @ w^T, [N, I]
  Expected dw;                          // x^T @ dout, [I, O]
  Expected dbias;                       // column sums of dout (float32 dout, never rounded), [O]
};

MatmulCase make_case(const MatmulShape& shape, bool bf16, uint32_t seed) {
  const auto [N, I, O] = shape;
  MatmulCase c;
  c.shape = shape;
  c.bf16 = bf16;
  c.name = std::string(bf16 ? "bf16" : "float32") + " matmul N=" + std::to_string(N) +
           " I=" + std::to_string(I) + " O=" + std::to_string(O);
  c.x = normal_values(elements(N * I), seed);
  c.w = normal_values(elements(I * O), seed + 1);
  c.bias = normal_values(elements(O), seed + 2);
  c.dout = normal_values(elements(N * O), seed + 3);
  // The GEMMs multiply the rounded inputs in bf16 mode (the cpu matmul's reference: kernels/cpu/matmul.h).
  const std::vector<float> x = bf16 ? bf16_values(c.x) : c.x;
  const std::vector<float> w = bf16 ? bf16_values(c.w) : c.w;
  const std::vector<float> dout = bf16 ? bf16_values(c.dout) : c.dout;
  c.forward = reference_product(x, w, N, O, I, false, false);
  c.dx = reference_product(dout, w, N, I, O, false, true);
  c.dw = reference_product(x, dout, I, O, N, true, false);
  c.dbias = reference_product(std::vector<float>(elements(N), 1.0f), c.dout, 1, O, N, false, false);
  return c;
}

int64_t scratch_elements(const MatmulCase& c) {
  return kernels::matmul_bf16_scratch_elements(c.shape.N, c.shape.I, c.shape.O, false);
}

void check_forward(const MatmulCase& c, bool with_bias) {
  const auto [N, I, O] = c.shape;
  const std::string what = c.name + (with_bias ? " forward with bias" : " forward");
  const double tolerance = c.bf16 ? kBf16Tolerance : kF32Tolerance;
  std::vector<float> bias_rows;  // [N, O]
  for (int64_t n = 0; n < N; ++n) bias_rows.insert(bias_rows.end(), c.bias.begin(), c.bias.end());
  const Expected expected = with_bias ? plus_initial(c.forward, bias_rows) : c.forward;

  const DeviceBuffer<float> x_gpu(c.x), w_gpu(c.w), bias_gpu(c.bias);
  const DeviceBuffer<float> out_gpu(std::vector<float>(elements(N * O), kNaN));
  const DeviceBuffer<uint16_t> scratch_gpu(elements(c.bf16 ? scratch_elements(c) : 0));
  cuda().matmul_forward(out_gpu.get(), x_gpu.get(), w_gpu.get(), with_bias ? bias_gpu.get() : nullptr, N, I,
                        O, c.bf16 ? scratch_gpu.get() : nullptr);
  const std::vector<float> out = out_gpu.read();
  expect_within(out, expected, tolerance, what + " vs double reference");

  std::vector<float> out_cpu(elements(N * O), 0.0f);
  std::vector<uint16_t> scratch_cpu(elements(c.bf16 ? scratch_elements(c) : 0));
  kernels::matmul_forward(out_cpu.data(), c.x.data(), c.w.data(), with_bias ? c.bias.data() : nullptr, N, I,
                          O, c.bf16 ? scratch_cpu.data() : nullptr);
  expect_within(out, as_expected(out_cpu, expected), 2 * tolerance, what + " vs cpu kernel");
  if (c.bf16) {  // x and w rounded into the cpu kernel's places, bit for bit
    const std::vector<uint16_t> scratch = scratch_gpu.read();
    const size_t used = elements(N * I + I * O);
    EXPECT_TRUE(std::equal(scratch.begin(), scratch.begin() + used, scratch_cpu.begin()))
        << what << ": the bf16 scratch differs from the cpu kernel's";
  }
  expect_same_bits(x_gpu.read(), c.x, what + " leaves x");
  expect_same_bits(w_gpu.read(), c.w, what + " leaves w");
}

struct BackwardRequest {
  bool dx, dw, dbias, accumulate_dx;
};

void check_backward(const MatmulCase& c, const BackwardRequest& request, uint32_t seed) {
  const auto [N, I, O] = c.shape;
  const std::string what = c.name + " backward" + (request.dx ? " dx" : " (no dx)") +
                           (request.dw ? " dw" : " (no dw)") + (request.dbias ? " dbias" : " (no dbias)") +
                           (request.accumulate_dx ? " accumulate_dx" : "");
  const double tolerance = c.bf16 ? kBf16Tolerance : kF32Tolerance;
  // Initial gradients: dx written (NaN, proving every element written) or accumulated; dw, dbias accumulate.
  const std::vector<float> dx0 = request.accumulate_dx ? normal_values(elements(N * I), seed)
                                                       : std::vector<float>(elements(N * I), kNaN);
  const std::vector<float> dw0 = normal_values(elements(I * O), seed + 1, 0.1f);
  const std::vector<float> dbias0 = normal_values(elements(O), seed + 2, 0.1f);

  const DeviceBuffer<float> x_gpu(c.x), w_gpu(c.w), dout_gpu(c.dout);
  const DeviceBuffer<float> dx_gpu(dx0), dw_gpu(dw0), dbias_gpu(dbias0);
  const DeviceBuffer<uint16_t> scratch_gpu(elements(c.bf16 ? scratch_elements(c) : 0));
  cuda().matmul_backward(request.dx ? dx_gpu.get() : nullptr, request.dw ? dw_gpu.get() : nullptr,
                         request.dbias ? dbias_gpu.get() : nullptr, dout_gpu.get(), x_gpu.get(), w_gpu.get(),
                         N, I, O, request.accumulate_dx, c.bf16 ? scratch_gpu.get() : nullptr);

  std::vector<float> dx_cpu = request.accumulate_dx ? dx0 : std::vector<float>(elements(N * I), 0.0f);
  std::vector<float> dw_cpu = dw0, dbias_cpu = dbias0;
  std::vector<uint16_t> scratch_cpu(elements(c.bf16 ? scratch_elements(c) : 0));
  kernels::matmul_backward(request.dx ? dx_cpu.data() : nullptr, request.dw ? dw_cpu.data() : nullptr,
                           request.dbias ? dbias_cpu.data() : nullptr, c.dout.data(), c.x.data(), c.w.data(),
                           N, I, O, request.accumulate_dx, c.bf16 ? scratch_cpu.data() : nullptr);

  const std::vector<float> dx = dx_gpu.read(), dw = dw_gpu.read(), dbias = dbias_gpu.read();
  if (request.dx) {
    const Expected expected = request.accumulate_dx ? plus_initial(c.dx, dx0) : c.dx;
    expect_within(dx, expected, tolerance, what + ": dx vs double reference");
    expect_within(dx, as_expected(dx_cpu, expected), 2 * tolerance, what + ": dx vs cpu kernel");
  } else {
    expect_same_bits(dx, dx0, what + ": dx untouched");
  }
  if (request.dw) {
    const Expected expected = plus_initial(c.dw, dw0);
    expect_within(dw, expected, tolerance, what + ": dw vs double reference");
    expect_within(dw, as_expected(dw_cpu, expected), 2 * tolerance, what + ": dw vs cpu kernel");
  } else {
    expect_same_bits(dw, dw0, what + ": dw untouched");
  }
  if (request.dbias) {  // float32 sums in both modes
    const Expected expected = plus_initial(c.dbias, dbias0);
    expect_within(dbias, expected, kF32Tolerance, what + ": dbias vs double reference");
    expect_within(dbias, as_expected(dbias_cpu, expected), 2 * kF32Tolerance, what + ": dbias vs cpu kernel");
  } else {
    expect_same_bits(dbias, dbias0, what + ": dbias untouched");
  }
  if (c.bf16 && request.dx && request.dw) {  // dout, w and x rounded into the cpu kernel's places
    EXPECT_TRUE(scratch_gpu.read() == scratch_cpu)
        << what << ": the bf16 scratch differs from the cpu kernel's";
  }
  expect_same_bits(x_gpu.read(), c.x, what + " leaves x");
  expect_same_bits(w_gpu.read(), c.w, what + " leaves w");
  expect_same_bits(dout_gpu.read(), c.dout, what + " leaves dout");
}

// The _bf16_x entries (x already in bf16, as a producer writes it under dtype=bfloat16) on a bf16 case:
// against the double reference of the rounded inputs and the cpu's _bf16_x kernels, the scratch (w, then in
// the backward dout and w) rounded into the cpu kernel's places bit for bit, x read as it is (its bits
// untouched), and every backward request as check_backward's.
void check_bf16_x(const MatmulCase& c, uint32_t seed) {
  const auto [N, I, O] = c.shape;
  const std::vector<uint16_t> x_bits = bf16_bits(c.x);
  const auto scratch_size = elements(kernels::matmul_bf16_scratch_elements(N, I, O, true));
  const DeviceBuffer<uint16_t> x_gpu(x_bits);
  const DeviceBuffer<float> w_gpu(c.w), bias_gpu(c.bias), dout_gpu(c.dout);
  for (const bool with_bias : {false, true}) {
    const std::string what = c.name + " forward_bf16_x" + (with_bias ? " with bias" : "");
    std::vector<float> bias_rows;  // [N, O]
    for (int64_t n = 0; n < N; ++n) bias_rows.insert(bias_rows.end(), c.bias.begin(), c.bias.end());
    const Expected expected = with_bias ? plus_initial(c.forward, bias_rows) : c.forward;
    const DeviceBuffer<float> out_gpu(std::vector<float>(elements(N * O), kNaN));
    const DeviceBuffer<uint16_t> scratch_gpu(scratch_size);
    cuda().matmul_forward_bf16_x(out_gpu.get(), x_gpu.get(), w_gpu.get(),
                                 with_bias ? bias_gpu.get() : nullptr, N, I, O, scratch_gpu.get());
    std::vector<float> out_cpu(elements(N * O), 0.0f);
    std::vector<uint16_t> scratch_cpu(scratch_size);
    kernels::matmul_forward_bf16_x(out_cpu.data(), x_bits.data(), c.w.data(),
                                   with_bias ? c.bias.data() : nullptr, N, I, O, scratch_cpu.data());
    const std::vector<float> out = out_gpu.read();
    expect_within(out, expected, kBf16Tolerance, what + " vs double reference");
    expect_within(out, as_expected(out_cpu, expected), 2 * kBf16Tolerance, what + " vs cpu kernel");
    const std::vector<uint16_t> scratch = scratch_gpu.read();
    EXPECT_TRUE(std::equal(scratch.begin(), scratch.begin() + elements(I * O), scratch_cpu.begin()))
        << what << ": w's bf16 scratch differs from the cpu kernel's";
  }
  const BackwardRequest requests[] = {
      {true, true, true, false}, {true, true, true, true}, {false, true, false, false}};
  for (const BackwardRequest& request : requests) {
    const std::string what = c.name + " backward_bf16_x" + (request.dx ? " dx" : " (no dx)") +
                             (request.dbias ? " dbias" : " (no dbias)") +
                             (request.accumulate_dx ? " accumulate_dx" : "");
    seed += 5;
    const std::vector<float> dx0 = request.accumulate_dx ? normal_values(elements(N * I), seed)
                                                         : std::vector<float>(elements(N * I), kNaN);
    const std::vector<float> dw0 = normal_values(elements(I * O), seed + 1, 0.1f);
    const std::vector<float> dbias0 = normal_values(elements(O), seed + 2, 0.1f);
    const DeviceBuffer<float> dx_gpu(dx0), dw_gpu(dw0), dbias_gpu(dbias0);
    const DeviceBuffer<uint16_t> scratch_gpu(scratch_size);
    cuda().matmul_backward_bf16_x(request.dx ? dx_gpu.get() : nullptr, dw_gpu.get(),
                                  request.dbias ? dbias_gpu.get() : nullptr, dout_gpu.get(), x_gpu.get(),
                                  w_gpu.get(), N, I, O, request.accumulate_dx, scratch_gpu.get());
    std::vector<float> dx_cpu = request.accumulate_dx ? dx0 : std::vector<float>(elements(N * I), 0.0f);
    std::vector<float> dw_cpu = dw0, dbias_cpu = dbias0;
    std::vector<uint16_t> scratch_cpu(scratch_size);
    kernels::matmul_backward_bf16_x(request.dx ? dx_cpu.data() : nullptr, dw_cpu.data(),
                                    request.dbias ? dbias_cpu.data() : nullptr, c.dout.data(), x_bits.data(),
                                    c.w.data(), N, I, O, request.accumulate_dx, scratch_cpu.data());
    const std::vector<float> dx = dx_gpu.read(), dw = dw_gpu.read(), dbias = dbias_gpu.read();
    if (request.dx) {
      const Expected expected = request.accumulate_dx ? plus_initial(c.dx, dx0) : c.dx;
      expect_within(dx, expected, kBf16Tolerance, what + ": dx vs double reference");
      expect_within(dx, as_expected(dx_cpu, expected), 2 * kBf16Tolerance, what + ": dx vs cpu kernel");
      EXPECT_TRUE(scratch_gpu.read() == scratch_cpu) << what << ": the bf16 scratch differs from the cpu's";
    } else {
      expect_same_bits(dx, dx0, what + ": dx untouched");
    }
    const Expected dw_expected = plus_initial(c.dw, dw0);
    expect_within(dw, dw_expected, kBf16Tolerance, what + ": dw vs double reference");
    expect_within(dw, as_expected(dw_cpu, dw_expected), 2 * kBf16Tolerance, what + ": dw vs cpu kernel");
    if (request.dbias) {
      const Expected expected = plus_initial(c.dbias, dbias0);
      expect_within(dbias, as_expected(dbias_cpu, expected), 2 * kF32Tolerance,
                    what + ": dbias vs cpu kernel");
    } else {
      expect_same_bits(dbias, dbias0, what + ": dbias untouched");
    }
  }
  EXPECT_TRUE(x_gpu.read() == x_bits) << c.name << ": the _bf16_x entries changed x";
  expect_same_bits(w_gpu.read(), c.w, c.name + " _bf16_x leaves w");
}

void check_matmul(const MatmulShape& shape, bool bf16, uint32_t seed) {
  const MatmulCase c = make_case(shape, bf16, seed);
  check_forward(c, false);
  check_forward(c, true);
  const BackwardRequest requests[] = {
      {true, true, true, false},  {true, true, true, true},  {true, false, false, false},
      {false, true, true, false}, {true, false, true, true}, {false, false, false, false},
  };
  for (const BackwardRequest& request : requests) check_backward(c, request, seed += 5);
  if (bf16) check_bf16_x(c, seed += 5);
}

// Odd sizes everywhere (no dimension a multiple of a tile), one token, and many tokens over few columns (the
// column sums' row groups and a partial block of columns).
TEST(CudaMatmul, OddShapesMatchReferenceAndCpu) {
  MT_REQUIRE_GPU();
  const MatmulShape shapes[] = {{37, 53, 29}, {1, 7, 3}, {4099, 5, 37}};
  uint32_t seed = 100;
  for (const MatmulShape& shape : shapes) {
    for (const bool bf16 : {false, true}) check_matmul(shape, bf16, seed += 50);
  }
}

// A GPT-2 MLP-sized product (768 -> 2304, 256 tokens).
TEST(CudaMatmul, TrainingShapeMatchesReferenceAndCpu) {
  MT_REQUIRE_GPU();
  check_matmul({256, 768, 2304}, false, 500);
  check_matmul({256, 768, 2304}, true, 600);
}

// The same calls twice give bitwise the same outputs (fixed-order sums; a cached cuBLASLt plan).
TEST(CudaMatmul, Deterministic) {
  MT_REQUIRE_GPU();
  constexpr int64_t N = 256, I = 768, O = 2304;
  const std::vector<float> x = normal_values(elements(N * I), 700),
                           w = normal_values(elements(I * O), 701, 0.05f);
  const std::vector<float> bias = normal_values(elements(O), 702), dout = normal_values(elements(N * O), 703);
  const DeviceBuffer<float> x_gpu(x), w_gpu(w), bias_gpu(bias), dout_gpu(dout);
  for (const bool bf16 : {false, true}) {
    const std::string what = bf16 ? "bf16 matmul" : "float32 matmul";
    const DeviceBuffer<uint16_t> scratch(elements(kernels::matmul_bf16_scratch_elements(N, I, O, false)));
    std::vector<float> first[4];
    for (int run = 0; run < 2; ++run) {
      const DeviceBuffer<float> out(elements(N * O)), dx(elements(N * I)), dw(elements(I * O)),
          dbias(elements(O));
      cuda().matmul_forward(out.get(), x_gpu.get(), w_gpu.get(), bias_gpu.get(), N, I, O,
                            bf16 ? scratch.get() : nullptr);
      cuda().matmul_backward(dx.get(), dw.get(), dbias.get(), dout_gpu.get(), x_gpu.get(), w_gpu.get(), N, I,
                             O, false, bf16 ? scratch.get() : nullptr);
      const std::vector<float> results[4] = {out.read(), dx.read(), dw.read(), dbias.read()};
      const char* names[4] = {" out", " dx", " dw", " dbias"};
      for (int i = 0; i < 4; ++i) {
        if (run == 0) {
          first[i] = results[i];
        } else {
          expect_same_bits(results[i], first[i], what + names[i] + " twice");
        }
      }
    }
  }
}

// N, I or O == 0, as the cpu kernel: N = 0 writes and adds nothing; I = 0 makes out the bias (or zeros) and
// dbias still adds the column sums; O = 0 zeroes dx (or leaves it, accumulating). Empty outputs get a
// one-element sentinel buffer that must stay untouched.
TEST(CudaMatmul, EmptyDimensions) {
  MT_REQUIRE_GPU();
  const std::vector<float> sentinel(1, 9.0f);
  for (const bool bf16 : {false, true}) {
    const std::string what = bf16 ? "bf16 matmul" : "float32 matmul";
    const DeviceBuffer<uint16_t> scratch(64);
    uint16_t* bf16_inputs = bf16 ? scratch.get() : nullptr;
    {  // I = 0: N = 5, O = 7
      constexpr int64_t N = 5, I = 0, O = 7;
      const std::vector<float> bias = normal_values(O, 1), dout = normal_values(N * O, 2);
      const DeviceBuffer<float> x(sentinel), w(sentinel), bias_gpu(bias), dout_gpu(dout);
      const DeviceBuffer<float> out_bias(std::vector<float>(N * O, kNaN)),
          out_zero(std::vector<float>(N * O, kNaN));
      cuda().matmul_forward(out_bias.get(), x.get(), w.get(), bias_gpu.get(), N, I, O, bf16_inputs);
      cuda().matmul_forward(out_zero.get(), x.get(), w.get(), nullptr, N, I, O, bf16_inputs);
      std::vector<float> bias_rows;
      for (int64_t n = 0; n < N; ++n) bias_rows.insert(bias_rows.end(), bias.begin(), bias.end());
      expect_same_bits(out_bias.read(), bias_rows, what + " I=0 forward: out = bias");
      expect_same_bits(out_zero.read(), std::vector<float>(N * O, 0.0f), what + " I=0 forward: out = 0");
      const DeviceBuffer<float> dx(sentinel), dw(sentinel), dbias(std::vector<float>(O, 1.0f));
      cuda().matmul_backward(dx.get(), dw.get(), dbias.get(), dout_gpu.get(), x.get(), w.get(), N, I, O,
                             false, bf16_inputs);
      const Expected expected =
          plus_initial(reference_product(std::vector<float>(N, 1.0f), dout, 1, O, N, false, false),
                       std::vector<float>(O, 1.0f));
      expect_within(dbias.read(), expected, kF32Tolerance, what + " I=0 backward: dbias += column sums");
      expect_same_bits(dx.read(), sentinel, what + " I=0 backward: dx untouched");
      expect_same_bits(dw.read(), sentinel, what + " I=0 backward: dw untouched");
    }
    {  // O = 0: N = 5, I = 6
      constexpr int64_t N = 5, I = 6, O = 0;
      const DeviceBuffer<float> x(normal_values(N * I, 3)), w(sentinel), bias(sentinel), dout(sentinel);
      const DeviceBuffer<float> out(sentinel);
      cuda().matmul_forward(out.get(), x.get(), w.get(), bias.get(), N, I, O, bf16_inputs);
      expect_same_bits(out.read(), sentinel, what + " O=0 forward: out untouched");
      const DeviceBuffer<float> dx_written(std::vector<float>(N * I, kNaN)),
          dx_kept(std::vector<float>(N * I, 2.0f));
      const DeviceBuffer<float> dw(sentinel), dbias(sentinel);
      cuda().matmul_backward(dx_written.get(), dw.get(), dbias.get(), dout.get(), x.get(), w.get(), N, I, O,
                             false, bf16_inputs);
      cuda().matmul_backward(dx_kept.get(), dw.get(), dbias.get(), dout.get(), x.get(), w.get(), N, I, O,
                             true, bf16_inputs);
      expect_same_bits(dx_written.read(), std::vector<float>(N * I, 0.0f), what + " O=0 backward: dx = 0");
      expect_same_bits(dx_kept.read(), std::vector<float>(N * I, 2.0f),
                       what + " O=0 backward: dx kept (accumulate)");
      expect_same_bits(dw.read(), sentinel, what + " O=0 backward: dw untouched");
      expect_same_bits(dbias.read(), sentinel, what + " O=0 backward: dbias untouched");
    }
    {  // N = 0: I = 6, O = 7
      constexpr int64_t N = 0, I = 6, O = 7;
      const DeviceBuffer<float> x(sentinel), w(normal_values(I * O, 4)), bias(normal_values(O, 5)),
          dout(sentinel);
      const DeviceBuffer<float> out(sentinel), dx(sentinel);
      const DeviceBuffer<float> dw(std::vector<float>(I * O, 1.0f)), dbias(std::vector<float>(O, 1.0f));
      cuda().matmul_forward(out.get(), x.get(), w.get(), bias.get(), N, I, O, bf16_inputs);
      cuda().matmul_backward(dx.get(), dw.get(), dbias.get(), dout.get(), x.get(), w.get(), N, I, O, false,
                             bf16_inputs);
      expect_same_bits(out.read(), sentinel, what + " N=0 forward: out untouched");
      expect_same_bits(dx.read(), sentinel, what + " N=0 backward: dx untouched");
      expect_same_bits(dw.read(), std::vector<float>(I * O, 1.0f), what + " N=0 backward: dw unchanged");
      expect_same_bits(dbias.read(), std::vector<float>(O, 1.0f), what + " N=0 backward: dbias unchanged");
    }
  }
}

}  // namespace
}  // namespace meshtrain::gpu_test
