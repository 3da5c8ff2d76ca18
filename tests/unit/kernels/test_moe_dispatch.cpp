// Dispatch and combine of the mixture-of-experts layer (kernels/cpu/moe_dispatch.h): the routing plan against
// std::stable_sort and a hand example with capacity dropping, gather / combine references against finite
// differences and the fast kernels against them, and the whole routed path (route -> gather -> grouped
// matmul -> combine) against a dense loop over each token's chosen experts, forward and backward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/kernels/cpu/grouped_matmul.h"
#include "meshtrain/kernels/cpu/moe_dispatch.h"
#include "meshtrain/kernels/cpu/moe_router.h"

namespace {

using meshtrain::kernels::grouped_matmul_backward;
using meshtrain::kernels::grouped_matmul_forward;
using meshtrain::kernels::grouped_matmul_reference_backward;
using meshtrain::kernels::grouped_matmul_reference_forward;
using meshtrain::kernels::moe_combine_backward;
using meshtrain::kernels::moe_combine_forward;
using meshtrain::kernels::moe_combine_reference_backward;
using meshtrain::kernels::moe_combine_reference_forward;
using meshtrain::kernels::moe_gather_backward;
using meshtrain::kernels::moe_gather_forward;
using meshtrain::kernels::moe_gather_reference_backward;
using meshtrain::kernels::moe_gather_reference_forward;
using meshtrain::kernels::moe_route_plan;
using meshtrain::testing::expect_close;
using meshtrain::testing::expect_gradient;
using meshtrain::testing::numeric_gradient;
using meshtrain::testing::random_values;
using meshtrain::testing::relative_error;
using meshtrain::testing::report_error;
using meshtrain::testing::scaled;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;
using meshtrain::testing::weighted_sum;

// k distinct experts per token, drawn at random (a router never repeats an expert within a token).
std::vector<int32_t> random_choice(int64_t N, int64_t k, int64_t E, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::vector<int32_t> experts(E), chosen;
  for (int64_t t = 0; t < N; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    std::shuffle(experts.begin(), experts.end(), generator);
    chosen.insert(chosen.end(), experts.begin(), experts.begin() + k);
  }
  return chosen;
}

struct Plan {
  std::vector<int32_t> counts, offsets, sorted, position, assigned;
  int64_t dropped = 0;
  int64_t rows() const { return offsets.back(); }
};

Plan plan_of(const std::vector<int32_t>& chosen, int64_t N, int64_t k, int64_t E, int64_t capacity) {
  Plan plan{std::vector<int32_t>(E, -9), std::vector<int32_t>(E + 1, -9), std::vector<int32_t>(N * k, -9),
            std::vector<int32_t>(N * k, -9), std::vector<int32_t>(E, -9)};
  plan.dropped = moe_route_plan(plan.counts.data(), plan.offsets.data(), plan.sorted.data(),
                                plan.position.data(), plan.assigned.data(), chosen.data(), N, k, E, capacity);
  return plan;
}

TEST(MoeDispatch, RoutePlanHandExampleWithCapacity) {
  // 4 tokens, top-2 of 3 experts, capacity 2. Expert 0 gets assignments 0, 2, 4, 7 (tokens 0..3): keeps 0, 2.
  // Expert 1 gets 1, 5, 6: keeps 1, 5. Expert 2 gets 3.
  const std::vector<int32_t> chosen = {0, 1, 0, 2, 0, 1, 1, 0};
  const Plan plan = plan_of(chosen, 4, 2, 3, 2);
  EXPECT_EQ(plan.dropped, 3);
  EXPECT_EQ(plan.assigned, (std::vector<int32_t>{4, 3, 1}));
  EXPECT_EQ(plan.counts, (std::vector<int32_t>{2, 2, 1}));
  EXPECT_EQ(plan.offsets, (std::vector<int32_t>{0, 2, 4, 5}));
  EXPECT_EQ(plan.sorted, (std::vector<int32_t>{0, 2, 1, 5, 3, -1, -1, -1}));
  EXPECT_EQ(plan.position, (std::vector<int32_t>{0, 2, 1, 4, -1, 3, -1, -1}));
  // Dropless: nothing dropped, counts = assigned.
  const Plan dropless = plan_of(chosen, 4, 2, 3, 0);
  EXPECT_EQ(dropless.dropped, 0);
  EXPECT_EQ(dropless.counts, (std::vector<int32_t>{4, 3, 1}));
  EXPECT_EQ(dropless.sorted, (std::vector<int32_t>{0, 2, 4, 7, 1, 5, 6, 3}));
}

TEST(MoeDispatch, RoutePlanMatchesStableSort) {
  const int64_t N = 97, k = 3, E = 11;
  const std::vector<int32_t> chosen = random_choice(N, k, E, 7);
  for (int64_t capacity : {int64_t(0), int64_t(-1), int64_t(1), int64_t(20), int64_t(1000)}) {
    const Plan plan = plan_of(chosen, N, k, E, capacity);
    // Independent: all assignments stably sorted by expert, then each expert's first `capacity` kept.
    std::vector<int32_t> order(N * k);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return chosen[a] < chosen[b]; });
    std::vector<int32_t> sorted, position(N * k, -1), seen(E, 0);
    for (int32_t a : order) {
      if (capacity > 0 && seen[chosen[a]] >= capacity) continue;
      ++seen[chosen[a]];
      position[a] = static_cast<int32_t>(sorted.size());
      sorted.push_back(a);
    }
    const int64_t kept = static_cast<int64_t>(sorted.size());
    sorted.resize(N * k, -1);
    EXPECT_EQ(plan.sorted, sorted) << "capacity " << capacity;
    EXPECT_EQ(plan.position, position) << "capacity " << capacity;
    EXPECT_EQ(plan.counts, seen) << "capacity " << capacity;
    EXPECT_EQ(plan.rows(), kept);
    EXPECT_EQ(plan.dropped, N * k - kept);
    for (int64_t e = 0; e < E; ++e) EXPECT_EQ(plan.offsets[e + 1] - plan.offsets[e], plan.counts[e]);
    EXPECT_EQ(std::accumulate(plan.assigned.begin(), plan.assigned.end(), 0), N * k);
    if (capacity == 1) {
      EXPECT_EQ(plan.rows(), E) << "capacity 1: one row per expert";
    }
  }
}

