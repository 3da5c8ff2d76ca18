#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/swiglu.h"

namespace {

using meshtrain::kernels::swiglu_backward;
using meshtrain::kernels::swiglu_forward;
using meshtrain::kernels::swiglu_reference_backward;
using meshtrain::kernels::swiglu_reference_forward;
using meshtrain::testing::expect_close;
using meshtrain::testing::expect_gradient;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::report_error;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  const int64_t count = 40;
  std::vector<double> gate = random_values(count, 91, -4.0, 4.0), up = random_values(count, 92);
  const std::vector<double> weights = random_values(count, 93);
  auto loss = [&] {
    std::vector<double> out(count);
    swiglu_reference_forward(out.data(), gate.data(), up.data(), count);
    return weighted_sum(out, weights);
  };
  std::vector<double> dgate(count), dup(count);
  swiglu_reference_backward(dgate.data(), dup.data(), weights.data(), gate.data(), up.data(), count);
  expect_gradient("swiglu reference dgate vs finite differences", dgate, numeric_gradient(loss, gate));
  expect_gradient("swiglu reference dup vs finite differences", dup, numeric_gradient(loss, up));
}

void check_fast_against_reference(const std::string& what, const std::vector<float>& gate,
                                  const std::vector<float>& up, const std::vector<float>& dout) {
  // A few float roundings per value (exp, divide, products): ~5e-7 relative at worst.
  const double bound = 1e-5;
  const int64_t count = static_cast<int64_t>(gate.size());
  const std::vector<double> gated = to_double(gate), upd = to_double(up), doutd = to_double(dout);
  std::vector<double> out_ref(count), dgate_ref(count), dup_ref(count);
  swiglu_reference_forward(out_ref.data(), gated.data(), upd.data(), count);
  swiglu_reference_backward(dgate_ref.data(), dup_ref.data(), doutd.data(), gated.data(), upd.data(), count);
  // NaN-filled outputs prove every output is written.
  std::vector<float> out(count, std::numeric_limits<float>::quiet_NaN()), dgate = out, dup = out;
  swiglu_forward(out.data(), gate.data(), up.data(), count);
  swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), count);
  expect_close(what + " forward", out, out_ref, bound);
  expect_close(what + " dgate", dgate, dgate_ref, bound);
  expect_close(what + " dup", dup, dup_ref, bound);
}

TEST(SwiGlu, FastMatchesReference) {
  // 20000 values is above the parallel threshold, so the OpenMP path runs.
  const int64_t count = 20000;
  check_fast_against_reference("swiglu", to_float(random_values(count, 94, -8.0, 8.0)),
                               to_float(random_values(count, 95)), to_float(random_values(count, 96)));
}

TEST(SwiGlu, ExtremeGatesStayFinite) {
  // exp(-g) overflows for g < -88 in float; the sigmoid must saturate to 0 rather than produce NaN.
  check_fast_against_reference(
      "swiglu extreme gates", {-1000.0f, -100.0f, -88.0f, 0.0f, 88.0f, 100.0f, 1000.0f},
      {0.5f, -1.5f, 2.0f, 1.0f, -0.25f, 0.75f, 1.0f}, {1.0f, 1.0f, -1.0f, 0.5f, 2.0f, -1.0f, 1.0f});
}

// dtype=bfloat16: the bf16-output forward writes the float32 forward's values rounded (above the parallel
// threshold, and saturated gates).
TEST(SwiGlu, Bf16OutputIsTheFloat32OutputRounded) {
  std::vector<float> gate = to_float(random_values(20000, 94, -6.0, 6.0)),
                     up = to_float(random_values(20000, 95));
  for (float extreme : {-1e4f, -100.0f, 100.0f, 1e4f}) {
    gate.push_back(extreme);
    up.push_back(0.5f);
  }
  const int64_t count = static_cast<int64_t>(gate.size());
  std::vector<float> out(count);
  std::vector<uint16_t> out_bf16(count);
  swiglu_forward(out.data(), gate.data(), up.data(), count);
  meshtrain::kernels::swiglu_forward_bf16(out_bf16.data(), gate.data(), up.data(), count);
  meshtrain::testing::expect_bf16_of("swiglu bf16 out", out_bf16, out);
}

}  // namespace
