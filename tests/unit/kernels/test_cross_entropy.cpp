// Tests of the fused unembedding + cross-entropy: reference vs finite differences, fast vs reference,
// padding and masking, vocab-parallel shards against the unsharded kernel, the z-loss (also against a
// PyTorch golden file), and the plain logits used for sampling.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/core/dtype.h"
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

// Index of weight (d, v) in a layout with V columns (kernel_DV [D, V]) or rows (table_VD [V, D]).
int64_t weight_index(UnembedLayout layout, int64_t d, int64_t v, int64_t D, int64_t V) {
  return layout == UnembedLayout::kernel_DV ? d * V + v : v * D + d;
}

// One test problem. Values are rounded to float so the float kernel and the double reference see the
// same inputs. Weights in padding positions are random too: they must not influence anything.
struct Problem {
  int64_t N, D, V, vocab_valid;
  UnembedLayout layout;
  std::vector<double> h, w;
  std::vector<int32_t> targets;
  std::vector<uint8_t> mask;       // empty = no mask (nullptr)
  double z_loss_multiplier = 0.0;  // m: m lse^2 per counted token

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
                                                   D, V, vocab_valid, z_loss_multiplier);
  }
  // bf16: with bf16 inputs (dtype=bfloat16).
  CrossEntropySums fast(std::vector<float>* dh, std::vector<float>* dw, int64_t chunk_tokens,
                        bool bf16 = false) const {
    const std::vector<float> h_float = to_float(h), w_float = to_float(w);
    std::vector<float> scratch(static_cast<size_t>(cross_entropy_scratch_floats(chunk_tokens, V)));
    std::vector<uint16_t> bf16_scratch(
        bf16 ? static_cast<size_t>(cross_entropy_bf16_scratch_elements(N, chunk_tokens, D, V)) : 0);
    return unembed_cross_entropy(dh ? dh->data() : nullptr, dw ? dw->data() : nullptr, h_float.data(),
                                 w_float.data(), layout, targets.data(), mask_ptr(), N, D, V, vocab_valid,
                                 z_loss_multiplier, chunk_tokens, scratch.data(), nullptr,
                                 bf16 ? bf16_scratch.data() : nullptr);
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

// Without and with the z-loss (m = 0.3); the cross-entropy sum is bitwise the same either way.
TEST(CrossEntropy, FastMatchesReference) {
  const double bound = 1e-5;
  // Worst error over all configurations, printed once per quantity.
  double worst_loss = 0.0, worst_z_loss = 0.0, worst_dh = 0.0, worst_dw = 0.0, worst_dw_twice = 0.0,
         worst_dw_only = 0.0;
  for (const auto& [layout, masked, z_loss_multiplier] :
       {std::tuple{UnembedLayout::kernel_DV, true, 0.0}, std::tuple{UnembedLayout::kernel_DV, false, 0.0},
        std::tuple{UnembedLayout::table_VD, true, 0.0}, std::tuple{UnembedLayout::table_VD, false, 0.0},
        std::tuple{UnembedLayout::kernel_DV, true, 0.3}, std::tuple{UnembedLayout::kernel_DV, false, 0.3},
        std::tuple{UnembedLayout::table_VD, true, 0.3}, std::tuple{UnembedLayout::table_VD, false, 0.3}}) {
    Problem problem(37, 16, 50, 45, layout, 21);
    if (masked) problem.drop_tokens(5, 3);
    problem.z_loss_multiplier = z_loss_multiplier;
    std::vector<double> ref_dh(problem.h.size(), 0.0), ref_dw(problem.w.size(), 0.0);
    const CrossEntropySums ref = problem.reference(&ref_dh, &ref_dw);
    EXPECT_EQ(ref.valid_count, masked ? 37 - 7 : 37);
    // Chunks that do not divide N, equal N, and exceed N.
    for (int64_t chunk : {8, 37, 64}) {
      const std::string name = std::string(layout_name(layout)) + (masked ? " masked" : " unmasked") +
                               " chunk " + std::to_string(chunk) + " z_loss_multiplier " +
                               std::to_string(z_loss_multiplier);
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
      if (z_loss_multiplier == 0.0) {
        EXPECT_EQ(sums.z_loss_sum, 0.0) << name;
      } else {
        const double z_loss_error = std::fabs(sums.z_loss_sum - ref.z_loss_sum) / ref.z_loss_sum;
        EXPECT_LT(z_loss_error, bound) << name;
        worst_z_loss = std::max(worst_z_loss, z_loss_error);
        Problem plain = problem;
        plain.z_loss_multiplier = 0.0;
        EXPECT_EQ(plain.fast(nullptr, nullptr, chunk).loss_sum, sums.loss_sum) << name;
      }

      // A second call adds the same gradient again.
      problem.fast(&dh, &dw, chunk);
      for (size_t i = 0; i < dw.size(); ++i) expected_dw[i] = dw_initial[i] + 2.0 * ref_dw[i];
      const double dw_twice_error = relative_error(dw, expected_dw);
      EXPECT_LT(dw_twice_error, bound) << name;

      // Eval only (no gradients) computes the losses the same way.
      const CrossEntropySums eval = problem.fast(nullptr, nullptr, chunk);
      EXPECT_EQ(eval.loss_sum, sums.loss_sum) << name;
      EXPECT_EQ(eval.z_loss_sum, sums.z_loss_sum) << name;
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
  report_error("fast vs reference: loss_sum (worst config)", worst_loss, bound);
  report_error("fast vs reference: z_loss_sum (worst config)", worst_z_loss, bound);
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

// The z-loss (m lse^2 per counted token): the reference's gradients of loss_sum + z_loss_sum against
// finite differences. A z-loss of 0, or gradients of the cross-entropy alone, would fail the checks below
// the finite differences.
TEST(CrossEntropy, ZLossReferenceGradientsMatchFiniteDifferences) {
  for (UnembedLayout layout : kLayouts) {
    Problem problem(6, 4, 7, 5, layout, 11);
    problem.drop_tokens(3, 1);
    problem.z_loss_multiplier = 0.3;
    std::vector<double> dh(problem.h.size(), 0.0), dw(problem.w.size(), 0.0);
    const CrossEntropySums sums = problem.reference(&dh, &dw);
    const auto loss = [&] {
      const CrossEntropySums at = problem.reference(nullptr, nullptr);
      return at.loss_sum + at.z_loss_sum;
    };
    const std::vector<double> numeric_dh = numeric_gradient(loss, problem.h);
    const std::vector<double> numeric_dw = numeric_gradient(loss, problem.w);
    const double bound = 1e-7;
    const double error_dh = relative_error(dh, numeric_dh), error_dw = relative_error(dw, numeric_dw);
    report_error(std::string("z-loss reference dh vs finite differences ") + layout_name(layout), error_dh,
                 bound);
    report_error(std::string("z-loss reference dw vs finite differences ") + layout_name(layout), error_dw,
                 bound);
    EXPECT_LT(error_dh, bound);
    EXPECT_LT(error_dw, bound);
    // The z-loss is there and moves the gradients; the cross-entropy sum does not depend on it.
    Problem plain = problem;
    plain.z_loss_multiplier = 0.0;
    std::vector<double> plain_dh(problem.h.size(), 0.0), plain_dw(problem.w.size(), 0.0);
    const CrossEntropySums plain_sums = plain.reference(&plain_dh, &plain_dw);
    EXPECT_GT(sums.z_loss_sum, 0.0);
    EXPECT_EQ(plain_sums.z_loss_sum, 0.0);
    EXPECT_EQ(sums.loss_sum, plain_sums.loss_sum);
    EXPECT_GT(relative_error(dh, plain_dh), 1e-2);
    EXPECT_GT(relative_error(dw, plain_dw), 1e-2);
  }
}

// The z-loss against PyTorch (tests/reference/z_loss_golden: F.cross_entropy and torch.logsumexp on float64
// logits, autograd's gradients) on the same float32 inputs: the float32 kernel in both layouts, chunks that
// do not divide N, within the float32 bound; the double reference to double rounding.
TEST(CrossEntropy, ZLossMatchesThePyTorchGolden) {
  const std::string path = std::string(MESHTRAIN_SOURCE_DIR) + "/tests/reference/z_loss_golden/golden.json";
  std::ifstream file(path);
  ASSERT_TRUE(file.good()) << path;
  const nlohmann::json golden = nlohmann::json::parse(file);
  const int64_t N = golden.at("N"), D = golden.at("D"), V = golden.at("V"), valid = golden.at("vocab_valid");
  const auto values = [&](const char* key) { return golden.at(key).get<std::vector<double>>(); };
  const std::vector<double> h = values("h"), w_dv = values("w_DV"), dh = values("dh"),
                            dw_dv = values("dw_DV");
  for (UnembedLayout layout : kLayouts) {
    Problem problem(N, D, V, valid, layout, 0);
    problem.h = h;
    problem.targets = golden.at("targets").get<std::vector<int32_t>>();
    problem.mask = golden.at("mask").get<std::vector<uint8_t>>();
    problem.z_loss_multiplier = golden.at("z_loss_multiplier");
    // The tied layout's table [V, D] is W [D, V] transposed.
    std::vector<double> golden_dw(dw_dv.size());
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t v = 0; v < V; ++v) {
        problem.w[weight_index(layout, d, v, D, V)] = w_dv[d * V + v];
        golden_dw[weight_index(layout, d, v, D, V)] = dw_dv[d * V + v];
      }
    }
    const double loss_sum = golden.at("loss_sum"), z_loss_sum = golden.at("z_loss_sum");
    for (int64_t chunk : {4, 11}) {
      const std::string name = std::string(layout_name(layout)) + " chunk " + std::to_string(chunk);
      std::vector<float> fast_dh(h.size(), 123.0f), fast_dw(golden_dw.size(), 0.0f);
      const CrossEntropySums fast = problem.fast(&fast_dh, &fast_dw, chunk);
      const double errors[] = {std::fabs(fast.loss_sum - loss_sum) / loss_sum,
                               std::fabs(fast.z_loss_sum - z_loss_sum) / z_loss_sum,
                               relative_error(fast_dh, dh), relative_error(fast_dw, golden_dw)};
      for (double error : errors) EXPECT_LT(error, 1e-5) << name;
      report_error("z-loss float32 kernel vs PyTorch (worst) " + name,
                   *std::max_element(std::begin(errors), std::end(errors)), 1e-5);
      for (size_t i = 0; i < fast_dw.size(); ++i) {
        if (problem.is_padding_weight(static_cast<int64_t>(i))) {
          EXPECT_EQ(fast_dw[i], 0.0f) << name << " padding index " << i;
        }
      }
    }
    std::vector<double> ref_dh(h.size(), 0.0), ref_dw(golden_dw.size(), 0.0);
    const CrossEntropySums ref = problem.reference(&ref_dh, &ref_dw);
    const double reference_errors[] = {std::fabs(ref.loss_sum - loss_sum) / loss_sum,
                                       std::fabs(ref.z_loss_sum - z_loss_sum) / z_loss_sum,
                                       relative_error(ref_dh, dh), relative_error(ref_dw, golden_dw)};
    for (double error : reference_errors) EXPECT_LT(error, 1e-12) << layout_name(layout);
  }
}

// bf16 inputs (dtype=bfloat16): the loss is the reference's on h and W rounded to bf16 (float32 sums: the
// float32 bound). The gradients' GEMMs also round dlogits to bf16 (relative error <= 2^-9 per element), so
// each gradient element may differ from the reference's by up to 2^-9 times the sum of the magnitudes of
// the terms it adds; the test allows twice that plus the float32 bound, element by element. Without and
// with the z-loss (m = 0.3: dlogits softmax (1 + 2 m lse) - onehot, the z-loss sum within the loss's bound).
TEST(CrossEntropy, Bf16InputsMatchTheReferenceOnRoundedInputs) {
  // 37 tokens: one weight-gradient group; 2,100: three groups of whole chunks (cross_entropy_group_tokens),
  // the last one shorter. Vocabulary 50: one logits block; 3,000 (2,950 valid): three, so the online softmax
  // rescales a row's sum whenever a later block raises its maximum.
  for (const auto& [tokens, vocab, valid_columns, layout, z_loss_multiplier] :
       {std::tuple{int64_t{37}, int64_t{50}, int64_t{45}, UnembedLayout::kernel_DV, 0.0},
        std::tuple{int64_t{37}, int64_t{50}, int64_t{45}, UnembedLayout::table_VD, 0.0},
        std::tuple{int64_t{37}, int64_t{50}, int64_t{45}, UnembedLayout::kernel_DV, 0.3},
        std::tuple{int64_t{37}, int64_t{50}, int64_t{45}, UnembedLayout::table_VD, 0.3},
        std::tuple{int64_t{2100}, int64_t{50}, int64_t{45}, UnembedLayout::kernel_DV, 0.0},
        std::tuple{int64_t{2100}, int64_t{50}, int64_t{45}, UnembedLayout::table_VD, 0.3},
        std::tuple{int64_t{19}, int64_t{3000}, int64_t{2950}, UnembedLayout::table_VD, 0.0},
        std::tuple{int64_t{19}, int64_t{3000}, int64_t{2950}, UnembedLayout::kernel_DV, 0.3}}) {
    Problem problem(tokens, 16, vocab, valid_columns, layout, 61);
    problem.drop_tokens(5, 2);
    problem.z_loss_multiplier = z_loss_multiplier;
    for (double& value : problem.h)
      value = float_from_bfloat16(bfloat16_from_float(static_cast<float>(value)));
    for (double& value : problem.w)
      value = float_from_bfloat16(bfloat16_from_float(static_cast<float>(value)));
    const int64_t N = problem.N, D = problem.D, V = problem.V, valid = problem.vocab_valid;
    const auto weight = [&](int64_t d, int64_t v) {
      return problem.w[static_cast<size_t>(layout == UnembedLayout::kernel_DV ? d * V + v : v * D + d)];
    };
    std::vector<double> ref_dh(problem.h.size(), 0.0), ref_dw(problem.w.size(), 0.0);
    const CrossEntropySums ref = problem.reference(&ref_dh, &ref_dw);
    // dlogits in double: softmax over the valid columns times (1 + 2 m lse) minus the target's one-hot, zero
    // for dropped rows.
    std::vector<double> dlogits(static_cast<size_t>(N * valid), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      if (!problem.mask.empty() && problem.mask[n] == 0) continue;
      double peak = -1e300, total = 0.0;
      std::vector<double> row(static_cast<size_t>(valid));
      for (int64_t v = 0; v < valid; ++v) {
        for (int64_t d = 0; d < D; ++d) row[v] += problem.h[n * D + d] * weight(d, v);
        peak = std::max(peak, row[v]);
      }
      for (double& value : row) total += (value = std::exp(value - peak));
      const double z_loss_factor = 1.0 + 2.0 * z_loss_multiplier * (peak + std::log(total));
      for (int64_t v = 0; v < valid; ++v)
        dlogits[n * valid + v] = row[v] / total * z_loss_factor - (v == problem.targets[n]);
    }
    for (int64_t chunk : {8, 64}) {
      const std::string name = std::string(layout_name(layout)) + " N " + std::to_string(N) + " chunk " +
                               std::to_string(chunk) + " z_loss_multiplier " +
                               std::to_string(z_loss_multiplier);
      if (N > 1000) {
        EXPECT_GT(N, 2 * cross_entropy_group_tokens(N, chunk, V)) << name << ": three groups";
      }
      const std::vector<float> h = to_float(problem.h), w = to_float(problem.w);
      std::vector<float> scratch(static_cast<size_t>(cross_entropy_scratch_floats(chunk, V)));
      std::vector<uint16_t> bf16(static_cast<size_t>(cross_entropy_bf16_scratch_elements(N, chunk, D, V)));
      std::vector<float> dh(h.size(), 123.0f), dw(w.size(), 0.0f);
      const CrossEntropySums sums = unembed_cross_entropy(
          dh.data(), dw.data(), h.data(), w.data(), layout, problem.targets.data(), problem.mask_ptr(), N, D,
          V, valid, z_loss_multiplier, chunk, scratch.data(), nullptr, bf16.data());
      EXPECT_EQ(sums.valid_count, ref.valid_count) << name;
      EXPECT_LT(std::fabs(sums.loss_sum - ref.loss_sum) / std::fabs(ref.loss_sum), 1e-5) << name;
      if (z_loss_multiplier == 0.0) {
        EXPECT_EQ(sums.z_loss_sum, 0.0) << name;
      } else {
        EXPECT_LT(std::fabs(sums.z_loss_sum - ref.z_loss_sum) / ref.z_loss_sum, 1e-5) << name;
      }
      // The eval-only call (no gradients) computes the same losses bit for bit.
      const CrossEntropySums eval = unembed_cross_entropy(
          nullptr, nullptr, h.data(), w.data(), layout, problem.targets.data(), problem.mask_ptr(), N, D, V,
          valid, z_loss_multiplier, chunk, scratch.data(), nullptr, bf16.data());
      EXPECT_EQ(eval.loss_sum, sums.loss_sum) << name;
      EXPECT_EQ(eval.z_loss_sum, sums.z_loss_sum) << name;
      const double rounding = 2.0 * 0x1p-9;
      double worst = 0.0;  // the largest error as a fraction of its element's allowance
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t d = 0; d < D; ++d) {
          double terms = 0.0;
          for (int64_t v = 0; v < valid; ++v) terms += std::fabs(dlogits[n * valid + v] * weight(d, v));
          const double allowed = rounding * terms + 1e-5 * (std::fabs(ref_dh[n * D + d]) + 1e-3);
          worst = std::max(worst, std::fabs(dh[n * D + d] - ref_dh[n * D + d]) / allowed);
        }
      }
      for (int64_t d = 0; d < D; ++d) {
        for (int64_t v = 0; v < V; ++v) {
          const size_t index =
              static_cast<size_t>(layout == UnembedLayout::kernel_DV ? d * V + v : v * D + d);
          if (v >= valid) {
            EXPECT_EQ(dw[index], 0.0f) << name << ": a padding column's gradient";
            continue;
          }
          double terms = 0.0;
          for (int64_t n = 0; n < N; ++n) terms += std::fabs(problem.h[n * D + d] * dlogits[n * valid + v]);
          const double allowed = rounding * terms + 1e-5 * (std::fabs(ref_dw[index]) + 1e-3);
          worst = std::max(worst, std::fabs(dw[index] - ref_dw[index]) / allowed);
        }
      }
      EXPECT_LT(worst, 1.0) << name;
      report_error("bf16 cross-entropy gradients, error / allowance " + name, worst, 1.0);
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

// The bf16 loss's weight-gradient groups: whole chunks, about 1,000 tokens, at most 128M dlogits, equal but
// the last; one chunk per group where the chunk is already that long.
TEST(CrossEntropy, WeightGradientGroupsAreWholeChunks) {
  EXPECT_EQ(cross_entropy_group_tokens(2048, 512, 50257), 512);   // gpt2-124m 8 x 256: per chunk
  EXPECT_EQ(cross_entropy_group_tokens(2048, 205, 151936), 820);  // qwen3-0.6b at 2048: 4 + 4 + 2 chunks
  EXPECT_EQ(cross_entropy_group_tokens(100, 205, 151936), 100);   // under one chunk
  EXPECT_EQ(cross_entropy_group_tokens(0, 205, 151936), 1);
  EXPECT_EQ(cross_entropy_group_tokens(4096, 8, 50), 8 * 103);  // 512 chunks: 4 x 103 + 100
  for (const int64_t V : {int64_t{50}, int64_t{50257}, int64_t{151936}}) {
    for (const int64_t N : {int64_t{1}, int64_t{300}, int64_t{2048}, int64_t{8192}, int64_t{65536}}) {
      const int64_t chunk = cross_entropy_chunk_tokens(N, V), group = cross_entropy_group_tokens(N, chunk, V);
      EXPECT_EQ(group % std::min(chunk, N), 0) << "N " << N << " V " << V;
      EXPECT_LE(group, std::max<int64_t>(std::max(chunk, (int64_t{1} << 27) / V), 1000))
          << "N " << N << " V " << V;
      EXPECT_LE(group, N) << "N " << N << " V " << V;
    }
  }
}

// The chunks the model runs the loss in: at most 32M logits each, equal to within one token, and as few as
// the cap allows (a last chunk of a few tokens would pass over the whole table for almost no work).
TEST(CrossEntropy, ChunksAreEqualAndUnderTheCap) {
  EXPECT_EQ(cross_entropy_chunk_tokens(2048, 50257), 512);   // 4 x 512, not 3 x 667 + 47
  EXPECT_EQ(cross_entropy_chunk_tokens(2048, 151936), 205);  // 10 chunks, the last 203
  EXPECT_EQ(cross_entropy_chunk_tokens(300, 50257), 300);    // under the cap: one chunk
  EXPECT_EQ(cross_entropy_chunk_tokens(0, 50257), 1);
  EXPECT_EQ(cross_entropy_chunk_tokens(5, int64_t{1} << 26), 1);  // a row over the cap still runs
  for (const int64_t V : {int64_t{97}, int64_t{50257}, int64_t{151936}}) {
    const int64_t cap = std::max<int64_t>((int64_t{1} << 25) / V, 1);
    for (const int64_t N : {int64_t{1}, cap - 1, cap, cap + 1, 2 * cap + 3, int64_t{4096}, int64_t{100003}}) {
      if (N < 1) continue;
      const int64_t chunk = cross_entropy_chunk_tokens(N, V);
      const int64_t chunks = (N + chunk - 1) / chunk;
      EXPECT_LE(chunk, cap) << "N " << N << " V " << V;
      EXPECT_EQ(chunks, (N + cap - 1) / cap) << "N " << N << " V " << V;
      EXPECT_GE(N - (chunks - 1) * chunk, chunk - chunks) << "last chunk, N " << N << " V " << V;
    }
  }
}

TEST(CrossEntropy, TargetOutsideValidVocabIsAnInternalError) {
  Problem problem(4, 8, 24, 19, UnembedLayout::kernel_DV, 61);
  problem.targets[2] = 19;  // a padding column
  EXPECT_THROW(problem.fast(nullptr, nullptr, 4), std::logic_error);
}

// The all-reduces of `ranks` threads, one per tensor rank: every rank posts its buffer, waits for the others,
// reduces all buffers in rank order (so every rank gets the same, deterministic result), waits again until
// every rank has read every buffer, and writes the result in place.
class ThreadReducer {
 public:
  explicit ThreadReducer(int64_t ranks)
      : ranks_(ranks),
        barrier_(ranks),
        floats_(static_cast<size_t>(ranks)),
        doubles_(static_cast<size_t>(ranks)),
        counts_(static_cast<size_t>(ranks)) {}

  void max(int64_t rank, float* values, int64_t count) {
    floats_[rank] = values;
    counts_[rank] = count;
    barrier_.arrive_and_wait();
    std::vector<float> result(values, values + count);
    for (int64_t other = 0; other < ranks_; ++other) {
      if (counts_[other] != count) mismatch_ = true;
      for (int64_t i = 0; i < std::min(count, counts_[other]); ++i) {
        result[i] = std::max(result[i], floats_[other][i]);
      }
    }
    barrier_.arrive_and_wait();
    std::copy(result.begin(), result.end(), values);
  }

  void sum(int64_t rank, double* values, int64_t count) {
    doubles_[rank] = values;
    counts_[rank] = count;
    barrier_.arrive_and_wait();
    std::vector<double> result(static_cast<size_t>(count), 0.0);
    for (int64_t other = 0; other < ranks_; ++other) {
      if (counts_[other] != count) mismatch_ = true;
      for (int64_t i = 0; i < std::min(count, counts_[other]); ++i) result[i] += doubles_[other][i];
    }
    barrier_.arrive_and_wait();
    std::copy(result.begin(), result.end(), values);
  }

  bool mismatch() const { return mismatch_; }

 private:
  int64_t ranks_;
  std::barrier<> barrier_;
  std::vector<float*> floats_;
  std::vector<double*> doubles_;
  std::vector<int64_t> counts_;
  std::atomic<bool> mismatch_{false};
};

struct ShardRun {
  CrossEntropySums sums;
  std::vector<float> dh, dw;  // dh written over garbage, dw accumulated onto dw_initial
  std::vector<float> dw_initial;
  int64_t max_calls = 0, sum_calls = 0;    // callback calls
  int64_t max_values = 0, sum_values = 0;  // values passed over all calls
};

// Runs `problem` split into `ranks` vocab shards of problem.V / ranks columns (kernel_DV) or rows (table_VD),
// one std::thread per rank, combined by a ThreadReducer.
std::vector<ShardRun> run_vocab_shards(const Problem& problem, int64_t ranks, int64_t chunk, bool gradients,
                                       bool bf16 = false) {
  const int64_t D = problem.D, V = problem.V / ranks;
  const std::vector<float> h = to_float(problem.h);
  std::vector<ShardRun> runs(static_cast<size_t>(ranks));
  std::vector<std::vector<float>> weights(static_cast<size_t>(ranks));
  for (int64_t rank = 0; rank < ranks; ++rank) {
    std::vector<float>& w = weights[rank];
    w.resize(static_cast<size_t>(D * V));
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t v = 0; v < V; ++v) {
        w[weight_index(problem.layout, d, v, D, V)] =
            static_cast<float>(problem.w[weight_index(problem.layout, d, rank * V + v, D, problem.V)]);
      }
    }
    if (gradients) {
      runs[rank].dh.assign(h.size(), 123.0f);
      runs[rank].dw_initial = to_float(random_values(w.size(), 300 + static_cast<uint64_t>(rank)));
      runs[rank].dw = runs[rank].dw_initial;
    }
  }
  ThreadReducer reducer(ranks);
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      ShardRun& run = runs[rank];
      VocabParallel parallel;
      parallel.vocab_offset = rank * V;
      parallel.all_reduce_max = [&](float* values, int64_t count) {
        run.max_calls += 1;
        run.max_values += count;
        reducer.max(rank, values, count);
      };
      parallel.all_reduce_sum = [&](double* values, int64_t count) {
        run.sum_calls += 1;
        run.sum_values += count;
        reducer.sum(rank, values, count);
      };
      std::vector<float> scratch(static_cast<size_t>(cross_entropy_scratch_floats(chunk, V)));
      std::vector<uint16_t> bf16_scratch(
          bf16 ? static_cast<size_t>(cross_entropy_bf16_scratch_elements(problem.N, chunk, D, V)) : 0);
      run.sums = unembed_cross_entropy(gradients ? run.dh.data() : nullptr,
                                       gradients ? run.dw.data() : nullptr, h.data(), weights[rank].data(),
                                       problem.layout, problem.targets.data(), problem.mask_ptr(), problem.N,
                                       D, V, problem.vocab_valid, problem.z_loss_multiplier, chunk,
                                       scratch.data(), &parallel, bf16 ? bf16_scratch.data() : nullptr);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_FALSE(reducer.mismatch());
  return runs;
}

TEST(CrossEntropy, VocabParallelShardsMatchUnsharded) {
  // {ranks, columns per rank, vocab_valid, z_loss_multiplier}: the last valid column falls inside a rank (the
  // rest of it and any later rank is padding), on a rank boundary (rank 1 of 2 holds only padding), and ranks
  // without any valid column (t = 3); each without and with the z-loss (its logsumexp from the combined
  // statistics).
  struct Split {
    int64_t ranks, V, vocab_valid;
    double z_loss_multiplier;
  };
  const Split splits[] = {{2, 16, 27, 0.0}, {2, 12, 12, 0.0}, {3, 12, 23, 0.0}, {4, 10, 33, 0.0},
                          {2, 16, 27, 0.3}, {2, 12, 12, 0.3}, {3, 12, 23, 0.3}, {4, 10, 33, 0.3}};
  const double loss_bound = 1e-6, gradient_bound = 1e-5;
  double worst_loss = 0.0, worst_dh = 0.0, worst_dw = 0.0, worst_reference = 0.0;
  for (const Split& split : splits) {
    for (UnembedLayout layout : kLayouts) {
      Problem problem(23, 16, split.ranks * split.V, split.vocab_valid, layout, 81);
      problem.drop_tokens(4, 2);
      problem.z_loss_multiplier = split.z_loss_multiplier;
      // Padding weights that would dominate the softmax if they took part.
      for (size_t i = 0; i < problem.w.size(); ++i) {
        if (problem.is_padding_weight(static_cast<int64_t>(i))) problem.w[i] = 50.0;
      }
      std::vector<double> ref_dh(problem.h.size(), 0.0), ref_dw(problem.w.size(), 0.0);
      const CrossEntropySums ref = problem.reference(&ref_dh, &ref_dw);
      for (int64_t chunk : {1, 5, 23, 40}) {
        const std::string name = "ranks " + std::to_string(split.ranks) + " V " + std::to_string(split.V) +
                                 " valid " + std::to_string(split.vocab_valid) + " " + layout_name(layout) +
                                 " chunk " + std::to_string(chunk) + " z_loss_multiplier " +
                                 std::to_string(split.z_loss_multiplier);
        std::vector<float> full_dh(problem.h.size(), 0.0f), full_dw(problem.w.size(), 0.0f);
        const CrossEntropySums full = problem.fast(&full_dh, &full_dw, chunk);
        const std::vector<ShardRun> runs = run_vocab_shards(problem, split.ranks, chunk, true);
        const std::vector<ShardRun> evals = run_vocab_shards(problem, split.ranks, chunk, false);
        const int64_t chunks = (problem.N + chunk - 1) / chunk;
        std::vector<double> dh_sum(problem.h.size(), 0.0);
        for (int64_t rank = 0; rank < split.ranks; ++rank) {
          const ShardRun& run = runs[rank];
          const std::string rank_name = name + " rank " + std::to_string(rank);
          EXPECT_EQ(run.sums.valid_count, full.valid_count) << rank_name;
          // Every rank reduces in the same order: the loss is bitwise the same everywhere, and the same
          // without gradients.
          EXPECT_EQ(run.sums.loss_sum, runs[0].sums.loss_sum) << rank_name;
          EXPECT_EQ(evals[rank].sums.loss_sum, run.sums.loss_sum) << rank_name;
          EXPECT_EQ(run.sums.z_loss_sum, runs[0].sums.z_loss_sum) << rank_name;
          EXPECT_EQ(evals[rank].sums.z_loss_sum, run.sums.z_loss_sum) << rank_name;
          EXPECT_EQ(run.max_calls, chunks) << rank_name;
          EXPECT_EQ(run.sum_calls, chunks) << rank_name;
          EXPECT_EQ(run.max_values, problem.N) << rank_name;
          EXPECT_EQ(run.sum_values, 2 * problem.N) << rank_name;
          for (size_t i = 0; i < dh_sum.size(); ++i) dh_sum[i] += run.dh[i];
          // dw: this rank's slice of the unsharded gradient, added onto the initial values; padding
          // untouched.
          std::vector<double> expected_dw(run.dw.size());
          std::vector<double> reference_dw(run.dw.size());
          for (int64_t d = 0; d < problem.D; ++d) {
            for (int64_t v = 0; v < split.V; ++v) {
              const int64_t local = weight_index(layout, d, v, problem.D, split.V);
              const int64_t global = weight_index(layout, d, rank * split.V + v, problem.D, problem.V);
              expected_dw[local] = static_cast<double>(run.dw_initial[local]) + full_dw[global];
              reference_dw[local] = static_cast<double>(run.dw_initial[local]) + ref_dw[global];
              if (rank * split.V + v >= split.vocab_valid) {
                EXPECT_EQ(run.dw[local], run.dw_initial[local]) << rank_name << " padding column " << v;
              }
            }
          }
          const double dw_error = relative_error(run.dw, expected_dw);
          EXPECT_LT(dw_error, gradient_bound) << rank_name;
          worst_dw = std::max(worst_dw, dw_error);
          worst_reference = std::max(worst_reference, relative_error(run.dw, reference_dw));
        }
        double loss_error = std::fabs(runs[0].sums.loss_sum - full.loss_sum) / std::fabs(full.loss_sum);
        if (split.z_loss_multiplier == 0.0) {
          EXPECT_EQ(runs[0].sums.z_loss_sum, 0.0) << name;
        } else {
          loss_error =
              std::max(loss_error, std::fabs(runs[0].sums.z_loss_sum - full.z_loss_sum) / full.z_loss_sum);
          const double ref_z_error = std::fabs(runs[0].sums.z_loss_sum - ref.z_loss_sum) / ref.z_loss_sum;
          EXPECT_LT(ref_z_error, gradient_bound) << name;
          worst_reference = std::max(worst_reference, ref_z_error);
        }
        const double dh_error = relative_error(dh_sum, full_dh);
        EXPECT_LT(loss_error, loss_bound) << name;
        EXPECT_LT(dh_error, gradient_bound) << name;
        worst_loss = std::max(worst_loss, loss_error);
        worst_dh = std::max(worst_dh, dh_error);
        // Against the double reference too.
        const double ref_loss_error =
            std::fabs(runs[0].sums.loss_sum - ref.loss_sum) / std::fabs(ref.loss_sum);
        const double ref_dh_error = relative_error(dh_sum, ref_dh);
        EXPECT_LT(ref_loss_error, gradient_bound) << name;
        EXPECT_LT(ref_dh_error, gradient_bound) << name;
        worst_reference = std::max({worst_reference, ref_loss_error, ref_dh_error});
      }
    }
  }
  EXPECT_LT(worst_reference, gradient_bound);
  report_error("vocab-parallel vs unsharded: loss / z-loss sums (worst)", worst_loss, loss_bound);
  report_error("vocab-parallel vs unsharded: sum of dh (worst config)", worst_dh, gradient_bound);
  report_error("vocab-parallel vs unsharded: dw slice (worst config)", worst_dw, gradient_bound);
  report_error("vocab-parallel vs double reference (worst of all)", worst_reference, gradient_bound);
}

// bf16 inputs, several logits blocks per rank (the online softmax rescales its sums as a later block raises a
// row's maximum): each rank's losses and gradient slices match the unsharded bf16 kernel's, up to the
// rounding of dlogits to bf16 taken at other block boundaries (a few elements one bf16 step apart).
TEST(CrossEntropy, VocabParallelBf16ShardsMatchUnshardedBf16) {
  for (UnembedLayout layout : kLayouts) {
    for (double z_loss_multiplier : {0.0, 0.3}) {
      const int64_t ranks = 2, V = 1500, vocab_valid = 2900;  // 2 blocks per rank; rank 1 partly padding
      Problem problem(23, 16, ranks * V, vocab_valid, layout, 83);
      problem.drop_tokens(4, 2);
      problem.z_loss_multiplier = z_loss_multiplier;
      for (double& value : problem.w) value *= 40.0;  // logits of a few units: maxima spread over the blocks
      for (size_t i = 0; i < problem.w.size(); ++i) {
        if (problem.is_padding_weight(static_cast<int64_t>(i))) problem.w[i] = 50.0;
      }
      for (int64_t chunk : {7, 23}) {
        const std::string name = std::string(layout_name(layout)) + " z " +
                                 std::to_string(z_loss_multiplier) + " chunk " + std::to_string(chunk);
        std::vector<float> full_dh(problem.h.size(), 0.0f), full_dw(problem.w.size(), 0.0f);
        const CrossEntropySums full = problem.fast(&full_dh, &full_dw, chunk, true);
        const std::vector<ShardRun> runs = run_vocab_shards(problem, ranks, chunk, true, true);
        std::vector<double> dh_sum(problem.h.size(), 0.0);
        for (int64_t rank = 0; rank < ranks; ++rank) {
          const ShardRun& run = runs[rank];
          const std::string rank_name = name + " rank " + std::to_string(rank);
          EXPECT_LT(std::fabs(run.sums.loss_sum - full.loss_sum) / std::fabs(full.loss_sum), 1e-9)
              << rank_name;
          if (z_loss_multiplier > 0.0) {
            EXPECT_LT(std::fabs(run.sums.z_loss_sum - full.z_loss_sum) / full.z_loss_sum, 1e-9) << rank_name;
          }
          for (size_t i = 0; i < dh_sum.size(); ++i) dh_sum[i] += run.dh[i];
          std::vector<double> expected_dw(run.dw.size());
          for (int64_t d = 0; d < problem.D; ++d) {
            for (int64_t v = 0; v < V; ++v) {
              const int64_t local = weight_index(layout, d, v, problem.D, V);
              expected_dw[local] = static_cast<double>(run.dw_initial[local]) +
                                   full_dw[weight_index(layout, d, rank * V + v, problem.D, problem.V)];
            }
          }
          std::vector<double> dw_change(run.dw.size()), expected_change(run.dw.size());
          for (size_t i = 0; i < run.dw.size(); ++i) {
            dw_change[i] = static_cast<double>(run.dw[i]) - run.dw_initial[i];
            expected_change[i] = expected_dw[i] - run.dw_initial[i];
          }
          EXPECT_LT(relative_error(dw_change, expected_change), 1e-2) << rank_name;
        }
        EXPECT_LT(relative_error(dh_sum, full_dh), 1e-2) << name;
      }
    }
  }
}

TEST(CrossEntropy, VocabParallelSingleRankIsBitwiseTheSingleRankKernel) {
  // With one rank the statistics reduce to the single-rank ones in the same order, with or without the
  // z-loss.
  for (UnembedLayout layout : kLayouts) {
    for (double z_loss_multiplier : {0.0, 0.3}) {
      Problem problem(23, 16, 40, 33, layout, 91);
      problem.drop_tokens(3, 0);
      problem.z_loss_multiplier = z_loss_multiplier;
      for (int64_t chunk : {1, 7, 23}) {
        const std::string name = std::string(layout_name(layout)) + " z " +
                                 std::to_string(z_loss_multiplier) + " chunk " + std::to_string(chunk);
        const std::vector<ShardRun> runs = run_vocab_shards(problem, 1, chunk, true);
        // dw accumulates onto the same initial values as the shard's.
        std::vector<float> dh(problem.h.size(), 0.0f), dw = runs[0].dw_initial;
        const CrossEntropySums sums = problem.fast(&dh, &dw, chunk);
        EXPECT_EQ(runs[0].sums.loss_sum, sums.loss_sum) << name;
        EXPECT_EQ(runs[0].sums.z_loss_sum, sums.z_loss_sum) << name;
        EXPECT_EQ(runs[0].dh, dh) << name;
        EXPECT_EQ(runs[0].dw, dw) << name;
      }
    }
  }
}

TEST(CrossEntropy, VocabParallelChecksTargetsAgainstGlobalVocab) {
  // Rank 1 of 2 (V = 12 each, 20 valid): targets up to 19 are fine, 20 is a padding column of rank 1.
  Problem problem(4, 8, 12, 12, UnembedLayout::kernel_DV, 95);
  const std::vector<float> h = to_float(problem.h), w = to_float(problem.w);
  std::vector<float> scratch(static_cast<size_t>(cross_entropy_scratch_floats(4, 12)));
  VocabParallel parallel;
  parallel.vocab_offset = 12;
  parallel.all_reduce_max = [](float*, int64_t) {};
  parallel.all_reduce_sum = [](double*, int64_t) {};
  const auto run = [&](const VocabParallel* option) {
    return unembed_cross_entropy(nullptr, nullptr, h.data(), w.data(), problem.layout, problem.targets.data(),
                                 nullptr, 4, 8, 12, 20, 0.0, 4, scratch.data(), option, nullptr);
  };
  problem.targets = {0, 19, 12, 5};
  EXPECT_NO_THROW(run(&parallel));
  problem.targets[2] = 20;
  EXPECT_THROW(run(&parallel), std::logic_error);
  problem.targets[2] = 12;
  VocabParallel missing = parallel;
  missing.all_reduce_sum = nullptr;
  EXPECT_THROW(run(&missing), std::logic_error);
  // Without the option vocab_valid must fit in this rank's V.
  EXPECT_THROW(run(nullptr), std::logic_error);
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