// --- Gather and combine: references against finite differences, fast against references ---

TEST(MoeDispatch, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t N = 7, k = 2, E = 4, D = 3;
  const std::vector<int32_t> chosen = random_choice(N, k, E, 11);
  for (int64_t capacity : {int64_t(0), int64_t(3)}) {
    const Plan plan = plan_of(chosen, N, k, E, capacity);
    const int64_t R = plan.rows();
    const std::string label =
        capacity > 0 ? " (capacity 3, " + std::to_string(plan.dropped) + " dropped)" : "";
    std::vector<double> x = random_values(N * D, 12), y = random_values(R * D, 13),
                        weights = random_values(N * k, 14);
    const std::vector<double> gather_probe = random_values(R * D, 15),
                              combine_probe = random_values(N * D, 16);
    auto gather_loss = [&] {
      std::vector<double> sorted_x(R * D);
      moe_gather_reference_forward(sorted_x.data(), x.data(), plan.sorted.data(), R, k, D);
      return weighted_sum(sorted_x, gather_probe);
    };
    std::vector<double> d_x(N * D);
    moe_gather_reference_backward(d_x.data(), gather_probe.data(), plan.position.data(), N, k, D, false);
    expect_gradient("moe gather d_x" + label, d_x, numeric_gradient(gather_loss, x));

    auto combine_loss = [&] {
      std::vector<double> out(N * D);
      moe_combine_reference_forward(out.data(), y.data(), weights.data(), plan.position.data(), N, k, D,
                                    false);
      return weighted_sum(out, combine_probe);
    };
    std::vector<double> d_y(R * D), d_weights(N * k);
    moe_combine_reference_backward(d_y.data(), d_weights.data(), combine_probe.data(), y.data(),
                                   weights.data(), plan.position.data(), N, k, D);
    expect_gradient("moe combine d_y_sorted" + label, d_y, numeric_gradient(combine_loss, y));
    expect_gradient("moe combine d_weights" + label, d_weights, numeric_gradient(combine_loss, weights));
    if (capacity > 0) {
      for (int64_t a = 0; a < N * k; ++a) {
        if (plan.position[a] < 0) {
          EXPECT_EQ(d_weights[a], 0.0) << "a dropped slot gets no weight gradient";
        }
      }
    }
  }
}

