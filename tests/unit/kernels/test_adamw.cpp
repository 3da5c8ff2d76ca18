// Tests of the fused AdamW update (fast vs reference over several steps, one step by hand) and of the
// deterministic sum of squares.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/adamw.h"

namespace meshtrain::kernels {
namespace {

using testing::random_values;
using testing::relative_error;
using testing::report_error;
using testing::to_float;

AdamWStep make_step(int64_t t) {
  AdamWStep step{};
  step.learning_rate = 1e-2f;
  step.beta1 = 0.9f;
  step.beta2 = 0.95f;
  step.epsilon = 1e-8f;
  step.weight_decay = 0.1f;
  step.step = t;
  step.gradient_scale = 0.25f;
  return step;
}

TEST(AdamW, FastMatchesReferenceOverSeveralSteps) {
  // Large enough to take the multithreaded path; odd so no vector width divides it.
  const int64_t count = 40001;
  const double bound = 1e-6;
  for (bool decay : {false, true}) {
    const std::vector<float> param_initial =
        to_float(random_values(static_cast<size_t>(count), 1, -2.0, 2.0));
    std::vector<float> param = param_initial, m(static_cast<size_t>(count), 0.0f), v(m);
    std::vector<double> ref_param(param.begin(), param.end()), ref_m(m.size(), 0.0), ref_v(m.size(), 0.0);
    double worst_param = 0.0, worst_m = 0.0, worst_v = 0.0;
    for (int64_t t = 1; t <= 5; ++t) {
      const std::vector<float> grad = to_float(random_values(static_cast<size_t>(count), 10 + t, -3.0, 3.0));
      const std::vector<double> ref_grad(grad.begin(), grad.end());
      const AdamWStep step = make_step(t);
      adamw_update(param.data(), grad.data(), m.data(), v.data(), count, step, decay);
      adamw_reference_update<double>(ref_param.data(), ref_grad.data(), ref_m.data(), ref_v.data(), count,
                                     step, decay);
      worst_param = std::max(worst_param, relative_error(param, ref_param));
      worst_m = std::max(worst_m, relative_error(m, ref_m));
      worst_v = std::max(worst_v, relative_error(v, ref_v));
    }
    // The parameters moved by far more than the bound, so a missing update would be caught.
    ASSERT_GT(relative_error(param, std::vector<double>(param_initial.begin(), param_initial.end())), 1e-3);
    const std::string name = decay ? " (weight decay)" : " (no weight decay)";
    report_error("adamw fast vs reference param, t=1..5" + name, worst_param, bound);
    report_error("adamw fast vs reference m, t=1..5" + name, worst_m, bound);
    report_error("adamw fast vs reference v, t=1..5" + name, worst_v, bound);
    EXPECT_LT(worst_param, bound);
    EXPECT_LT(worst_m, bound);
    EXPECT_LT(worst_v, bound);
  }
}

TEST(AdamW, FirstStepByHand) {
  // param = 1, grad = 2, scale = 0.5 -> g = 1; lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01, t = 1:
  // m = 0.1 * 1 = 0.1;  v = 0.001 * 1 = 0.001;  mhat = 0.1 / (1 - 0.9) = 1;  vhat = 0.001 / (1 - 0.999) = 1
  // param = 1 - 0.1 * (1 / (1 + 1e-8) + 0.01 * 1) = 1 - 0.1 * 1.00999999 = 0.899000001
  // Without weight decay: param = 1 - 0.1 * 0.99999999 = 0.900000001.
  AdamWStep step{};
  step.learning_rate = 0.1f;
  step.beta1 = 0.9f;
  step.beta2 = 0.999f;
  step.epsilon = 1e-8f;
  step.weight_decay = 0.01f;
  step.step = 1;
  step.gradient_scale = 0.5f;
  for (bool decay : {true, false}) {
    float param = 1.0f, m = 0.0f, v = 0.0f;
    const float grad = 2.0f;
    adamw_update(&param, &grad, &m, &v, 1, step, decay);
    EXPECT_NEAR(m, 0.1, 1e-7);
    EXPECT_NEAR(v, 0.001, 2e-8);  // 1 - 0.999f = 0.00099998713 in float
    EXPECT_NEAR(param, decay ? 0.899000001 : 0.900000001, 1e-6);
    double ref_param = 1.0, ref_m = 0.0, ref_v = 0.0;
    const double ref_grad = 2.0;
    adamw_reference_update<double>(&ref_param, &ref_grad, &ref_m, &ref_v, 1, step, decay);
    // The reference uses the float-rounded hyperparameters, hence the looser bound.
    EXPECT_NEAR(ref_param, decay ? 0.899000001 : 0.900000001, 1e-7);
  }
}

TEST(AdamW, BitwiseIndependentOfThreadCountAndCount) {
  // Any split of the range between threads, and any tail length, gives the same bits per element: the update
  // of element i depends only on element i.
  const int64_t count = 70001;
  const std::vector<float> grad = to_float(random_values(static_cast<size_t>(count), 41, -3.0, 3.0));
  const std::vector<float> param0 = to_float(random_values(static_cast<size_t>(count), 42, -2.0, 2.0));
  const std::vector<float> m0 = to_float(random_values(static_cast<size_t>(count), 43, -0.1, 0.1));
  const std::vector<float> v0 = to_float(random_values(static_cast<size_t>(count), 44, 0.0, 0.1));
  const auto run = [&](int threads, int64_t first) {
    std::vector<float> param = param0, m = m0, v = v0;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    // Two calls: [0, first) and [first, count), so the tails fall elsewhere.
    adamw_update(param.data(), grad.data(), m.data(), v.data(), first, make_step(3), true);
    adamw_update(param.data() + first, grad.data() + first, m.data() + first, v.data() + first, count - first,
                 make_step(3), true);
    omp_set_num_threads(saved);
    param.insert(param.end(), m.begin(), m.end());
    param.insert(param.end(), v.begin(), v.end());
    return param;
  };
  const std::vector<float> expected = run(1, count);
  EXPECT_EQ(run(2, count), expected);
  EXPECT_EQ(run(3, count), expected);
  EXPECT_EQ(run(2, 40003), expected);
  EXPECT_EQ(run(1, 5), expected);
}

TEST(AdamW, SumOfSquaresMatchesDoubleLoop) {
  for (int64_t count : {0, 1, 7, 100003}) {
    const std::vector<float> values = to_float(random_values(static_cast<size_t>(count), 5, -3.0, 3.0));
    double expected = 0.0;
    for (float value : values) expected += static_cast<double>(value) * static_cast<double>(value);
    const double got = sum_of_squares(values.data(), count);
    const double error = std::fabs(got - expected) / std::max(expected, 1e-30), bound = 1e-12;
    report_error("sum_of_squares vs double loop, count " + std::to_string(count), error, bound);
    EXPECT_LT(error, bound);
    // Deterministic: a second call gives bit-identical results.
    EXPECT_EQ(sum_of_squares(values.data(), count), got);
  }
}

}  // namespace
}  // namespace meshtrain::kernels
