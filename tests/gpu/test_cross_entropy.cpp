// The cuda fused unembedding + cross-entropy and plain logits against the cpu kernels on the same inputs:
// both layouts, padding, masks, ragged chunks, eval only, a larger shape, bf16, determinism, refusals.
// Legend: N tokens, D width, V vocab (padded), C chunk of tokens (chunk_tokens), vv = vocab_valid.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "meshtrain/kernels/cpu/cross_entropy.h"

namespace meshtrain::gpu_test {
namespace {

using kernels::CrossEntropySums;
using kernels::UnembedLayout;

// float32 tolerances. cuBLAS (CUBLAS_COMPUTE_32F, no TF32) and the cpu GEMM compute the same products in
// float32 and differ only in the order of the sums: a K-term dot product differs by about sqrt(K) 2^-24 of
// the sum of its terms' magnitudes (K <= 4096 here: ~4e-6), and the cpu's exp_approx and CUDA's expf differ
// by about 1 ulp. The loss sum is a sum of per-row log-sum-exps (~log V, positive) of logits that differ by
// ~1e-6, so 1e-5 of it leaves a wide margin. Gradients are compared against their largest magnitude
// (entries near zero have no relative precision to compare): 1e-4 of it is ~25x the typical difference and
// far below what a wrong layout, a lost term or a wrong mask gives (O(1)).
constexpr double kLossTolerance = 1e-5;
constexpr double kGradientTolerance = 1e-4;
// bf16 path, gradients. Both sides round W, h and dlogits to bf16 the same way (nearest even) and multiply
// in float32, so the logits, the loss and the float32 dlogits agree as above; but a float32 dlogit that
// differs by ~1e-6 can round to the neighbouring bf16 value when it lies next to a rounding midpoint (rare:
// ~1e-6 / 2^-8 per element). One such flip moves a dh or dw entry by one bf16 ulp (<= 2^-7 relative) of one
// of its terms; the largest term is the target's dlogit (~ -1) times an h or W entry, which is about the
// gradient's largest magnitude (dh_n ~ -W[target_n], each dW column ~ the h rows that target it), so one
// flip costs <= 2^-7 ~ 7.8e-3 of the largest magnitude. 2e-2 allows two flips in one entry and is still far
// below the O(1) errors of a real bug. The loss does not go through the rounded dlogits: 1e-5 as float32.
constexpr double kBf16GradientTolerance = 2e-2;
// unembed_logits, per entry relative to 1 + |cpu|: a D-term dot product of logits ~1.5 differs by about
// sqrt(D) 2^-24 of its partial sums (~1.5e-6 at D = 256); 2e-5 leaves room for the worst of 256k entries.
constexpr double kLogitTolerance = 2e-5;

const char* layout_name(UnembedLayout layout) {
  return layout == UnembedLayout::kernel_DV ? "kernel_DV" : "table_VD";
}

struct Case {
  int64_t N, D, V, vocab_valid, C;
  UnembedLayout layout;
  bool masked;  // every 5th token (phase 2) ignored, with a garbage target
  bool bf16;    // bf16 GEMM inputs on both sides
  uint32_t seed;
  std::string name() const {
    return std::string(layout_name(layout)) + " N=" + std::to_string(N) + " D=" + std::to_string(D) +
           " V=" + std::to_string(V) + " vv=" + std::to_string(vocab_valid) + " C=" + std::to_string(C) +
           (masked ? " masked" : "") + (bf16 ? " bf16" : "");
  }
};

// One problem's inputs. Weights in padding positions are random too: they must not influence anything.
struct Inputs {
  std::vector<float> h;           // [N, D]
  std::vector<float> w;           // [D, V] or [V, D]
  std::vector<int32_t> targets;   // [N]
  std::vector<uint8_t> mask;      // [N], empty = nullptr
  std::vector<float> dw_initial;  // layout of w: nonzero, to check that dw accumulates
};

Inputs make_inputs(const Case& c) {
  Inputs in;
  const auto n = static_cast<size_t>(c.N), d = static_cast<size_t>(c.D), v = static_cast<size_t>(c.V);
  in.h = normal_values(n * d, c.seed);
  // Logits of standard deviation ~1.5 at any D.
  in.w = normal_values(d * v, c.seed + 1, 1.5f / std::sqrt(static_cast<float>(c.D)));
  in.dw_initial = normal_values(d * v, c.seed + 2, 0.25f);
  in.targets.resize(n);
  for (int64_t i = 0; i < c.N; ++i)
    in.targets[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3) % c.vocab_valid);
  if (c.masked) {
    in.mask.assign(n, 1);
    for (int64_t i = 0; i < c.N; ++i) {
      if (i % 5 == 2) {
        in.mask[static_cast<size_t>(i)] = 0;
        // Never read: out of range either way.
        in.targets[static_cast<size_t>(i)] = i % 2 == 0 ? -123456 : static_cast<int32_t>(c.V + 1000);
      }
    }
  }
  return in;
}

bool is_padding_weight(const Case& c, size_t index) {
  const auto i = static_cast<int64_t>(index);
  const int64_t column = c.layout == UnembedLayout::kernel_DV ? i % c.V : i / c.D;
  return column >= c.vocab_valid;
}

struct Result {
  CrossEntropySums sums;
  std::vector<float> dh;  // [N, D], empty when not asked for
  std::vector<float> dw;  // layout of w, empty when not asked for
};

constexpr float kGarbage = 777.0f;  // dh's prior contents: dh is written, never read

Result run_cpu(const Case& c, const Inputs& in, bool gradients) {
  Result out;
  if (gradients) {
    out.dh.assign(static_cast<size_t>(c.N * c.D), kGarbage);
    out.dw = in.dw_initial;
  }
  std::vector<float> scratch(static_cast<size_t>(kernels::cross_entropy_scratch_floats(c.C, c.V)));
  std::vector<uint16_t> bf16(
      c.bf16 ? static_cast<size_t>(kernels::cross_entropy_bf16_scratch_elements(c.N, c.C, c.D, c.V)) : 0);
  out.sums = kernels::unembed_cross_entropy(
      gradients ? out.dh.data() : nullptr, gradients ? out.dw.data() : nullptr, in.h.data(), in.w.data(),
      c.layout, in.targets.data(), in.mask.empty() ? nullptr : in.mask.data(), c.N, c.D, c.V, c.vocab_valid,
      /*z_loss_multiplier=*/0.0, c.C, scratch.data(), nullptr, c.bf16 ? bf16.data() : nullptr);
  return out;
}

// Scratch buffers get kGuard trailing elements of a known value that the kernel must not touch.
constexpr size_t kGuard = 64;
constexpr float kScratchGuard = -9999.5f;
constexpr uint16_t kBf16Guard = 0xBEEF;

template <class T>
void expect_guard_intact(const std::vector<T>& values, size_t size, T guard, const std::string& what) {
  size_t touched = 0;
  for (size_t i = size; i < values.size(); ++i) touched += values[i] == guard ? 0 : 1;
  EXPECT_EQ(touched, 0u) << what << ": written past its " << size << " elements";
}

Result run_gpu(const Case& c, const Inputs& in, bool gradients) {
  DeviceBuffer<float> h(in.h), w(in.w);
  DeviceBuffer<int32_t> targets(in.targets);
  DeviceBuffer<uint8_t> mask(in.mask.empty() ? std::vector<uint8_t>(1, 1) : in.mask);
  DeviceBuffer<float> dh(std::vector<float>(static_cast<size_t>(c.N * c.D), kGarbage));
  DeviceBuffer<float> dw(in.dw_initial);
  const auto scratch_size = static_cast<size_t>(kernels::cross_entropy_scratch_floats(c.C, c.V));
  const auto bf16_size =
      c.bf16 ? static_cast<size_t>(kernels::cross_entropy_bf16_scratch_elements(c.N, c.C, c.D, c.V)) : size_t{0};
  DeviceBuffer<float> scratch(std::vector<float>(scratch_size + kGuard, kScratchGuard));
  DeviceBuffer<uint16_t> bf16(std::vector<uint16_t>(bf16_size + kGuard, kBf16Guard));
  Result out;
  out.sums = cuda().unembed_cross_entropy(
      gradients ? dh.get() : nullptr, gradients ? dw.get() : nullptr, h.get(), w.get(), c.layout,
      targets.get(), in.mask.empty() ? nullptr : mask.get(), c.N, c.D, c.V, c.vocab_valid,
      /*z_loss_multiplier=*/0.0, c.C, scratch.get(), nullptr, c.bf16 ? bf16.get() : nullptr);
  if (gradients) {
    out.dh = dh.read();
    out.dw = dw.read();
  }
  expect_guard_intact(scratch.read(), scratch_size, kScratchGuard, "scratch");
  expect_guard_intact(bf16.read(), bf16_size, kBf16Guard, "bf16 scratch");
  return out;
}

// max |gpu - cpu| <= tolerance * max |cpu| over every entry (differences computed in double).
void expect_close_to_max(const std::vector<double>& gpu, const std::vector<double>& cpu, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double largest = 0.0, worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    largest = std::max(largest, std::abs(cpu[i]));
    const double error = std::abs(gpu[i] - cpu[i]);
    if (!std::isnan(worst) && !(error <= worst)) {  // NaN counts as worst, and stays it
      worst = error;
      worst_at = i;
    }
  }
  ASSERT_GT(largest, 0.0) << what << ": the cpu gradient is all zero, nothing is compared";
  EXPECT_LE(worst, tolerance * largest) << what << ": entry " << worst_at << " gpu " << gpu[worst_at]
                                        << " cpu " << cpu[worst_at] << " (largest |cpu| " << largest << ")";
}