TEST(MoeDispatch, FastMatchesReference) {
  // 300 tokens x 96 wide is above the parallel threshold. Copies are exact; the combine sums k products and
  // d_weights is a float dot product of D terms: ~1e-7 relative, bound 1e-5.
  const double bound = 1e-5;
  const int64_t N = 300, k = 4, E = 16, D = 96;
  const std::vector<int32_t> chosen = random_choice(N, k, E, 21);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t capacity : {int64_t(0), int64_t(60)}) {
    const Plan plan = plan_of(chosen, N, k, E, capacity);
    const int64_t R = plan.rows();
    const std::string label =
        capacity > 0 ? " (capacity 60, " + std::to_string(plan.dropped) + " dropped)" : "";
    if (capacity > 0) {
      EXPECT_GT(plan.dropped, 0);
    }
    const std::vector<float> x = to_float(random_values(N * D, 22)), y = to_float(random_values(R * D, 23)),
                             weights = to_float(random_values(N * k, 24)),
                             d_rows = to_float(random_values(R * D, 25)),
                             d_out = to_float(random_values(N * D, 26)),
                             base = to_float(random_values(N * D, 27));
    const std::vector<double> xd = to_double(x), yd = to_double(y), wd = to_double(weights),
                              d_rows_d = to_double(d_rows), d_out_d = to_double(d_out);

    std::vector<float> sorted_x(R * D, nan);
    std::vector<double> sorted_x_ref(R * D);
    moe_gather_forward(sorted_x.data(), x.data(), plan.sorted.data(), R, k, D);
    moe_gather_reference_forward(sorted_x_ref.data(), xd.data(), plan.sorted.data(), R, k, D);
    expect_close("moe gather forward" + label, sorted_x, sorted_x_ref, bound);

    std::vector<float> d_x(N * D, nan);
    std::vector<double> d_x_ref(N * D);
    moe_gather_backward(d_x.data(), d_rows.data(), plan.position.data(), N, k, D, false);
    moe_gather_reference_backward(d_x_ref.data(), d_rows_d.data(), plan.position.data(), N, k, D, false);
    expect_close("moe gather backward (written)" + label, d_x, d_x_ref, bound);
    std::vector<float> d_x_added = base;
    std::vector<double> d_x_added_ref = to_double(base);
    moe_gather_backward(d_x_added.data(), d_rows.data(), plan.position.data(), N, k, D, true);
    moe_gather_reference_backward(d_x_added_ref.data(), d_rows_d.data(), plan.position.data(), N, k, D, true);
    expect_close("moe gather backward (accumulated)" + label, d_x_added, d_x_added_ref, bound);

    std::vector<float> out(N * D, nan), out_added = base;
    std::vector<double> out_ref(N * D), out_added_ref = to_double(base);
    moe_combine_forward(out.data(), y.data(), weights.data(), plan.position.data(), N, k, D, false);
    moe_combine_reference_forward(out_ref.data(), yd.data(), wd.data(), plan.position.data(), N, k, D, false);
    expect_close("moe combine forward (written)" + label, out, out_ref, bound);
    moe_combine_forward(out_added.data(), y.data(), weights.data(), plan.position.data(), N, k, D, true);
    moe_combine_reference_forward(out_added_ref.data(), yd.data(), wd.data(), plan.position.data(), N, k, D,
                                  true);
    expect_close("moe combine forward (accumulated)" + label, out_added, out_added_ref, bound);

    std::vector<float> d_y(R * D, nan), d_weights(N * k, nan);
    std::vector<double> d_y_ref(R * D), d_weights_ref(N * k);
    moe_combine_backward(d_y.data(), d_weights.data(), d_out.data(), y.data(), weights.data(),
                         plan.position.data(), N, k, D);
    moe_combine_reference_backward(d_y_ref.data(), d_weights_ref.data(), d_out_d.data(), yd.data(), wd.data(),
                                   plan.position.data(), N, k, D);
    expect_close("moe combine d_y_sorted" + label, d_y, d_y_ref, bound);
    expect_close("moe combine d_weights" + label, d_weights, d_weights_ref, bound);
  }
}

