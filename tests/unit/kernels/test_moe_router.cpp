// The mixture-of-experts router (kernels/cpu/moe_router.h): routing semantics on hand examples, the reference
// backward against finite differences away from routing ties, and the fast kernels against the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/moe_dispatch.h"
#include "meshtrain/kernels/cpu/moe_router.h"

namespace {

using meshtrain::kernels::moe_balance_loss_backward;
using meshtrain::kernels::moe_balance_loss_forward;
using meshtrain::kernels::moe_balance_loss_reference_backward;
using meshtrain::kernels::moe_balance_loss_reference_forward;
using meshtrain::kernels::moe_router_backward;
using meshtrain::kernels::moe_router_forward;
using meshtrain::kernels::moe_router_reference_backward;
using meshtrain::kernels::moe_router_reference_forward;
using meshtrain::kernels::MoeRouting;
using meshtrain::kernels::RouterScore;
using meshtrain::testing::expect_close;
using meshtrain::testing::expect_gradient;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

MoeRouting routing_of(RouterScore score_function, int64_t top_k, int64_t groups, int64_t groups_kept,
                      bool normalize_top_k, float scaling) {
  MoeRouting routing;
  routing.score_function = score_function;
  routing.top_k = top_k;
  routing.groups = groups;
  routing.groups_kept = groups_kept;
  routing.normalize_top_k = normalize_top_k;
  routing.scaling = scaling;
  return routing;
}

// Logits far from routing ties: each token's row is a random permutation of evenly spaced values `spacing`
// apart (plus a little noise), so a finite-difference step of 1e-6 never changes a choice.
std::vector<double> separated_logits(int64_t N, int64_t E, uint64_t seed, double spacing) {
  std::mt19937_64 generator(seed);
  std::vector<double> noise = random_values(static_cast<size_t>(N * E), seed + 1, -0.05, 0.05);
  std::vector<double> logits(static_cast<size_t>(N * E));
  std::vector<int64_t> order(E);
  for (int64_t t = 0; t < N; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), generator);
    for (int64_t e = 0; e < E; ++e) {
      logits[t * E + e] = spacing * (static_cast<double>(order[e]) - 0.5 * static_cast<double>(E)) +
                          spacing * noise[t * E + e];
    }
  }
  return logits;
}

std::vector<int32_t> counts_of(const std::vector<int32_t>& chosen, int64_t E) {
  std::vector<int32_t> counts(E, 0);
  for (int32_t e : chosen) ++counts[e];
  return counts;
}

struct Routed {
  std::vector<int32_t> chosen;
  std::vector<double> weights, scores;
};

Routed route_reference(const std::vector<double>& logits, const std::vector<double>* bias, int64_t N,
                       int64_t E, const MoeRouting& routing) {
  Routed routed{std::vector<int32_t>(N * routing.top_k), std::vector<double>(N * routing.top_k),
                std::vector<double>(N * E)};
  moe_router_reference_forward(routed.chosen.data(), routed.weights.data(), routed.scores.data(),
                               logits.data(), bias != nullptr ? bias->data() : nullptr, N, E, routing);
  return routed;
}

// --- Semantics on hand examples (reference and fast kernel alike) ---

// Runs both implementations on float-representable inputs and checks they agree on the choice.
Routed route_both(const std::vector<double>& logits, const std::vector<double>* bias, int64_t N, int64_t E,
                  const MoeRouting& routing) {
  const Routed reference = route_reference(logits, bias, N, E, routing);
  std::vector<int32_t> chosen(N * routing.top_k, -7);
  std::vector<float> weights(N * routing.top_k), scores(N * E);
  const std::vector<float> logits_f = to_float(logits);
  const std::vector<float> bias_f = bias != nullptr ? to_float(*bias) : std::vector<float>{};
  moe_router_forward(chosen.data(), weights.data(), scores.data(), logits_f.data(),
                     bias != nullptr ? bias_f.data() : nullptr, N, E, routing);
  EXPECT_EQ(chosen, reference.chosen) << "fast and reference choose the same experts";
  for (size_t i = 0; i < weights.size(); ++i) EXPECT_NEAR(weights[i], reference.weights[i], 1e-6);
  return reference;
}