std::vector<double> widen(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// What the call added to dw (its prior contents subtracted), for the valid entries; padding entries must
// be exactly as they were.
std::vector<double> dw_added(const Case& c, const std::vector<float>& dw, const std::vector<float>& initial,
                             const std::string& what) {
  std::vector<double> added;
  size_t changed_padding = 0;
  for (size_t i = 0; i < dw.size(); ++i) {
    if (is_padding_weight(c, i)) {
      if (!(dw[i] == initial[i])) ++changed_padding;
    } else {
      added.push_back(static_cast<double>(dw[i]) - static_cast<double>(initial[i]));
    }
  }
  EXPECT_EQ(changed_padding, 0u) << what << ": dw entries of padding columns changed";
  return added;
}

// Runs both backends on one case, with gradients, and compares everything.
void check_case(const Case& c) {
  SCOPED_TRACE(c.name());
  const Inputs in = make_inputs(c);
  const Result cpu = run_cpu(c, in, true);
  const Result gpu = run_gpu(c, in, true);
  EXPECT_EQ(gpu.sums.valid_count, cpu.sums.valid_count);
  EXPECT_GT(cpu.sums.loss_sum, 0.0);
  EXPECT_NEAR(gpu.sums.loss_sum, cpu.sums.loss_sum, kLossTolerance * std::abs(cpu.sums.loss_sum));
  const double gradient_tolerance = c.bf16 ? kBf16GradientTolerance : kGradientTolerance;
  expect_close_to_max(widen(gpu.dh), widen(cpu.dh), gradient_tolerance, "dh");
  // Ignored tokens' dh rows are exactly zero (written, not left at their garbage).
  for (size_t i = 0; i < in.mask.size(); ++i) {
    if (in.mask[i] != 0) continue;
    for (int64_t d = 0; d < c.D; ++d) {
      ASSERT_EQ(gpu.dh[i * static_cast<size_t>(c.D) + static_cast<size_t>(d)], 0.0f) << "dh row " << i;
    }
  }
  expect_close_to_max(dw_added(c, gpu.dw, in.dw_initial, "gpu"), dw_added(c, cpu.dw, in.dw_initial, "cpu"),
                      gradient_tolerance, "dw (added part)");
}

TEST(CudaCrossEntropy, KernelLayoutMatchesCpu) {
  MT_REQUIRE_GPU();
  check_case({37, 24, 130, 130, 8, UnembedLayout::kernel_DV, false, false, 11});
}

TEST(CudaCrossEntropy, TableLayoutMatchesCpu) {
  MT_REQUIRE_GPU();
  check_case({37, 24, 130, 130, 8, UnembedLayout::table_VD, false, false, 12});
}

// Padding columns (vv < V), a mask with zeros (and garbage targets there), chunks of 8 over 37 tokens (the
// last chunk has 5 rows).
TEST(CudaCrossEntropy, PaddingMaskAndRaggedChunksMatchCpu) {
  MT_REQUIRE_GPU();
  for (UnembedLayout layout : {UnembedLayout::kernel_DV, UnembedLayout::table_VD}) {
    check_case({37, 24, 130, 123, 8, layout, true, false, 13});
    check_case({37, 24, 130, 123, 37, layout, true, false, 14});  // one chunk
    // One row per chunk, and C > N; both with C V odd (the per-row losses are aligned up past it).
    check_case({37, 24, 131, 123, 1, layout, true, false, 15});
    check_case({37, 24, 131, 123, 63, layout, true, false, 16});
  }
}

TEST(CudaCrossEntropy, LargerShapeMatchesCpu) {
  MT_REQUIRE_GPU();
  for (UnembedLayout layout : {UnembedLayout::kernel_DV, UnembedLayout::table_VD}) {
    check_case({512, 256, 4096, 4096, 128, layout, false, false, 21});
    check_case({512, 256, 4096, 4000, 200, layout, true, false, 22});
  }
}

TEST(CudaCrossEntropy, Bf16InputsMatchCpuBf16) {
  MT_REQUIRE_GPU();
  for (UnembedLayout layout : {UnembedLayout::kernel_DV, UnembedLayout::table_VD}) {
    check_case({37, 24, 130, 123, 8, layout, true, true, 31});
    check_case({512, 256, 4096, 4000, 128, layout, true, true, 32});
  }
}

// GPT-2's vocabulary: 50,257 valid columns of 50,304 (the model's padding to a multiple of 128). The cuda
// GEMMs span all 50,304 in both layouts (so every leading dimension is a multiple of 8 elements) while the
// cpu's span the valid ones; the padding weights (random here) must change nothing: the same loss, the
// same gradients, dw's padding entries untouched. Odd N, a ragged last chunk and a mask.
TEST(CudaCrossEntropy, Gpt2PaddedVocabularyMatchesCpu) {
  MT_REQUIRE_GPU();
  for (UnembedLayout layout : {UnembedLayout::kernel_DV, UnembedLayout::table_VD}) {
    check_case({33, 64, 50304, 50257, 16, layout, true, false, 41});
    check_case({33, 64, 50304, 50257, 16, layout, true, true, 42});
  }
}

// dh = dw = nullptr: the same loss and count as the cpu, and bitwise the loss of the pass with gradients
// (the same row kernel computes both).
TEST(CudaCrossEntropy, EvalOnlyMatchesCpuAndTrainingLoss) {
  MT_REQUIRE_GPU();
  for (UnembedLayout layout : {UnembedLayout::kernel_DV, UnembedLayout::table_VD}) {
    for (bool bf16 : {false, true}) {
      const Case c{37, 24, 130, 123, 8, layout, true, bf16, 41};
      SCOPED_TRACE(c.name());
      const Inputs in = make_inputs(c);
      const Result cpu = run_cpu(c, in, false);
      const Result gpu = run_gpu(c, in, false);
      const Result gpu_training = run_gpu(c, in, true);
      EXPECT_EQ(gpu.sums.valid_count, cpu.sums.valid_count);
      EXPECT_EQ(gpu.sums.valid_count, 37 - 7);  // tokens 2, 7, ..., 32 ignored
      EXPECT_NEAR(gpu.sums.loss_sum, cpu.sums.loss_sum, kLossTolerance * std::abs(cpu.sums.loss_sum));
      EXPECT_EQ(gpu.sums.loss_sum, gpu_training.sums.loss_sum);
    }
  }
}

// Fixed reduction orders, no atomics: two runs give bitwise the same loss and gradients.
TEST(CudaCrossEntropy, Deterministic) {
  MT_REQUIRE_GPU();
  const Case c{512, 256, 4096, 4000, 128, UnembedLayout::table_VD, true, false, 51};
  const Inputs in = make_inputs(c);
  const Result first = run_gpu(c, in, true);
  const Result second = run_gpu(c, in, true);
  EXPECT_EQ(first.sums.loss_sum, second.sums.loss_sum);
  EXPECT_EQ(first.sums.valid_count, second.sums.valid_count);
  EXPECT_TRUE(first.dh == second.dh);
  EXPECT_TRUE(first.dw == second.dw);
}

TEST(CudaCrossEntropy, NoTokensIsZero) {
  MT_REQUIRE_GPU();
  DeviceBuffer<float> h(size_t{24}), w(size_t{24 * 130}), scratch(size_t{1024});
  DeviceBuffer<int32_t> targets(size_t{1});
  const CrossEntropySums sums = cuda().unembed_cross_entropy(
      nullptr, nullptr, h.get(), w.get(), UnembedLayout::kernel_DV, targets.get(), nullptr, 0, 24, 130, 130,
      /*z_loss_multiplier=*/0.0, 8, scratch.get(), nullptr, nullptr);
  EXPECT_EQ(sums.loss_sum, 0.0);
  EXPECT_EQ(sums.valid_count, 0);
}

// A counted target outside [0, vv) is refused (as on the cpu) rather than read out of bounds; so are the
// vocab-parallel option and the z-loss, which this backend does not implement.
TEST(CudaCrossEntropy, RefusesBadTargetVocabParallelAndZLoss) {
  MT_REQUIRE_GPU();
  const Case c{37, 24, 130, 123, 8, UnembedLayout::kernel_DV, true, false, 61};
  Inputs in = make_inputs(c);
  in.targets[20] = 125;  // a padding column; token 20 counts (20 % 5 != 2)
  EXPECT_ANY_THROW(run_gpu(c, in, true));
  EXPECT_ANY_THROW(run_gpu(c, in, false));

  const Inputs good = make_inputs(c);
  DeviceBuffer<float> h(good.h), w(good.w);
  DeviceBuffer<int32_t> targets(good.targets);
  DeviceBuffer<float> scratch(static_cast<size_t>(kernels::cross_entropy_scratch_floats(c.C, c.V)));
  kernels::VocabParallel parallel;
  parallel.all_reduce_max = [](float*, int64_t) {};
  parallel.all_reduce_sum = [](double*, int64_t) {};
  EXPECT_ANY_THROW(cuda().unembed_cross_entropy(
      nullptr, nullptr, h.get(), w.get(), c.layout, targets.get(), nullptr, c.N, c.D, c.V, c.vocab_valid,
      /*z_loss_multiplier=*/0.0, c.C, scratch.get(), &parallel, nullptr));
  EXPECT_ANY_THROW(cuda().unembed_cross_entropy(
      nullptr, nullptr, h.get(), w.get(), c.layout, targets.get(), nullptr, c.N, c.D, c.V, c.vocab_valid,
      /*z_loss_multiplier=*/1e-4, c.C, scratch.get(), nullptr, nullptr));
}

// unembed_logits: the valid columns as the cpu's (kLogitTolerance), the padding columns exactly -inf
// (written over the garbage the buffer held).
TEST(CudaCrossEntropy, UnembedLogitsMatchCpu) {
  MT_REQUIRE_GPU();
  struct Shape {
    int64_t N, D, V, vocab_valid;
  };
  for (UnembedLayout layout : {UnembedLayout::kernel_DV, UnembedLayout::table_VD}) {
    for (const Shape& s : {Shape{5, 24, 130, 123}, Shape{3, 24, 130, 130}, Shape{64, 256, 4096, 4000}}) {
      const Case c{s.N, s.D, s.V, s.vocab_valid, 1, layout, false, false, 71};
      SCOPED_TRACE(c.name());
      const Inputs in = make_inputs(c);
      std::vector<float> cpu(static_cast<size_t>(s.N * s.V), 0.0f);
      kernels::unembed_logits(cpu.data(), in.h.data(), in.w.data(), layout, s.N, s.D, s.V, s.vocab_valid);
      DeviceBuffer<float> h(in.h), w(in.w);
      DeviceBuffer<float> out(std::vector<float>(static_cast<size_t>(s.N * s.V), kGarbage));
      cuda().unembed_logits(out.get(), h.get(), w.get(), layout, s.N, s.D, s.V, s.vocab_valid);
      const std::vector<float> gpu = out.read();
      std::vector<float> gpu_valid, cpu_valid;
      size_t bad_padding = 0;
      for (int64_t n = 0; n < s.N; ++n) {
        for (int64_t v = 0; v < s.V; ++v) {
          const auto i = static_cast<size_t>(n * s.V + v);
          if (v < s.vocab_valid) {
            gpu_valid.push_back(gpu[i]);
            cpu_valid.push_back(cpu[i]);
          } else if (!(std::isinf(gpu[i]) && gpu[i] < 0.0f && std::isinf(cpu[i]) && cpu[i] < 0.0f)) {
            ++bad_padding;
          }
        }
      }
      EXPECT_EQ(bad_padding, 0u) << "padding logits must be -inf";
      expect_close(gpu_valid, cpu_valid, kLogitTolerance, "logits");
    }
  }
}

}  // namespace
}  // namespace meshtrain::gpu_test