// --- The routed path against a dense per-token loop ---

// The dense loop: out[t] = sum over token t's kept slots of w[t, s] x[t] @ W[chosen[t, s]], a slot kept when
// fewer than `capacity` earlier tokens chose the same expert. Its backward written out by hand.
struct Dense {
  std::vector<double> out, d_x, d_w, d_weights;
};

Dense dense_experts(const std::vector<double>& x, const std::vector<double>& w,
                    const std::vector<int32_t>& chosen, const std::vector<double>& weights,
                    const std::vector<double>& d_out, int64_t N, int64_t k, int64_t E, int64_t I, int64_t O,
                    int64_t capacity) {
  Dense dense{std::vector<double>(N * O, 0.0), std::vector<double>(N * I, 0.0),
              std::vector<double>(E * I * O, 0.0), std::vector<double>(N * k, 0.0)};
  std::vector<int64_t> used(E, 0);
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t s = 0; s < k; ++s) {
      const int32_t e = chosen[t * k + s];
      if (capacity > 0 && used[e] >= capacity) continue;
      ++used[e];
      const double weight = weights[t * k + s];
      const double* we = w.data() + e * I * O;
      for (int64_t o = 0; o < O; ++o) {
        double y = 0.0;
        for (int64_t i = 0; i < I; ++i) y += x[t * I + i] * we[i * O + o];
        dense.out[t * O + o] += weight * y;
        dense.d_weights[t * k + s] += d_out[t * O + o] * y;
      }
      for (int64_t i = 0; i < I; ++i) {
        for (int64_t o = 0; o < O; ++o) {
          dense.d_x[t * I + i] += weight * d_out[t * O + o] * we[i * O + o];
          dense.d_w[e * I * O + i * O + o] += weight * x[t * I + i] * d_out[t * O + o];
        }
      }
    }
  }
  return dense;
}

template <class T>
Dense routed_experts(const std::vector<T>& x, const std::vector<T>& w, const std::vector<T>& d_out,
                     const Plan& plan, const std::vector<T>& weights, int64_t N, int64_t k, int64_t E,
                     int64_t I, int64_t O, bool fast) {
  const int64_t R = plan.rows();
  std::vector<T> sorted_x(R * I), y(R * O), out(N * O), d_y(R * O), d_sorted_x(R * I), d_x(N * I),
      d_w(E * I * O, T(0)), d_weights(N * k);
  if constexpr (std::is_same_v<T, float>) {
    if (fast) {
      moe_gather_forward(sorted_x.data(), x.data(), plan.sorted.data(), R, k, I);
      grouped_matmul_forward(y.data(), sorted_x.data(), w.data(), plan.offsets.data(), E, I, O);
      moe_combine_forward(out.data(), y.data(), weights.data(), plan.position.data(), N, k, O, false);
      moe_combine_backward(d_y.data(), d_weights.data(), d_out.data(), y.data(), weights.data(),
                           plan.position.data(), N, k, O);
      grouped_matmul_backward(d_sorted_x.data(), d_w.data(), d_y.data(), sorted_x.data(), w.data(),
                              plan.offsets.data(), E, I, O);
      moe_gather_backward(d_x.data(), d_sorted_x.data(), plan.position.data(), N, k, I, false);
      return Dense{to_double(out), to_double(d_x), to_double(d_w), to_double(d_weights)};
    }
  }
  moe_gather_reference_forward(sorted_x.data(), x.data(), plan.sorted.data(), R, k, I);
  grouped_matmul_reference_forward(y.data(), sorted_x.data(), w.data(), plan.offsets.data(), E, I, O);
  moe_combine_reference_forward(out.data(), y.data(), weights.data(), plan.position.data(), N, k, O, false);
  moe_combine_reference_backward(d_y.data(), d_weights.data(), d_out.data(), y.data(), weights.data(),
                                 plan.position.data(), N, k, O);
  grouped_matmul_reference_backward(d_sorted_x.data(), d_w.data(), d_y.data(), sorted_x.data(), w.data(),
                                    plan.offsets.data(), E, I, O);
  moe_gather_reference_backward(d_x.data(), d_sorted_x.data(), plan.position.data(), N, k, I, false);
  return Dense{std::vector<double>(out.begin(), out.end()), std::vector<double>(d_x.begin(), d_x.end()),
               std::vector<double>(d_w.begin(), d_w.end()),
               std::vector<double>(d_weights.begin(), d_weights.end())};
}