TEST(MoeRouter, GroupLimitExcludesAHighScoreInADroppedGroup) {
  // 8 experts in 4 groups of 2, 2 groups kept, top-2, sigmoid. Expert 0 has the best score, but its group
  // {0, 1} scores sigmoid(3) + sigmoid(-5) = 0.96 against 1.46 for {2, 3} and 1.42 for {4, 5}.
  const std::vector<double> logits = {3.0, -5.0, 1.0, 1.0, 0.9, 0.9, -1.0, -1.0};
  const Routed limited =
      route_both(logits, nullptr, 1, 8, routing_of(RouterScore::sigmoid, 2, 4, 2, false, 1.0f));
  // Experts 2 and 3 tie: the lower index comes first.
  EXPECT_EQ(limited.chosen, (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(limited.weights[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
  // Without the group limit expert 0 wins.
  const Routed free =
      route_both(logits, nullptr, 1, 8, routing_of(RouterScore::sigmoid, 2, 1, 1, false, 1.0f));
  EXPECT_EQ(free.chosen, (std::vector<int32_t>{0, 2}));
  // Keeping all 4 groups is no limit either.
  const Routed all =
      route_both(logits, nullptr, 1, 8, routing_of(RouterScore::sigmoid, 2, 4, 4, false, 1.0f));
  EXPECT_EQ(all.chosen, free.chosen);
}

TEST(MoeRouter, GroupScoreIsTheSumOfTheTopTwo) {
  // Group {0, 1, 2} has the single best expert (logit 4) but {3, 4, 5} has the better top-2 sum; one group
  // kept, top-1: the top-2 rule keeps {3, 4, 5} (a max rule would keep {0, 1, 2}).
  const std::vector<double> logits = {4.0, -6.0, -6.0, 2.0, 2.0, -6.0};
  const Routed routed =
      route_both(logits, nullptr, 1, 6, routing_of(RouterScore::sigmoid, 1, 2, 1, false, 1.0f));
  EXPECT_EQ(routed.chosen, (std::vector<int32_t>{3}));
}

TEST(MoeRouter, BiasChangesTheChoiceButNotTheWeights) {
  const std::vector<double> logits = {2.0, 1.0, 0.0, 0.0};
  const MoeRouting routing = routing_of(RouterScore::softmax, 1, 1, 1, false, 1.0f);
  const Routed plain = route_both(logits, nullptr, 1, 4, routing);
  EXPECT_EQ(plain.chosen, (std::vector<int32_t>{0}));
  // softmax: p0 = 0.610, p1 = 0.224; a bias of 0.5 on expert 1 makes its choice score 0.724.
  const std::vector<double> bias = {0.0, 0.5, 0.0, 0.0};
  const Routed biased = route_both(logits, &bias, 1, 4, routing);
  EXPECT_EQ(biased.chosen, (std::vector<int32_t>{1}));
  EXPECT_NEAR(biased.weights[0], plain.scores[1], 1e-15) << "the weight is the unbiased score";
  EXPECT_EQ(biased.scores, plain.scores) << "the bias never touches the scores";
}

TEST(MoeRouter, NormalisationAndScaling) {
  const std::vector<double> logits = {0.5, 2.0, -1.0, 1.0};
  const Routed raw =
      route_both(logits, nullptr, 1, 4, routing_of(RouterScore::softmax, 2, 1, 1, false, 1.0f));
  EXPECT_EQ(raw.chosen, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(raw.weights[0], raw.scores[1], 1e-15);
  EXPECT_NEAR(raw.weights[1], raw.scores[3], 1e-15);
  const Routed scaled =
      route_both(logits, nullptr, 1, 4, routing_of(RouterScore::softmax, 2, 1, 1, false, 2.5f));
  EXPECT_NEAR(scaled.weights[0], 2.5 * raw.scores[1], 1e-15);
  const Routed normalised =
      route_both(logits, nullptr, 1, 4, routing_of(RouterScore::softmax, 2, 1, 1, true, 2.5f));
  const double sum = raw.scores[1] + raw.scores[3];
  EXPECT_NEAR(normalised.weights[0], 2.5 * raw.scores[1] / sum, 1e-15);
  EXPECT_NEAR(normalised.weights[0] + normalised.weights[1], 2.5, 1e-14)
      << "normalised weights sum to scaling";
  // Sigmoid scores are not a distribution: unnormalised weights are the sigmoids themselves.
  const Routed sigmoid =
      route_both(logits, nullptr, 1, 4, routing_of(RouterScore::sigmoid, 2, 1, 1, false, 1.0f));
  EXPECT_NEAR(sigmoid.weights[0], 1.0 / (1.0 + std::exp(-2.0)), 1e-15);
}

TEST(MoeRouter, TiesGoToTheLowerIndex) {
  const std::vector<double> logits(6, 0.25);
  const Routed routed =
      route_both(logits, nullptr, 1, 6, routing_of(RouterScore::softmax, 3, 1, 1, true, 1.0f));
  EXPECT_EQ(routed.chosen, (std::vector<int32_t>{0, 1, 2}));
  for (double weight : routed.weights) EXPECT_NEAR(weight, 1.0 / 3.0, 1e-15);
  // Tied groups too: 3 groups of 2, one kept, all equal: group 0.
  const Routed grouped =
      route_both(logits, nullptr, 1, 6, routing_of(RouterScore::sigmoid, 2, 3, 1, false, 1.0f));
  EXPECT_EQ(grouped.chosen, (std::vector<int32_t>{0, 1}));
}

TEST(MoeRouter, ChosenAreInDescendingChoiceOrder) {
  const int64_t N = 20, E = 16;
  const std::vector<double> logits = separated_logits(N, E, 31, 0.3);
  const std::vector<double> bias = random_values(E, 32, -0.02, 0.02);
  const MoeRouting routing = routing_of(RouterScore::sigmoid, 4, 4, 2, true, 1.0f);
  const Routed routed = route_both(logits, &bias, N, E, routing);
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t j = 1; j < routing.top_k; ++j) {
      const int32_t a = routed.chosen[t * 4 + j - 1], b = routed.chosen[t * 4 + j];
      EXPECT_GT(routed.scores[t * E + a] + bias[a], routed.scores[t * E + b] + bias[b]);
    }
  }
}

// --- Reference against finite differences ---

struct Case {
  std::string name;
  MoeRouting routing;
  bool with_bias;
};

std::vector<Case> gradient_cases() {
  return {
      {"softmax top-2", routing_of(RouterScore::softmax, 2, 1, 1, false, 1.0f), false},
      {"softmax top-3 normalised x2.5 (Qwen3-MoE)", routing_of(RouterScore::softmax, 3, 1, 1, true, 2.5f),
       false},
      {"sigmoid top-2", routing_of(RouterScore::sigmoid, 2, 1, 1, false, 1.0f), false},
      {"sigmoid + bias, 4 groups keep 2, top-3 normalised x2.5 (V3)",
       routing_of(RouterScore::sigmoid, 3, 4, 2, true, 2.5f), true},
      {"softmax + bias, 4 groups keep 1, top-2", routing_of(RouterScore::softmax, 2, 4, 1, false, 1.0f),
       true},
  };
}

TEST(MoeRouter, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t N = 6, E = 12;
  for (const Case& test_case : gradient_cases()) {
    const MoeRouting& routing = test_case.routing;
    const int64_t k = routing.top_k;
    std::vector<double> logits = separated_logits(N, E, 41, 0.4);
    const std::vector<double> bias = random_values(E, 42, -0.03, 0.03);
    const std::vector<double>* bias_pointer = test_case.with_bias ? &bias : nullptr;
    const std::vector<double> d_weights = random_values(N * k, 43);
    const Routed at = route_reference(logits, bias_pointer, N, E, routing);
    const std::vector<int32_t> counts = counts_of(at.chosen, E);
    const double balance_weight = 0.3;
    auto router_loss = [&] {
      const Routed routed = route_reference(logits, bias_pointer, N, E, routing);
      EXPECT_EQ(routed.chosen, at.chosen) << "a finite-difference step changed the choice";
      return weighted_sum(routed.weights, d_weights);
    };
    auto balance_loss = [&] {
      const Routed routed = route_reference(logits, bias_pointer, N, E, routing);
      return moe_balance_loss_reference_forward(routed.scores.data(), counts.data(), N, E,
                                                routing.score_function, balance_weight);
    };
    std::vector<double> d_logits(N * E), d_balance(N * E, 0.0);
    moe_router_reference_backward(d_logits.data(), d_weights.data(), at.scores.data(), at.chosen.data(), N, E,
                                  routing);
    expect_gradient("router " + test_case.name, d_logits, numeric_gradient(router_loss, logits));
    moe_balance_loss_reference_backward(d_balance.data(), at.scores.data(), counts.data(), N, E,
                                        routing.score_function, balance_weight, 1.0);
    expect_gradient("balance loss " + test_case.name, d_balance, numeric_gradient(balance_loss, logits));
  }
}

// --- Fast kernels against the reference ---

TEST(MoeRouter, FastMatchesReference) {
  // 300 tokens x 64 experts is above the parallel threshold. Float scores from exp_approx / sigmoid_approx
  // and float sums: a few ulp per value, ~1e-6 relative at most; 1e-5 as for the other kernels.
  const double bound = 1e-5;
  const int64_t N = 300, E = 64;
  for (const Case& test_case : std::vector<Case>{
           {"softmax top-6 normalised", routing_of(RouterScore::softmax, 6, 1, 1, true, 1.0f), false},
           {"softmax top-4 + bias, 8 groups keep 3", routing_of(RouterScore::softmax, 4, 8, 3, false, 1.5f),
            true},
           {"sigmoid top-8 + bias, 8 groups keep 4, normalised x2.5",
            routing_of(RouterScore::sigmoid, 8, 8, 4, true, 2.5f), true}}) {
    const MoeRouting& routing = test_case.routing;
    const int64_t k = routing.top_k;
    const std::vector<float> logits = to_float(separated_logits(N, E, 51, 0.15));
    const std::vector<float> bias = to_float(random_values(E, 52, -0.01, 0.01));
    const std::vector<float> d_weights = to_float(random_values(N * k, 53));
    const std::vector<double> bias_d = to_double(bias);
    const Routed reference =
        route_reference(to_double(logits), test_case.with_bias ? &bias_d : nullptr, N, E, routing);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<int32_t> chosen(N * k, -7);
    std::vector<float> weights(N * k, nan), scores(N * E, nan), d_logits(N * E, nan);
    moe_router_forward(chosen.data(), weights.data(), scores.data(), logits.data(),
                       test_case.with_bias ? bias.data() : nullptr, N, E, routing);
    ASSERT_EQ(chosen, reference.chosen) << test_case.name;
    expect_close("router " + test_case.name + " scores", scores, reference.scores, bound);
    expect_close("router " + test_case.name + " weights", weights, reference.weights, bound);

    std::vector<double> d_logits_ref(N * E);
    const std::vector<double> d_weights_d = to_double(d_weights), scores_d = to_double(scores);
    moe_router_reference_backward(d_logits_ref.data(), d_weights_d.data(), scores_d.data(), chosen.data(), N,
                                  E, routing);
    moe_router_backward(d_logits.data(), d_weights.data(), scores.data(), chosen.data(), N, E, routing);
    expect_close("router " + test_case.name + " d_logits", d_logits, d_logits_ref, bound);

    // The balance loss on the same scores, its gradient added on top of the router's.
    const std::vector<int32_t> counts = counts_of(chosen, E);
    const double loss =
        moe_balance_loss_forward(scores.data(), counts.data(), N, E, routing.score_function, 0.01f);
    const double loss_ref = moe_balance_loss_reference_forward(scores_d.data(), counts.data(), N, E,
                                                               routing.score_function, double(0.01f));
    expect_close("balance loss " + test_case.name, {static_cast<float>(loss)}, {loss_ref}, bound);
    moe_balance_loss_reference_backward(d_logits_ref.data(), scores_d.data(), counts.data(), N, E,
                                        routing.score_function, double(0.01f), double(3.0f));
    moe_balance_loss_backward(d_logits.data(), scores.data(), counts.data(), N, E, routing.score_function,
                              0.01f, 3.0f);
    expect_close("router + balance " + test_case.name + " d_logits", d_logits, d_logits_ref, bound);
  }
}

// --- Balance loss and load statistics on hand examples ---

TEST(MoeRouter, BalanceLossOfAUniformRouterIsItsWeight) {
  // f_e = P_e = 1 / E: L = weight E sum_e 1 / E^2 = weight, for softmax and (normalised) sigmoid scores.
  const int64_t N = 5, E = 4;
  const std::vector<int32_t> counts(E, 3);
  for (RouterScore score_function : {RouterScore::softmax, RouterScore::sigmoid}) {
    const std::vector<double> scores(N * E, score_function == RouterScore::softmax ? 0.25 : 0.7);
    EXPECT_NEAR(moe_balance_loss_reference_forward(scores.data(), counts.data(), N, E, score_function, 0.01),
                0.01, 1e-17);
    const std::vector<float> scores_f = to_float(scores);
    EXPECT_NEAR(moe_balance_loss_forward(scores_f.data(), counts.data(), N, E, score_function, 0.01f), 0.01f,
                1e-9);
  }
  // All assignments on expert 0, which has all the probability: L = weight E.
  std::vector<double> collapsed(N * E, 0.0);
  for (int64_t t = 0; t < N; ++t) collapsed[t * E] = 1.0;
  const std::vector<int32_t> one_expert = {12, 0, 0, 0};
  EXPECT_NEAR(moe_balance_loss_reference_forward(collapsed.data(), one_expert.data(), N, E,
                                                 RouterScore::softmax, 0.01),
              0.04, 1e-17);
  // No assignments: no loss.
  const std::vector<int32_t> none(E, 0);
  EXPECT_EQ(
      moe_balance_loss_forward(to_float(collapsed).data(), none.data(), N, E, RouterScore::softmax, 1.0f),
      0.0);
}

}  // namespace
