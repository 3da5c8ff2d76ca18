// The mixture-of-experts CUDA kernels against the cpu kernels of the same name (and the double references of
// the cpu headers): the router (softmax and sigmoid scores, the selection bias, group limits, normalised and
// scaled weights, exact ties broken to the lower index), the balance loss, the routing plan (the nvidia
// table's host-staged entry), gather and combine with capacity drops and padding rows, and the grouped matmul
// with empty and uneven segments; forward and backward, on odd sizes. Outputs the kernel must write are
// pre-filled with NaN, so an element it forgot stays NaN and fails.
// Legend: N tokens, E experts, k experts per token, G groups, Gk groups kept, D width, M = N k, R kept rows.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "meshtrain/kernels/backend.h"
#include "meshtrain/kernels/cpu/grouped_matmul.h"
#include "meshtrain/kernels/cpu/moe_dispatch.h"
#include "meshtrain/kernels/cpu/moe_router.h"

namespace meshtrain::gpu_test {
namespace {

using kernels::MoeRouting;
using kernels::RouterScore;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Scores and weights: one exp (or sigmoid) per element, a sum of E terms and a division, float32 on both
// sides; the cpu's exp is a polynomial within 1.02 ulp of exp (fast_math.h), CUDA's expf within 2 ulp. So an
// element differs by a few ulp, ~1e-6 relative at worst for E <= 16 terms and the scaling 2.5; 5e-6 leaves a
// margin. A wrong score function, normalisation or
// scaling moves elements by >= 1e-2.
constexpr double kScoreTolerance = 5e-6;
// The router's backward: a few products of the above and a sum of k terms; the softmax's inner product over
// k slots. 1e-5 (the scores' error propagated through O(1) factors, twice).
constexpr double kRouterGradientTolerance = 1e-5;
// Sums of k <= 4 weighted rows (combine), float32 with or without fused multiply-adds: each product rounded
// once more or less, <= 2^-24 |product| each, and products of two normal values stay below ~25 over 10^5
// elements: <= 6e-6 against the metric's floor of 1. A wrong row, weight or slot gives O(1).
constexpr double kCombineTolerance = 1e-5;
// A weight's gradient is a dot product over D <= 200 normal terms in another order than the cpu's SIMD sums:
// ~sqrt(D) u |terms| ~ 1e-6 against 1 + |dot|; 2e-5 bounds the worst case D u |terms| / (1 + |dot|).
constexpr double kDotTolerance = 2e-5;
// Grouped matmul: the float32 GEMM seam's bound of test_matmul.cpp (5e-6 against the double reference on the
// scale 1 + sum |a b|); here against 1 + |value|, with |value| ~ sqrt(I) of sum |a b| ~ 0.64 I: 5e-6 *
// 0.64 sqrt(I) ~ 5e-5 for I <= 97.
constexpr double kGroupedTolerance = 5e-5;

std::vector<float> nan_filled(size_t count) {
  return std::vector<float>(count, kNaN);
}

std::string describe(const MoeRouting& r, int64_t N, int64_t E, bool bias) {
  return std::string(r.score_function == RouterScore::softmax ? "softmax" : "sigmoid") +
         " N=" + std::to_string(N) + " E=" + std::to_string(E) + " k=" + std::to_string(r.top_k) +
         " G=" + std::to_string(r.groups) + " Gk=" + std::to_string(r.groups_kept) +
         (r.normalize_top_k ? " normalised" : "") + " scaling=" + std::to_string(r.scaling) +
         (bias ? " with bias" : "");
}

// Well-separated logits: each row a permutation of 0.1 steps plus noise below 0.01, so distinct experts'
// choice scores differ by far more than the two backends' rounding and the top-k order is the same on both.
std::vector<float> separated_logits(int64_t N, int64_t E, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> noise(0.0f, 0.01f);
  std::vector<float> logits(static_cast<size_t>(N * E));
  std::vector<int> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), generator);
    for (int64_t e = 0; e < E; ++e) {
      logits[static_cast<size_t>(t * E + e)] =
          -1.0f + 0.1f * static_cast<float>(order[static_cast<size_t>(e)]) + noise(generator);
    }
  }
  return logits;
}