void expect_exact_path(const std::string& what, const Dense& routed, const Dense& dense) {
  // Double against double, the same sums in a different order: rounding only.
  const double bound = 1e-12;
  for (auto [name, a, b] :
       {std::tuple{"out", &routed.out, &dense.out}, std::tuple{"d_x", &routed.d_x, &dense.d_x},
        std::tuple{"d_w", &routed.d_w, &dense.d_w},
        std::tuple{"d_weights", &routed.d_weights, &dense.d_weights}}) {
    const double error = relative_error(*a, *b);
    report_error(what + " " + name, error, bound);
    EXPECT_LT(error, bound) << what << " " << name;
  }
}

TEST(MoeDispatch, RoutedPathEqualsDensePerTokenLoop) {
  // Router (sigmoid, groups, bias, normalised) -> plan -> gather -> grouped matmul -> combine, and back.
  const int64_t N = 120, E = 8, I = 24, O = 20;
  meshtrain::kernels::MoeRouting routing;
  routing.score_function = meshtrain::kernels::RouterScore::sigmoid;
  routing.top_k = 2;
  routing.groups = 4;
  routing.groups_kept = 2;
  routing.normalize_top_k = true;
  routing.scaling = 2.5f;
  const int64_t k = routing.top_k;
  const std::vector<float> logits = to_float(random_values(N * E, 31, -3.0, 3.0)),
                           bias = to_float(random_values(E, 32, -0.1, 0.1)),
                           x = to_float(random_values(N * I, 33)), w = to_float(random_values(E * I * O, 34)),
                           d_out = to_float(random_values(N * O, 35));
  std::vector<int32_t> chosen(N * k);
  std::vector<float> weights(N * k), scores(N * E);
  meshtrain::kernels::moe_router_forward(chosen.data(), weights.data(), scores.data(), logits.data(),
                                         bias.data(), N, E, routing);
  for (int64_t capacity : {int64_t(0), int64_t(25)}) {
    const Plan plan = plan_of(chosen, N, k, E, capacity);
    const std::string label = capacity > 0
                                  ? "moe path capacity 25 (" + std::to_string(plan.dropped) + " dropped)"
                                  : "moe path dropless";
    if (capacity > 0) {
      EXPECT_GT(plan.dropped, 0);
    }
    const Dense dense = dense_experts(to_double(x), to_double(w), chosen, to_double(weights),
                                      to_double(d_out), N, k, E, I, O, capacity);
    expect_exact_path(label + " reference",
                      routed_experts(to_double(x), to_double(w), to_double(d_out), plan, to_double(weights),
                                     N, k, E, I, O, false),
                      dense);
    const Dense fast = routed_experts(x, w, d_out, plan, weights, N, k, E, I, O, true);
    // Float GEMMs over I or O = 24 terms and a float dot of O terms: bound 1e-5 as the dense matmul's.
    expect_close(label + " fast out", to_float(fast.out), dense.out, 1e-5);
    expect_close(label + " fast d_x", to_float(fast.d_x), dense.d_x, 1e-5);
    expect_close(label + " fast d_w", to_float(fast.d_w), dense.d_w, 1e-5);
    expect_close(label + " fast d_weights", to_float(fast.d_weights), dense.d_weights, 1e-5);
  }
}

