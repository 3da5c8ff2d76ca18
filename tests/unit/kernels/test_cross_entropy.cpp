// Tests of the fused unembedding + cross-entropy: reference vs finite differences, fast vs reference,
// padding and masking, and the plain logits used for sampling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/cross_entropy.h"

namespace meshtrain::kernels {
namespace {

using testing::numeric_gradient;
using testing::random_values;
using testing::relative_error;
using testing::report_error;
using testing::to_float;

const char* layout_name(UnembedLayout layout) {
  return layout == UnembedLayout::kernel_DV ? "kernel_DV" : "table_VD";
}

// One test problem. Values are rounded to float so the float kernel and the double reference see the
// same inputs. Weights in padding positions are random too: they must not influence anything.
struct Problem {
  int64_t N, D, V, vocab_valid;
  UnembedLayout layout;
  std::vector<double> h, w;
  std::vector<int32_t> targets;
  std::vector<uint8_t> mask;  // empty = no mask (nullptr)

  Problem(int64_t n, int64_t d, int64_t v, int64_t valid, UnembedLayout unembed_layout, uint64_t seed)
      : N(n), D(d), V(v), vocab_valid(valid), layout(unembed_layout) {
    h = to_double(random_values(static_cast<size_t>(N * D), seed, -1.0, 1.0));
    w = to_double(random_values(static_cast<size_t>(D * V), seed + 1, -0.7, 0.7));
    targets.resize(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 7 + 3) % vocab_valid);
  }
  static std::vector<double> to_double(const std::vector<double>& values) {
    const std::vector<float> rounded = to_float(values);
    return std::vector<double>(rounded.begin(), rounded.end());
  }
  // Drops every token with index % period == phase; the dropped tokens get target -1, which must
  // never be read.
  void drop_tokens(int64_t period, int64_t phase) {
    mask.assign(static_cast<size_t>(N), 1);
    for (int64_t i = 0; i < N; ++i) {
      if (i % period == phase) {
        mask[i] = 0;
        targets[i] = -1;
      }
    }
  }
  const uint8_t* mask_ptr() const { return mask.empty() ? nullptr : mask.data(); }
  bool is_padding_weight(int64_t index) const {
    const int64_t column = layout == UnembedLayout::kernel_DV ? index % V : index / D;
    return column >= vocab_valid;
  }