// Logits for G groups whose group scores are far apart: group g of each row gets a rank (a permutation) that
// lifts its logits by 0.5 a rank, its members 0.1 apart inside it, plus noise below 0.01.
std::vector<float> grouped_logits(int64_t N, int64_t E, int64_t G, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> noise(0.0f, 0.01f);
  const int64_t group_size = E / G;
  std::vector<float> logits(static_cast<size_t>(N * E));
  std::vector<int> group_rank(static_cast<size_t>(G)), member_rank(static_cast<size_t>(group_size));
  for (int64_t t = 0; t < N; ++t) {
    std::iota(group_rank.begin(), group_rank.end(), 0);
    std::shuffle(group_rank.begin(), group_rank.end(), generator);
    for (int64_t g = 0; g < G; ++g) {
      std::iota(member_rank.begin(), member_rank.end(), 0);
      std::shuffle(member_rank.begin(), member_rank.end(), generator);
      for (int64_t j = 0; j < group_size; ++j) {
        logits[static_cast<size_t>(t * E + g * group_size + j)] =
            -1.0f + 0.5f * static_cast<float>(group_rank[static_cast<size_t>(g)]) +
            0.1f * static_cast<float>(member_rank[static_cast<size_t>(j)]) + noise(generator);
      }
    }
  }
  return logits;
}

// Logits from {-1, 0, 1.5}: many exact ties (equal logits give equal scores on each backend), while distinct
// values, and sums of two of them (group scores), stay far apart.
std::vector<float> tied_logits(int64_t N, int64_t E, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_int_distribution<int> pick(0, 2);
  const float values[3] = {-1.0f, 0.0f, 1.5f};
  std::vector<float> logits(static_cast<size_t>(N * E));
  for (float& logit : logits) logit = values[pick(generator)];
  return logits;
}