TEST(MoeDispatch, RoutedPathMatchesFiniteDifferences) {
  // The whole routed path in double, differentiated in x, the expert weights and the combine weights (the
  // choice held fixed, with dropping).
  const int64_t N = 9, k = 2, E = 4, I = 3, O = 2, capacity = 4;
  const std::vector<int32_t> chosen = random_choice(N, k, E, 41);
  const Plan plan = plan_of(chosen, N, k, E, capacity);
  ASSERT_GT(plan.dropped, 0);
  const int64_t R = plan.rows();
  std::vector<double> x = random_values(N * I, 42), w = random_values(E * I * O, 43),
                      weights = random_values(N * k, 44);
  const std::vector<double> probe = random_values(N * O, 45);
  auto loss = [&] {
    std::vector<double> sorted_x(R * I), y(R * O), out(N * O);
    moe_gather_reference_forward(sorted_x.data(), x.data(), plan.sorted.data(), R, k, I);
    grouped_matmul_reference_forward(y.data(), sorted_x.data(), w.data(), plan.offsets.data(), E, I, O);
    moe_combine_reference_forward(out.data(), y.data(), weights.data(), plan.position.data(), N, k, O, false);
    return weighted_sum(out, probe);
  };
  const Dense routed = routed_experts(x, w, probe, plan, weights, N, k, E, I, O, false);
  expect_gradient("moe path d_x", routed.d_x, numeric_gradient(loss, x));
  expect_gradient("moe path d_w", routed.d_w, numeric_gradient(loss, w));
  expect_gradient("moe path d_weights", routed.d_weights, numeric_gradient(loss, weights));
}

}  // namespace

// Expert parallelism on P simulated ranks (moe_dispatch_plan, an all-to-all as block swaps,
// moe_receive_plan): every token's combined output and input gradient equal the one-rank path's bitwise,
// dropless and with capacity dropping. Each expert is an affine map of its rows (scale e + 1, shift e), so a
// row sent to the wrong expert or back to the wrong token changes the result.
namespace expert_parallel {

constexpr int64_t D = 5;

void expert_map(float* rows, const int32_t* offsets, int64_t experts, int64_t first_expert) {
  for (int64_t e = 0; e < experts; ++e) {
    const auto global = static_cast<float>(first_expert + e);
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int64_t c = 0; c < D; ++c) rows[r * D + c] = rows[r * D + c] * (global + 1.0f) + global;
    }
  }
}
void expert_map_backward(float* d_rows, const int32_t* offsets, int64_t experts, int64_t first_expert) {
  for (int64_t e = 0; e < experts; ++e) {
    const auto global = static_cast<float>(first_expert + e);
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int64_t c = 0; c < D; ++c) d_rows[r * D + c] *= global + 1.0f;
    }
  }
}

// Block j of every rank's `send` to rank j, as block i of its `receive` (all_to_all over P ranks).
template <class T>
std::vector<std::vector<T>> all_to_all(const std::vector<std::vector<T>>& send, int64_t block) {
  const size_t P = send.size();
  std::vector<std::vector<T>> receive(P, std::vector<T>(P * static_cast<size_t>(block)));
  for (size_t i = 0; i < P; ++i) {
    for (size_t j = 0; j < P; ++j) {
      std::copy(send[i].begin() + static_cast<std::ptrdiff_t>(j * block),
                send[i].begin() + static_cast<std::ptrdiff_t>((j + 1) * block),
                receive[j].begin() + static_cast<std::ptrdiff_t>(i * block));
    }
  }
  return receive;
}