  CrossEntropySums reference(std::vector<double>* dh, std::vector<double>* dw) const {
    return unembed_cross_entropy_reference<double>(dh ? dh->data() : nullptr, dw ? dw->data() : nullptr,
                                                   h.data(), w.data(), layout, targets.data(), mask_ptr(), N,
                                                   D, V, vocab_valid);
  }
  CrossEntropySums fast(std::vector<float>* dh, std::vector<float>* dw, int64_t chunk_tokens) const {
    const std::vector<float> h_float = to_float(h), w_float = to_float(w);
    std::vector<float> scratch(static_cast<size_t>(cross_entropy_scratch_floats(chunk_tokens, V)));
    return unembed_cross_entropy(dh ? dh->data() : nullptr, dw ? dw->data() : nullptr, h_float.data(),
                                 w_float.data(), layout, targets.data(), mask_ptr(), N, D, V, vocab_valid,
                                 chunk_tokens, scratch.data());
  }
};

constexpr UnembedLayout kLayouts[] = {UnembedLayout::kernel_DV, UnembedLayout::table_VD};

TEST(CrossEntropy, ReferenceGradientsMatchFiniteDifferences) {
  for (UnembedLayout layout : kLayouts) {
    Problem problem(6, 4, 7, 5, layout, 11);
    problem.drop_tokens(3, 1);
    std::vector<double> dh(problem.h.size(), 0.0), dw(problem.w.size(), 0.0);
    problem.reference(&dh, &dw);
    const auto loss = [&] { return problem.reference(nullptr, nullptr).loss_sum; };
    const std::vector<double> numeric_dh = numeric_gradient(loss, problem.h);
    const std::vector<double> numeric_dw = numeric_gradient(loss, problem.w);
    const double bound = 1e-7;
    const double error_dh = relative_error(dh, numeric_dh), error_dw = relative_error(dw, numeric_dw);
    report_error(std::string("reference dh vs finite differences ") + layout_name(layout), error_dh, bound);
    report_error(std::string("reference dw vs finite differences ") + layout_name(layout), error_dw, bound);
    EXPECT_LT(error_dh, bound);
    EXPECT_LT(error_dw, bound);
    // Dropped tokens contribute nothing: their dh rows are zero.
    for (int64_t d = 0; d < problem.D; ++d) EXPECT_EQ(dh[1 * problem.D + d], 0.0);
  }
}

TEST(CrossEntropy, FastMatchesReference) {
  const double bound = 1e-5;
  // Worst error over all configurations, printed once per quantity.
  double worst_loss = 0.0, worst_dh = 0.0, worst_dw = 0.0, worst_dw_twice = 0.0, worst_dw_only = 0.0;
  for (UnembedLayout layout : kLayouts) {
    for (bool masked : {true, false}) {
      Problem problem(37, 16, 50, 45, layout, 21);
      if (masked) problem.drop_tokens(5, 3);
      std::vector<double> ref_dh(problem.h.size(), 0.0), ref_dw(problem.w.size(), 0.0);
      const CrossEntropySums ref = problem.reference(&ref_dh, &ref_dw);
      EXPECT_EQ(ref.valid_count, masked ? 37 - 7 : 37);
      // Chunks that do not divide N, equal N, and exceed N.
      for (int64_t chunk : {8, 37, 64}) {
        const std::string name = std::string(layout_name(layout)) + (masked ? " masked" : " unmasked") +
                                 " chunk " + std::to_string(chunk);
        // dh is written: start it from garbage. dw accumulates: start it from nonzero values.
        std::vector<float> dh(problem.h.size(), 123.0f);
        const std::vector<float> dw_initial = to_float(random_values(problem.w.size(), 31));
        std::vector<float> dw = dw_initial;
        const CrossEntropySums sums = problem.fast(&dh, &dw, chunk);
        EXPECT_EQ(sums.valid_count, ref.valid_count) << name;
        const double loss_error = std::fabs(sums.loss_sum - ref.loss_sum) / std::fabs(ref.loss_sum);
        std::vector<double> expected_dw(dw.size());
        for (size_t i = 0; i < dw.size(); ++i) expected_dw[i] = dw_initial[i] + ref_dw[i];
        const double dh_error = relative_error(dh, ref_dh), dw_error = relative_error(dw, expected_dw);
        EXPECT_LT(loss_error, bound) << name;
        EXPECT_LT(dh_error, bound) << name;
        EXPECT_LT(dw_error, bound) << name;

        // A second call adds the same gradient again.
        problem.fast(&dh, &dw, chunk);
        for (size_t i = 0; i < dw.size(); ++i) expected_dw[i] = dw_initial[i] + 2.0 * ref_dw[i];
        const double dw_twice_error = relative_error(dw, expected_dw);
        EXPECT_LT(dw_twice_error, bound) << name;

        // Eval only (no gradients) computes the loss the same way.
        const CrossEntropySums eval = problem.fast(nullptr, nullptr, chunk);
        EXPECT_EQ(eval.loss_sum, sums.loss_sum) << name;
        EXPECT_EQ(eval.valid_count, sums.valid_count) << name;

        // Only dh, or only dw, requested.
        std::vector<float> dh_only(problem.h.size(), -5.0f);
        problem.fast(&dh_only, nullptr, chunk);
        EXPECT_EQ(dh_only, dh) << name;
        std::vector<float> dw_only = dw_initial;
        problem.fast(nullptr, &dw_only, chunk);
        for (size_t i = 0; i < dw.size(); ++i) expected_dw[i] = dw_initial[i] + ref_dw[i];
        const double dw_only_error = relative_error(dw_only, expected_dw);
        EXPECT_LT(dw_only_error, bound) << name;

        worst_loss = std::max(worst_loss, loss_error);
        worst_dh = std::max(worst_dh, dh_error);
        worst_dw = std::max(worst_dw, dw_error);
        worst_dw_twice = std::max(worst_dw_twice, dw_twice_error);
        worst_dw_only = std::max(worst_dw_only, dw_only_error);
      }
    }
  }
  report_error("fast vs reference: loss_sum (worst config)", worst_loss, bound);
  report_error("fast vs reference: dh (worst config)", worst_dh, bound);
  report_error("fast vs reference: dw += once (worst config)", worst_dw, bound);
  report_error("fast vs reference: dw += twice (worst config)", worst_dw_twice, bound);
  report_error("fast vs reference: dw only (worst config)", worst_dw_only, bound);
}

TEST(CrossEntropy, FastMatchesReferenceAtLargeVocabAndSpread) {
  // The row softmax runs in blocks of 16 lanes plus a tail: 1037 valid columns are 64 blocks and 13 more.
  // h scaled by 32 (exact in float) spreads the logits over about +-180, so most exponentials underflow to 0
  // and the row maxima land in different lanes and in the tail.
  const double bound = 1e-5;
  for (UnembedLayout layout : kLayouts) {
    Problem problem(9, 8, 1100, 1037, layout, 41);
    for (double& value : problem.h) value *= 32.0;
    for (int64_t chunk : {4, 9}) {
      const std::string name = std::string(layout_name(layout)) + " chunk " + std::to_string(chunk);
      std::vector<double> ref_dh(problem.h.size(), 0.0), ref_dw(problem.w.size(), 0.0);
      const CrossEntropySums ref = problem.reference(&ref_dh, &ref_dw);
      std::vector<float> dh(problem.h.size(), 7.0f), dw(problem.w.size(), 0.0f);
      const CrossEntropySums sums = problem.fast(&dh, &dw, chunk);
      const double loss_error = std::fabs(sums.loss_sum - ref.loss_sum) / std::fabs(ref.loss_sum);
      const double dh_error = relative_error(dh, ref_dh), dw_error = relative_error(dw, ref_dw);
      report_error("large vocab and spread: loss " + name, loss_error, bound);
      report_error("large vocab and spread: dh " + name, dh_error, bound);
      report_error("large vocab and spread: dw " + name, dw_error, bound);
      EXPECT_LT(loss_error, bound) << name;
      EXPECT_LT(dh_error, bound) << name;
      EXPECT_LT(dw_error, bound) << name;
      EXPECT_EQ(problem.fast(nullptr, nullptr, chunk).loss_sum, sums.loss_sum) << name;
    }
  }
}

TEST(CrossEntropy, PaddingColumnsGetExactlyZeroGradient) {
  for (UnembedLayout layout : kLayouts) {
    Problem problem(13, 8, 24, 19, layout, 41);
    // Large padding weights would dominate the softmax if they were not excluded.
    for (size_t i = 0; i < problem.w.size(); ++i) {
      if (problem.is_padding_weight(static_cast<int64_t>(i))) problem.w[i] = 50.0;
    }
    std::vector<float> dh(problem.h.size()), dw(problem.w.size(), 0.0f);
    const CrossEntropySums sums = problem.fast(&dh, &dw, 4);
    std::vector<double> ref_dh(problem.h.size(), 0.0), ref_dw(problem.w.size(), 0.0);
    const CrossEntropySums ref = problem.reference(&ref_dh, &ref_dw);
    EXPECT_LT(std::fabs(sums.loss_sum - ref.loss_sum) / ref.loss_sum, 1e-5) << layout_name(layout);
    EXPECT_LT(relative_error(dh, ref_dh), 1e-5) << layout_name(layout);
    int64_t nonzero = 0;
    for (size_t i = 0; i < dw.size(); ++i) {
      if (problem.is_padding_weight(static_cast<int64_t>(i))) {
        EXPECT_EQ(dw[i], 0.0f) << layout_name(layout) << " index " << i;
        EXPECT_EQ(ref_dw[i], 0.0) << layout_name(layout) << " index " << i;
      } else {
        nonzero += dw[i] != 0.0f;
      }
    }
    EXPECT_GT(nonzero, 0) << layout_name(layout);
  }
}

TEST(CrossEntropy, AllTokensMaskedGivesZero) {
  for (UnembedLayout layout : kLayouts) {
    Problem problem(9, 8, 24, 19, layout, 51);
    problem.drop_tokens(1, 0);
    std::vector<float> dh(problem.h.size(), 5.0f), dw(problem.w.size(), 0.0f);
    const CrossEntropySums sums = problem.fast(&dh, &dw, 4);
    EXPECT_EQ(sums.loss_sum, 0.0);
    EXPECT_EQ(sums.valid_count, 0);
    for (float value : dh) EXPECT_EQ(value, 0.0f);
    for (float value : dw) EXPECT_EQ(value, 0.0f);
    std::vector<double> ref_dh(problem.h.size(), 5.0), ref_dw(problem.w.size(), 0.0);
    const CrossEntropySums ref = problem.reference(&ref_dh, &ref_dw);
    EXPECT_EQ(ref.loss_sum, 0.0);
    EXPECT_EQ(ref.valid_count, 0);
    for (double value : ref_dh) EXPECT_EQ(value, 0.0);
  }
}

TEST(CrossEntropy, TargetOutsideValidVocabIsAnInternalError) {
  Problem problem(4, 8, 24, 19, UnembedLayout::kernel_DV, 61);
  problem.targets[2] = 19;  // a padding column
  EXPECT_THROW(problem.fast(nullptr, nullptr, 4), std::logic_error);
}

TEST(CrossEntropy, LogitsMatchReferenceWithPaddingAtMinusInfinity) {
  for (UnembedLayout layout : kLayouts) {
    Problem problem(3, 16, 50, 45, layout, 71);
    const std::vector<float> h = to_float(problem.h), w = to_float(problem.w);
    std::vector<float> out(static_cast<size_t>(problem.N * problem.V), 0.0f);
    unembed_logits(out.data(), h.data(), w.data(), layout, problem.N, problem.D, problem.V,
                   problem.vocab_valid);
    std::vector<double> expected, got;
    for (int64_t n = 0; n < problem.N; ++n) {
      for (int64_t v = 0; v < problem.V; ++v) {
        const float value = out[n * problem.V + v];
        if (v >= problem.vocab_valid) {
          EXPECT_TRUE(std::isinf(value) && value < 0.0f) << layout_name(layout) << " column " << v;
          continue;
        }
        double sum = 0.0;
        for (int64_t d = 0; d < problem.D; ++d) {
          const int64_t index = layout == UnembedLayout::kernel_DV ? d * problem.V + v : v * problem.D + d;
          sum += problem.h[n * problem.D + d] * problem.w[index];
        }
        expected.push_back(sum);
        got.push_back(value);
      }
    }
    const double error = relative_error(got, expected), bound = 1e-5;
    report_error(std::string("unembed_logits vs reference ") + layout_name(layout), error, bound);
    EXPECT_LT(error, bound);
  }
}

}  // namespace
}  // namespace meshtrain::kernels