// Runs the router forward on both backends and compares: chosen exactly, scores and weights to
// kScoreTolerance; then the backward on the cpu forward's scores and chosen, with the balance loss's
// forward and backward (d_logits accumulated onto the router's).
void check_router(const std::vector<float>& logits, const std::vector<float>& bias, int64_t N, int64_t E,
                  const MoeRouting& routing, uint32_t seed) {
  const std::string what = describe(routing, N, E, !bias.empty());
  SCOPED_TRACE(what);
  const int64_t k = routing.top_k;
  const auto NE = static_cast<size_t>(N * E), Nk = static_cast<size_t>(N * k);
  const float* bias_cpu = bias.empty() ? nullptr : bias.data();

  std::vector<int32_t> chosen(Nk);
  std::vector<float> weights(Nk), scores(NE);
  kernels::moe_router_forward(chosen.data(), weights.data(), scores.data(), logits.data(), bias_cpu, N, E,
                              routing);
  // The cpu kernel itself agrees with the plain reference (std::stable_sort): the order checked here is the
  // documented one.
  std::vector<int32_t> chosen_reference(Nk);
  std::vector<double> weights_reference(Nk), scores_reference(NE);
  const std::vector<double> logits_double(logits.begin(), logits.end()),
      bias_double(bias.begin(), bias.end());
  kernels::moe_router_reference_forward(chosen_reference.data(), weights_reference.data(),
                                        scores_reference.data(), logits_double.data(),
                                        bias.empty() ? nullptr : bias_double.data(), N, E, routing);
  ASSERT_EQ(chosen, chosen_reference) << "the cpu kernel against its reference";

  const DeviceBuffer<float> logits_gpu(logits), bias_gpu(bias.empty() ? std::vector<float>(1, 0.0f) : bias);
  DeviceBuffer<int32_t> chosen_gpu(std::vector<int32_t>(Nk, -7));
  DeviceBuffer<float> weights_gpu(nan_filled(Nk)), scores_gpu(nan_filled(NE));
  cuda().moe_router_forward(chosen_gpu.get(), weights_gpu.get(), scores_gpu.get(), logits_gpu.get(),
                            bias.empty() ? nullptr : bias_gpu.get(), N, E, routing);
  EXPECT_EQ(chosen_gpu.read(), chosen) << "chosen experts";
  expect_close(scores_gpu.read(), scores, kScoreTolerance, what + " scores");
  expect_close(weights_gpu.read(), weights, kScoreTolerance, what + " weights");

  // Backward from the cpu forward's results, so only the backward is compared.
  const std::vector<float> d_weights = normal_values(Nk, seed);
  std::vector<float> d_logits(NE);
  kernels::moe_router_backward(d_logits.data(), d_weights.data(), scores.data(), chosen.data(), N, E,
                               routing);
  const DeviceBuffer<float> d_weights_gpu(d_weights), scores_cpu_gpu(scores);
  const DeviceBuffer<int32_t> chosen_cpu_gpu(chosen);
  DeviceBuffer<float> d_logits_gpu(nan_filled(NE));
  cuda().moe_router_backward(d_logits_gpu.get(), d_weights_gpu.get(), scores_cpu_gpu.get(),
                             chosen_cpu_gpu.get(), N, E, routing);
  expect_close(d_logits_gpu.read(), d_logits, kRouterGradientTolerance, what + " d_logits");

  // The balance loss over counts with an empty expert; its backward adds onto the router's d_logits.
  std::vector<int32_t> counts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) counts[static_cast<size_t>(e)] = static_cast<int32_t>((e * 7 + 3) % 11);
  counts[0] = 0;
  const DeviceBuffer<int32_t> counts_gpu(counts);
  const float weight = 0.013f, d_loss = 37.0f;
  const double loss =
      kernels::moe_balance_loss_forward(scores.data(), counts.data(), N, E, routing.score_function, weight);
  const double loss_gpu = cuda().moe_balance_loss_forward(scores_cpu_gpu.get(), counts_gpu.get(), N, E,
                                                          routing.score_function, weight);
  // Both sum in double (orders differ): far below float rounding.
  EXPECT_NEAR(loss_gpu, loss, 1e-12 * (1.0 + std::abs(loss))) << "balance loss";
  EXPECT_GT(loss, 0.0);
  kernels::moe_balance_loss_backward(d_logits.data(), scores.data(), counts.data(), N, E,
                                     routing.score_function, weight, d_loss);
  cuda().moe_balance_loss_backward(d_logits_gpu.get(), scores_cpu_gpu.get(), counts_gpu.get(), N, E,
                                   routing.score_function, weight, d_loss);
  expect_close(d_logits_gpu.read(), d_logits, kRouterGradientTolerance, what + " d_logits + balance loss");
}

std::vector<float> bias_steps(int64_t E, uint32_t seed) {
  // Whole steps of 1 beside scores in (0, 1) and logits within [-1, 1.5]: the bias reorders experts without
  // bringing two distinct choice scores close.
  std::mt19937 generator(seed);
  std::uniform_int_distribution<int> pick(-1, 1);
  std::vector<float> bias(static_cast<size_t>(E));
  for (float& value : bias) value = static_cast<float>(pick(generator));
  return bias;
}

TEST(CudaMoeRouter, SoftmaxAndSigmoidWithAndWithoutBias) {
  MT_REQUIRE_GPU();
  uint32_t seed = 1000;
  for (const RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
    for (const bool normalize : {false, true}) {
      for (const int64_t k : {1, 3}) {
        const int64_t N = 301, E = 13;
        const MoeRouting routing{score, k, 1, 1, normalize, normalize ? 2.5f : 1.0f};
        check_router(separated_logits(N, E, seed), {}, N, E, routing, seed + 1);
        check_router(separated_logits(N, E, seed + 2), bias_steps(E, seed + 3), N, E, routing, seed + 4);
        seed += 10;
      }
    }
  }
}

// DeepSeek-V3's group limit: 16 experts in 4 groups of 4, 2 kept; and groups of one expert (G = E). No bias
// here: two groups' sums of biased scores can be equal in real arithmetic and differ only by rounding.
TEST(CudaMoeRouter, GroupLimitedRouting) {
  MT_REQUIRE_GPU();
  uint32_t seed = 2000;
  for (const RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
    const int64_t N = 77;
    check_router(grouped_logits(N, 16, 4, seed), {}, N, 16, MoeRouting{score, 4, 4, 2, true, 2.5f}, seed + 2);
    check_router(grouped_logits(N, 8, 8, seed + 3), {}, N, 8, MoeRouting{score, 2, 8, 3, false, 1.0f},
                 seed + 4);
    seed += 10;
  }
}