void check(int64_t P, int64_t E, int64_t k, int64_t N, int64_t capacity) {
  SCOPED_TRACE("P " + std::to_string(P) + " E " + std::to_string(E) + " k " + std::to_string(k) +
               " capacity " + std::to_string(capacity));
  const int64_t M = N * k, E_local = E / P;
  const int64_t worst = N * std::min(k, E_local);
  const int64_t B_c = capacity > 0 ? std::min(worst, E_local * capacity) : worst;
  const int64_t rows = P * B_c;
  std::vector<std::vector<float>> x(P), weights(P), d_out(P), out_single(P), d_x_single(P);
  std::vector<std::vector<float>> send_x(P), d_combined(P);
  std::vector<std::vector<int32_t>> send_sorted(P), send_position(P), send_counts(P);
  std::vector<Plan> plans;
  for (int64_t i = 0; i < P; ++i) {
    const std::vector<int32_t> chosen = random_choice(N, k, E, 100 + static_cast<uint64_t>(i));
    plans.push_back(plan_of(chosen, N, k, E, capacity));
    const Plan& plan = plans.back();
    x[i] = to_float(random_values(static_cast<size_t>(N * D), 200 + static_cast<uint64_t>(i)));
    weights[i] = to_float(random_values(static_cast<size_t>(M), 300 + static_cast<uint64_t>(i)));
    d_out[i] = to_float(random_values(static_cast<size_t>(N * D), 400 + static_cast<uint64_t>(i)));
    // One rank holding every expert.
    std::vector<float> sorted_x(M * D), d_sorted(M * D), d_weights(M);
    moe_gather_forward(sorted_x.data(), x[i].data(), plan.sorted.data(), plan.rows(), k, D);
    expert_map(sorted_x.data(), plan.offsets.data(), E, 0);
    out_single[i].assign(N * D, 0.0f);
    moe_combine_forward(out_single[i].data(), sorted_x.data(), weights[i].data(), plan.position.data(), N, k,
                        D, false);
    moe_combine_backward(d_sorted.data(), d_weights.data(), d_out[i].data(), sorted_x.data(),
                         weights[i].data(), plan.position.data(), N, k, D);
    expert_map_backward(d_sorted.data(), plan.offsets.data(), E, 0);
    d_x_single[i].assign(N * D, 0.0f);
    moe_gather_backward(d_x_single[i].data(), d_sorted.data(), plan.position.data(), N, k, D, false);
    // The token side of expert parallelism.
    send_sorted[i].assign(rows, -9);
    send_position[i].assign(M, -9);
    send_counts[i].assign(P * E_local, -9);
    meshtrain::kernels::moe_dispatch_plan(send_sorted[i].data(), send_position[i].data(),
                                          send_counts[i].data(), plan.offsets.data(), plan.sorted.data(), M,
                                          E, P, B_c);
    send_x[i].assign(rows * D, std::numeric_limits<float>::quiet_NaN());
    moe_gather_forward(send_x[i].data(), x[i].data(), send_sorted[i].data(), rows, k, D);
  }
  const auto received_x = all_to_all(send_x, B_c * D);
  const auto received_counts = all_to_all(send_counts, E_local);
  std::vector<std::vector<float>> returned(P);
  std::vector<std::vector<int32_t>> local_offsets(P), local_sorted(P), received_position(P);
  for (int64_t j = 0; j < P; ++j) {  // the expert side
    local_offsets[j].assign(E_local + 1, -9);
    local_sorted[j].assign(rows, -9);
    received_position[j].assign(rows, -9);
    meshtrain::kernels::moe_receive_plan(local_offsets[j].data(), local_sorted[j].data(),
                                         received_position[j].data(), received_counts[j].data(), P, E_local,
                                         B_c);
    std::vector<float> local_x(rows * D, std::numeric_limits<float>::quiet_NaN());
    moe_gather_forward(local_x.data(), received_x[j].data(), local_sorted[j].data(),
                       local_offsets[j][E_local], 1, D);
    expert_map(local_x.data(), local_offsets[j].data(), E_local, j * E_local);
    returned[j].assign(rows * D, std::numeric_limits<float>::quiet_NaN());
    moe_gather_forward(returned[j].data(), local_x.data(), received_position[j].data(), rows, 1, D);
  }
  const auto combined = all_to_all(returned, B_c * D);
  for (int64_t i = 0; i < P; ++i) {
    std::vector<float> out(N * D, 0.0f), d_weights(M);
    moe_combine_forward(out.data(), combined[i].data(), weights[i].data(), send_position[i].data(), N, k, D,
                        false);
    EXPECT_EQ(out, out_single[i]) << "rank " << i;
    d_combined[i].assign(rows * D, 0.0f);
    moe_combine_backward(d_combined[i].data(), d_weights.data(), d_out[i].data(), combined[i].data(),
                         weights[i].data(), send_position[i].data(), N, k, D);
  }
  const auto d_returned = all_to_all(d_combined, B_c * D);
  std::vector<std::vector<float>> d_received(P);
  for (int64_t j = 0; j < P; ++j) {
    std::vector<float> d_local(rows * D, std::numeric_limits<float>::quiet_NaN());
    moe_gather_forward(d_local.data(), d_returned[j].data(), local_sorted[j].data(),
                       local_offsets[j][E_local], 1, D);
    expert_map_backward(d_local.data(), local_offsets[j].data(), E_local, j * E_local);
    d_received[j].assign(rows * D, std::numeric_limits<float>::quiet_NaN());
    moe_gather_forward(d_received[j].data(), d_local.data(), received_position[j].data(), rows, 1, D);
    // Padding rows travel as zeros, never as stale values.
    for (int64_t r = 0; r < rows; ++r) {
      if (received_position[j][r] < 0) {
        for (int64_t c = 0; c < D; ++c) ASSERT_EQ(d_received[j][r * D + c], 0.0f);
      }
    }
  }
  const auto d_sent = all_to_all(d_received, B_c * D);
  for (int64_t i = 0; i < P; ++i) {
    std::vector<float> d_x(N * D, -1.0f);
    moe_gather_backward(d_x.data(), d_sent[i].data(), send_position[i].data(), N, k, D, false);
    EXPECT_EQ(d_x, d_x_single[i]) << "rank " << i;
  }
}

}  // namespace expert_parallel