// Exact ties, among experts and among groups: both backends take the lower index (the cpu kernel's order,
// checked against its std::stable_sort reference).
TEST(CudaMoeRouter, TiesGoToTheLowerIndex) {
  MT_REQUIRE_GPU();
  const int64_t N = 129, E = 12;
  check_router(tied_logits(N, E, 3000), {}, N, E, MoeRouting{RouterScore::softmax, 3, 4, 2, true, 1.0f},
               3001);
  check_router(tied_logits(N, E, 3002), {}, N, E, MoeRouting{RouterScore::sigmoid, 4, 1, 1, false, 1.0f},
               3003);
  std::vector<float> bias(static_cast<size_t>(E), 0.0f);
  for (int64_t e = 0; e < E; e += 3) bias[static_cast<size_t>(e)] = 1.0f;  // ties in the biased choice too
  check_router(tied_logits(N, E, 3004), bias, N, E, MoeRouting{RouterScore::sigmoid, 2, 1, 1, true, 1.0f},
               3005);
}

// Token assignments: k distinct experts per token (as the router chooses), skewed toward low ids so that a
// capacity drops some and some experts get none.
std::vector<int32_t> random_choice(int64_t N, int64_t k, int64_t E, uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<int32_t> chosen(static_cast<size_t>(N * k));
  std::vector<int32_t> experts(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    std::shuffle(experts.begin(), experts.end(), generator);
    std::sort(experts.begin(), experts.begin() + std::min<int64_t>(E, k + 2));  // low ids more often
    for (int64_t s = 0; s < k; ++s) chosen[static_cast<size_t>(t * k + s)] = experts[static_cast<size_t>(s)];
  }
  chosen[0] = static_cast<int32_t>(E - 1);
  return chosen;
}

struct RoutePlan {
  std::vector<int32_t> counts, offsets, sorted, position, assigned;
  int64_t dropped = 0;
};

RoutePlan cpu_route_plan(const std::vector<int32_t>& chosen, int64_t N, int64_t k, int64_t E,
                         int64_t capacity) {
  RoutePlan plan{
      std::vector<int32_t>(static_cast<size_t>(E)), std::vector<int32_t>(static_cast<size_t>(E + 1)),
      std::vector<int32_t>(chosen.size()),          std::vector<int32_t>(chosen.size()),
      std::vector<int32_t>(static_cast<size_t>(E)), 0};
  plan.dropped =
      kernels::moe_route_plan(plan.counts.data(), plan.offsets.data(), plan.sorted.data(),
                              plan.position.data(), plan.assigned.data(), chosen.data(), N, k, E, capacity);
  return plan;
}

// The nvidia table's routing plan (the cpu's counting sort on host copies of device buffers) gives the cpu
// kernel's plan exactly, dropless and with a capacity.
TEST(CudaMoeDispatch, RoutePlanOnDeviceBuffersIsTheCpuPlan) {
  MT_REQUIRE_GPU();
  const kernels::KernelBackend& nvidia = kernels::kernel_backend_for_device("h200");
  ASSERT_EQ(nvidia.device_check(), "");
  const int64_t N = 203, k = 3, E = 9;
  const std::vector<int32_t> chosen = random_choice(N, k, E, 4000);
  for (const int64_t capacity : {int64_t{0}, int64_t{40}}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    const RoutePlan expected = cpu_route_plan(chosen, N, k, E, capacity);
    if (capacity > 0) {
      EXPECT_GT(expected.dropped, 0) << "the capacity drops some assignments";
    }
    const DeviceBuffer<int32_t> chosen_gpu(chosen);
    DeviceBuffer<int32_t> counts(std::vector<int32_t>(static_cast<size_t>(E), -9)),
        offsets(std::vector<int32_t>(static_cast<size_t>(E + 1), -9)),
        sorted(std::vector<int32_t>(chosen.size(), -9)), position(std::vector<int32_t>(chosen.size(), -9)),
        assigned(std::vector<int32_t>(static_cast<size_t>(E), -9));
    const int64_t dropped = nvidia.moe_route_plan(counts.get(), offsets.get(), sorted.get(), position.get(),
                                                  assigned.get(), chosen_gpu.get(), N, k, E, capacity);
    EXPECT_EQ(dropped, expected.dropped);
    EXPECT_EQ(counts.read(), expected.counts);
    EXPECT_EQ(offsets.read(), expected.offsets);
    EXPECT_EQ(sorted.read(), expected.sorted);
    EXPECT_EQ(position.read(), expected.position);
    EXPECT_EQ(assigned.read(), expected.assigned);
  }
}

// Gather, its backward, combine and its backward on a routing plan with and without drops, against the cpu
// kernels (and the double references of moe_dispatch.h); the gather also on sorted rows with -1 padding
// (expert parallelism's blocks), which must come out as zero rows.
void check_dispatch(int64_t N, int64_t k, int64_t E, int64_t D, int64_t capacity, uint32_t seed) {
  const std::string what = "N=" + std::to_string(N) + " k=" + std::to_string(k) + " E=" + std::to_string(E) +
                           " D=" + std::to_string(D) + " capacity=" + std::to_string(capacity);
  SCOPED_TRACE(what);
  const RoutePlan plan = cpu_route_plan(random_choice(N, k, E, seed), N, k, E, capacity);
  const int64_t R = plan.offsets[static_cast<size_t>(E)], M = N * k;
  const auto ND = static_cast<size_t>(N * D), RD = static_cast<size_t>(R * D);
  const std::vector<float> x = normal_values(ND, seed + 1),
                           weights = normal_values(static_cast<size_t>(M), seed + 2);
  const std::vector<float> rows = normal_values(RD, seed + 3), d_out = normal_values(ND, seed + 4);
  const DeviceBuffer<float> x_gpu(x), weights_gpu(weights), rows_gpu(rows), d_out_gpu(d_out);
  const DeviceBuffer<int32_t> sorted_gpu(plan.sorted), position_gpu(plan.position);

  // Gather: a copy, bitwise.
  std::vector<float> sorted_x(RD);
  kernels::moe_gather_forward(sorted_x.data(), x.data(), plan.sorted.data(), R, k, D);
  DeviceBuffer<float> sorted_x_gpu(nan_filled(RD));
  cuda().moe_gather_forward(sorted_x_gpu.get(), x_gpu.get(), sorted_gpu.get(), R, k, D);
  EXPECT_EQ(sorted_x_gpu.read(), sorted_x) << "gather forward";

  // Gather backward: sums of weight-1 rows in slot order, as the cpu: bitwise, written and accumulated.
  for (const bool accumulate : {false, true}) {
    std::vector<float> d_x = accumulate ? normal_values(ND, seed + 5) : nan_filled(ND);
    DeviceBuffer<float> d_x_gpu(d_x);
    kernels::moe_gather_backward(d_x.data(), rows.data(), plan.position.data(), N, k, D, accumulate);
    cuda().moe_gather_backward(d_x_gpu.get(), rows_gpu.get(), position_gpu.get(), N, k, D, accumulate);
    EXPECT_EQ(d_x_gpu.read(), d_x) << "gather backward, accumulate " << accumulate;
  }

  // Combine forward, written and accumulated.
  for (const bool accumulate : {false, true}) {
    std::vector<float> out = accumulate ? normal_values(ND, seed + 6) : nan_filled(ND);
    std::vector<double> reference(out.begin(), out.end());
    DeviceBuffer<float> out_gpu(out);
    kernels::moe_combine_forward(out.data(), rows.data(), weights.data(), plan.position.data(), N, k, D,
                                 accumulate);
    const std::vector<double> rows_double(rows.begin(), rows.end()),
        weights_double(weights.begin(), weights.end());
    kernels::moe_combine_reference_forward(reference.data(), rows_double.data(), weights_double.data(),
                                           plan.position.data(), N, k, D, accumulate);
    cuda().moe_combine_forward(out_gpu.get(), rows_gpu.get(), weights_gpu.get(), position_gpu.get(), N, k, D,
                               accumulate);
    const std::vector<float> result = out_gpu.read();
    expect_close(result, out, kCombineTolerance, what + " combine forward vs cpu");
    expect_close(result, std::vector<float>(reference.begin(), reference.end()), kCombineTolerance,
                 what + " combine forward vs double reference");
  }

  // Combine backward: d_y_sorted one product per element (bitwise), d_weights a dot product (0 when dropped).
  std::vector<float> d_rows(RD), d_weights(static_cast<size_t>(M));
  kernels::moe_combine_backward(d_rows.data(), d_weights.data(), d_out.data(), rows.data(), weights.data(),
                                plan.position.data(), N, k, D);
  DeviceBuffer<float> d_rows_gpu(nan_filled(RD)), d_weights_gpu(nan_filled(static_cast<size_t>(M)));
  cuda().moe_combine_backward(d_rows_gpu.get(), d_weights_gpu.get(), d_out_gpu.get(), rows_gpu.get(),
                              weights_gpu.get(), position_gpu.get(), N, k, D);
  EXPECT_EQ(d_rows_gpu.read(), d_rows) << "combine backward d_y_sorted";
  const std::vector<float> d_weights_result = d_weights_gpu.read();
  expect_close(d_weights_result, d_weights, kDotTolerance, what + " combine backward d_weights");
  for (int64_t a = 0; a < M; ++a) {
    if (plan.position[static_cast<size_t>(a)] < 0) {
      EXPECT_EQ(d_weights_result[static_cast<size_t>(a)], 0.0f) << "a dropped assignment's weight gradient";
    }
  }

  // Padding rows (-1) in the gather's sorted list are zero rows.
  std::vector<int32_t> padded = plan.sorted;
  for (int64_t i = 0; i < R; i += 5) padded[static_cast<size_t>(i)] = -1;
  const DeviceBuffer<int32_t> padded_gpu(padded);
  kernels::moe_gather_forward(sorted_x.data(), x.data(), padded.data(), R, k, D);
  cuda().moe_gather_forward(sorted_x_gpu.get(), x_gpu.get(), padded_gpu.get(), R, k, D);
  EXPECT_EQ(sorted_x_gpu.read(), sorted_x) << "gather forward with padding rows";
}