TEST(MoeDispatch, ExpertParallelBlocksEqualOneRank) {
  expert_parallel::check(2, 8, 2, 13, 0);  // dropless: blocks of N min(k, E_l) rows
  expert_parallel::check(4, 8, 3, 11, 0);  // E_l = 2 < k
  expert_parallel::check(8, 8, 2, 7, 0);   // one expert a rank
  expert_parallel::check(2, 8, 2, 13, 3);  // capacity 3: dropping, blocks of E_l x 3 rows
  expert_parallel::check(4, 4, 1, 9, 2);
}

// The block layout by hand: 2 ranks of 2 experts, blocks of 3 rows.
TEST(MoeDispatch, DispatchAndReceivePlanHandExample) {
  // Sorted assignments by expert: e0 {0, 3}, e1 {}, e2 {1}, e3 {2, 4}: offsets [0 2 2 3 5].
  const std::vector<int32_t> offsets = {0, 2, 2, 3, 5}, sorted = {0, 3, 1, 2, 4};
  std::vector<int32_t> send_sorted(6), send_position(5), send_counts(4);
  meshtrain::kernels::moe_dispatch_plan(send_sorted.data(), send_position.data(), send_counts.data(),
                                        offsets.data(), sorted.data(), 5, 4, 2, 3);
  EXPECT_EQ(send_sorted, (std::vector<int32_t>{0, 3, -1, 1, 2, 4}));
  EXPECT_EQ(send_position, (std::vector<int32_t>{0, 3, 4, 1, 5}));
  EXPECT_EQ(send_counts, (std::vector<int32_t>{2, 0, 1, 2}));
  // Rank 1 receives [e2: 1, e3: 2] from rank 0 (above) and [e2: 2, e3: 0] from rank 1: local rows e2
  // (rank 0's one, rank 1's two) then e3 (rank 0's two).
  const std::vector<int32_t> received_counts = {1, 2, 2, 0};
  std::vector<int32_t> local_offsets(3), local_sorted(6), received_position(6);
  meshtrain::kernels::moe_receive_plan(local_offsets.data(), local_sorted.data(), received_position.data(),
                                       received_counts.data(), 2, 2, 3);
  EXPECT_EQ(local_offsets, (std::vector<int32_t>{0, 3, 5}));
  EXPECT_EQ(local_sorted, (std::vector<int32_t>{0, 3, 4, 1, 2, -1}));
  EXPECT_EQ(received_position, (std::vector<int32_t>{0, 3, 4, 1, 2, -1}));
}