TEST(CudaMoeDispatch, GatherAndCombineDroplessAndWithCapacity) {
  MT_REQUIRE_GPU();
  check_dispatch(131, 2, 8, 67, 0, 5000);
  check_dispatch(131, 2, 8, 67, 20, 5010);  // drops
  check_dispatch(57, 3, 5, 200, 0, 5020);
  check_dispatch(1, 1, 1, 1, 0, 5030);
  check_dispatch(2049, 4, 16, 33, 300, 5040);
}

// The grouped matmul: forward, and backward into d_x (written) and d_w (accumulated onto prior values), over
// uneven segments with empty experts (first, middle, last), against the cpu kernel and the double reference.
void check_grouped(const std::vector<int32_t>& counts, int64_t I, int64_t O, uint32_t seed) {
  const auto E = static_cast<int64_t>(counts.size());
  std::vector<int32_t> offsets(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) offsets[e + 1] = offsets[e] + counts[e];
  const int64_t R = offsets.back();
  const std::string what = "E=" + std::to_string(E) + " R=" + std::to_string(R) + " I=" + std::to_string(I) +
                           " O=" + std::to_string(O);
  SCOPED_TRACE(what);
  const auto x_count = static_cast<size_t>(R * I), out_count = static_cast<size_t>(R * O),
             w_count = static_cast<size_t>(E * I * O);
  const std::vector<float> x = normal_values(x_count, seed), w = normal_values(w_count, seed + 1, 0.3f);
  const std::vector<float> d_out = normal_values(out_count, seed + 2),
                           d_w_initial = normal_values(w_count, seed + 3);
  const DeviceBuffer<float> x_gpu(x), w_gpu(w), d_out_gpu(d_out);
  const DeviceBuffer<int32_t> offsets_gpu(offsets);

  std::vector<float> out(out_count);
  kernels::grouped_matmul_forward(out.data(), x.data(), w.data(), offsets.data(), E, I, O);
  std::vector<double> reference(out_count);
  const std::vector<double> x_double(x.begin(), x.end()), w_double(w.begin(), w.end()),
      d_out_double(d_out.begin(), d_out.end());
  kernels::grouped_matmul_reference_forward(reference.data(), x_double.data(), w_double.data(),
                                            offsets.data(), E, I, O);
  DeviceBuffer<float> out_gpu(nan_filled(out_count));
  cuda().grouped_matmul_forward(out_gpu.get(), x_gpu.get(), w_gpu.get(), offsets_gpu.get(), E, I, O);
  const std::vector<float> out_result = out_gpu.read();
  expect_close(out_result, out, kGroupedTolerance, what + " forward vs cpu");
  expect_close(out_result, std::vector<float>(reference.begin(), reference.end()), kGroupedTolerance,
               what + " forward vs double reference");

  std::vector<float> d_x(x_count), d_w = d_w_initial;
  kernels::grouped_matmul_backward(d_x.data(), d_w.data(), d_out.data(), x.data(), w.data(), offsets.data(),
                                   E, I, O);
  std::vector<double> d_x_reference(x_count), d_w_reference(d_w_initial.begin(), d_w_initial.end());
  kernels::grouped_matmul_reference_backward(d_x_reference.data(), d_w_reference.data(), d_out_double.data(),
                                             x_double.data(), w_double.data(), offsets.data(), E, I, O);
  DeviceBuffer<float> d_x_gpu(nan_filled(x_count)), d_w_gpu(d_w_initial);
  cuda().grouped_matmul_backward(d_x_gpu.get(), d_w_gpu.get(), d_out_gpu.get(), x_gpu.get(), w_gpu.get(),
                                 offsets_gpu.get(), E, I, O);
  const std::vector<float> d_x_result = d_x_gpu.read(), d_w_result = d_w_gpu.read();
  expect_close(d_x_result, d_x, kGroupedTolerance, what + " d_x vs cpu");
  expect_close(d_x_result, std::vector<float>(d_x_reference.begin(), d_x_reference.end()), kGroupedTolerance,
               what + " d_x vs double reference");
  // d_w sums over a segment's rows (up to 100 here): the same bound with sqrt(rows) in place of sqrt(I).
  expect_close(d_w_result, d_w, kGroupedTolerance, what + " d_w vs cpu");
  expect_close(d_w_result, std::vector<float>(d_w_reference.begin(), d_w_reference.end()), kGroupedTolerance,
               what + " d_w vs double reference");

  // Either output may be skipped.
  DeviceBuffer<float> d_w_only(d_w_initial);
  cuda().grouped_matmul_backward(nullptr, d_w_only.get(), d_out_gpu.get(), x_gpu.get(), w_gpu.get(),
                                 offsets_gpu.get(), E, I, O);
  EXPECT_EQ(d_w_only.read(), d_w_result) << "d_w alone";
  DeviceBuffer<float> d_x_only(nan_filled(x_count));
  cuda().grouped_matmul_backward(d_x_only.get(), nullptr, d_out_gpu.get(), x_gpu.get(), w_gpu.get(),
                                 offsets_gpu.get(), E, I, O);
  EXPECT_EQ(d_x_only.read(), d_x_result) << "d_x alone";
}

TEST(CudaGroupedMatmul, UnevenAndEmptySegments) {
  MT_REQUIRE_GPU();
  check_grouped({0, 13, 1, 0, 100, 7, 0}, 97, 33, 6000);
  check_grouped({5, 0, 64, 3}, 16, 96, 6010);
  check_grouped({1}, 1, 1, 6020);
}

// A segment bound the host reads and checks: offsets that do not start at 0 are refused, naming why.
TEST(CudaGroupedMatmul, RefusesOffsetsNotStartingAtZero) {
  MT_REQUIRE_GPU();
  const DeviceBuffer<int32_t> offsets(std::vector<int32_t>{1, 2});
  DeviceBuffer<float> out(4), x(4), w(4);
  EXPECT_ANY_THROW(cuda().grouped_matmul_forward(out.get(), x.get(), w.get(), offsets.get(), 1, 1, 1));
}

}  // namespace
}  // namespace meshtrain::gpu_test
