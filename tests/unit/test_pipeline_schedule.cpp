// plan/pipeline_schedule: every schedule's op lists against their definition (each op once on the rank
// holding its chunk, F before B before W, every send matched by one receive), the simulated bubble against
// the spec's formulas, the in-flight activations against their bounds, hand-written orders from the papers,
// a deadlock found rather than hung, and the bad inputs' messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "error_text.h"
#include "meshtrain/core/error.h"
#include "meshtrain/plan/pipeline_schedule.h"

namespace meshtrain {
namespace {

using testing::error_of;
using Kind = PipelineScheduleKind;
using OpKind = PipelineOpKind;

struct Shape {
  Kind kind;
  int64_t stages, micro_batches, repeats;
};

std::string shape_text(const Shape& shape) {
  return std::string(pipeline_schedule_name(shape.kind)) + " P=" + std::to_string(shape.stages) +
         " M=" + std::to_string(shape.micro_batches) + " V=" + std::to_string(shape.repeats);
}

// The cases the issue names: P in {1, 2, 4}, M in {P, 2P, 8}, V = 2 for interleaved; all valid.
std::vector<Shape> valid_shapes() {
  std::vector<Shape> shapes;
  for (Kind kind : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved_one_f_one_b, Kind::zero_bubble}) {
    for (int64_t stages : {1, 2, 4}) {
      for (int64_t micro_batches : {stages, 2 * stages, int64_t{8}}) {
        shapes.push_back({kind, stages, micro_batches, kind == Kind::interleaved_one_f_one_b ? 2 : 1});
      }
    }
  }
  return shapes;
}

PipelineSchedule build(const Shape& shape) {
  return build_pipeline_schedule(shape.kind, shape.stages, shape.micro_batches, shape.repeats);
}

using ComputeId = std::tuple<OpKind, int64_t, int64_t>;  // kind, micro-batch, chunk
using TransferId = std::tuple<PipelinePayload, int64_t, int64_t, int64_t, int64_t>;  // ..., from, to

std::vector<OpKind> compute_kinds(Kind kind) {
  if (kind == Kind::zero_bubble) return {OpKind::forward, OpKind::backward_input, OpKind::backward_weight};
  return {OpKind::forward, OpKind::backward};
}

TEST(PipelineSchedule, EveryOpOnceOnTheRankHoldingItsChunkInDependencyOrder) {
  for (const Shape& shape : valid_shapes()) {
    const PipelineSchedule schedule = build(shape);
    const std::string context = shape_text(shape) + "\n" + format_pipeline_schedule(schedule, true);
    ASSERT_EQ(schedule.ranks.size(), static_cast<size_t>(shape.stages)) << context;
    std::map<ComputeId, int> count;
    for (size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
      std::map<ComputeId, size_t> position;
      for (size_t index = 0; index < schedule.ranks[rank].size(); ++index) {
        const PipelineOp& op = schedule.ranks[rank][index];
        if (!op.is_compute()) continue;
        EXPECT_EQ(op.chunk % shape.stages, static_cast<int64_t>(rank)) << context;
        ++count[{op.kind, op.micro_batch, op.chunk}];
        position[{op.kind, op.micro_batch, op.chunk}] = index;
      }
      // F(m, c) before B(m, c) (or B_input(m, c)) before W(m, c) on the rank.
      const std::vector<OpKind> kinds = compute_kinds(shape.kind);
      for (const auto& [id, index] : position) {
        const auto& [kind, micro, chunk] = id;
        const auto at = std::find(kinds.begin(), kinds.end(), kind);
        if (at == kinds.begin()) continue;
        const auto before = position.find({*(at - 1), micro, chunk});
        ASSERT_NE(before, position.end()) << context;
        EXPECT_LT(before->second, index)
            << pipeline_op_text(schedule.ranks[rank][index], shape.repeats) << "\n"
            << context;
      }
    }
    for (const OpKind kind : compute_kinds(shape.kind)) {
      for (int64_t micro = 0; micro < shape.micro_batches; ++micro) {
        for (int64_t chunk = 0; chunk < shape.stages * shape.repeats; ++chunk) {
          EXPECT_EQ((count[{kind, micro, chunk}]), 1) << "micro " << micro << " chunk " << chunk << "\n"
                                                      << context;
        }
      }
    }
    int64_t ops = 0;
    for (const auto& [id, times] : count) ops += times;
    EXPECT_EQ(ops, static_cast<int64_t>(compute_kinds(shape.kind).size()) * shape.micro_batches *
                       shape.stages * shape.repeats)
        << context;
  }
}

// Every chunk boundary of every micro-batch between two ranks is one send and one receive each way (an
// activation forward, a gradient back); the send follows the op that made the tensor, the receive comes
// before the op that reads it.
TEST(PipelineSchedule, EverySendMatchesExactlyOneReceive) {
  for (const Shape& shape : valid_shapes()) {
    const PipelineSchedule schedule = build(shape);
    const std::string context = shape_text(shape) + "\n" + format_pipeline_schedule(schedule, true);
    std::map<TransferId, int> sends, receives;
    for (size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
      const int64_t self = static_cast<int64_t>(rank);
      std::map<ComputeId, size_t> computed;
      std::map<TransferId, size_t> received_at;
      for (size_t index = 0; index < schedule.ranks[rank].size(); ++index) {
        const PipelineOp& op = schedule.ranks[rank][index];
        const bool activation = op.payload == PipelinePayload::activation;
        const OpKind producer =
            activation ? OpKind::forward
                       : (shape.kind == Kind::zero_bubble ? OpKind::backward_input : OpKind::backward);
        if (op.kind == OpKind::send) {
          ++sends[{op.payload, op.micro_batch, op.chunk, self, op.peer}];
          EXPECT_TRUE(computed.contains({producer, op.micro_batch, op.chunk})) << context;
          EXPECT_EQ(op.peer, schedule.rank_of_chunk(op.chunk + (activation ? 1 : -1))) << context;
        } else if (op.kind == OpKind::receive) {
          ++receives[{op.payload, op.micro_batch, op.chunk, op.peer, self}];
          received_at[{op.payload, op.micro_batch, op.chunk, op.peer, self}] = index;
          EXPECT_EQ(op.peer, schedule.rank_of_chunk(op.chunk)) << context;
        } else {
          computed[{op.kind, op.micro_batch, op.chunk}] = index;
          const bool reads_activation = op.kind == OpKind::forward && op.chunk > 0;
          const bool reads_gradient = (op.kind == OpKind::backward || op.kind == OpKind::backward_input) &&
                                      op.chunk + 1 < schedule.chunks();
          const int64_t from_chunk = op.chunk + (reads_activation ? -1 : 1);
          if ((reads_activation || reads_gradient) && schedule.rank_of_chunk(from_chunk) != self) {
            const PipelinePayload payload =
                reads_activation ? PipelinePayload::activation : PipelinePayload::gradient;
            EXPECT_TRUE(received_at.contains(
                {payload, op.micro_batch, from_chunk, schedule.rank_of_chunk(from_chunk), self}))
                << pipeline_op_text(op, shape.repeats) << " on rank " << rank << "\n"
                << context;
          }
        }
      }
    }
    EXPECT_EQ(sends, receives) << context;
    for (const auto& [id, times] : sends) EXPECT_EQ(times, 1) << context;
    // With P > 1 every boundary crosses ranks: M (P V - 1) activations and as many gradients.
    const int64_t boundaries =
        shape.stages == 1 ? 0 : shape.micro_batches * (shape.stages * shape.repeats - 1);
    EXPECT_EQ(static_cast<int64_t>(sends.size()), 2 * boundaries) << context;
  }
}

// The simulation with equal chunks: completes, and holds the activations the spec's table bounds.
TEST(PipelineSchedule, InFlightActivationsWithinTheirBounds) {
  for (const Shape& shape : valid_shapes()) {
    const PipelineSchedule schedule = build(shape);
    const std::string context = shape_text(shape) + "\n" + format_pipeline_schedule(schedule);
    const int64_t P = shape.stages, M = shape.micro_batches, V = shape.repeats;
    const PipelineSimulation simulation =
        simulate_pipeline_schedule(schedule, equal_chunk_op_times(P * V, 1, 0.5, 0.5));
    ASSERT_EQ(simulation.ranks.size(), static_cast<size_t>(P));
    for (int64_t rank = 0; rank < P; ++rank) {
      const PipelineRankSimulation& result = simulation.ranks[static_cast<size_t>(rank)];
      switch (shape.kind) {
        case Kind::gpipe:
          EXPECT_EQ(result.peak_activations, M) << "rank " << rank << " " << context;
          break;
        case Kind::one_f_one_b:
          EXPECT_EQ(result.peak_activations, P - rank) << "rank " << rank << " " << context;
          break;
        case Kind::interleaved_one_f_one_b:
          // Megatron's warm-up, plus the steady state's forward that precedes its backward.
          EXPECT_EQ(result.peak_activations, std::min(2 * (P - rank - 1) + (V - 1) * P + 1, M * V))
              << "rank " << rank << " " << context;
          break;
        case Kind::zero_bubble:
          // 1F1B's P - s until B_input; W's inputs, deferred by s backwards on rank s, make P until W: the
          // peak over ranks stays 1F1B's.
          EXPECT_EQ(result.peak_activations_before_input_gradient, P - rank)
              << "rank " << rank << " " << context;
          EXPECT_EQ(result.peak_activations, P) << "rank " << rank << " " << context;
          break;
      }
      if (shape.kind != Kind::zero_bubble) {
        EXPECT_EQ(result.peak_activations_before_input_gradient, result.peak_activations) << context;
      }
    }
  }
}

// The spec's bubble fractions, from the simulation of the planned ops with equal chunks.
TEST(PipelineSchedule, SimulatedBubbleEqualsTheSpecFormula) {
  for (const Shape& shape : valid_shapes()) {
    const PipelineSchedule schedule = build(shape);
    const double P = static_cast<double>(shape.stages), M = static_cast<double>(shape.micro_batches),
                 V = static_cast<double>(shape.repeats);
    // (forward, B_input, W) per chunk: F = B, then B = 2F.
    for (const auto& [forward, input, weight] : {std::tuple{1.0, 0.5, 0.5}, std::tuple{1.0, 1.0, 1.0}}) {
      const PipelineSimulation simulation = simulate_pipeline_schedule(
          schedule, equal_chunk_op_times(shape.stages * shape.repeats, forward, input, weight));
      const double backward = input + weight;
      double expected = (P - 1) / (M + P - 1);
      if (shape.kind == Kind::interleaved_one_f_one_b) expected = (P - 1) / (V * M + P - 1);
      if (shape.kind == Kind::zero_bubble) {
        const double bubble = (P - 1) * (forward + input - weight);
        expected = bubble / (M * (forward + backward) + bubble);
      }
      const std::string context = shape_text(shape) + " F=" + std::to_string(forward) +
                                  " B_input=" + std::to_string(input) + " W=" + std::to_string(weight);
      EXPECT_NEAR(simulation.max_bubble_fraction, expected, 1e-12) << context;
      // Every rank does the same work in the same span, so each idles as much.
      for (const PipelineRankSimulation& rank : simulation.ranks) {
        EXPECT_NEAR(rank.bubble_fraction, expected, 1e-12) << context;
        EXPECT_NEAR(rank.busy_seconds, M * V * (forward + backward), 1e-9) << context;
        EXPECT_NEAR(rank.idle_seconds, simulation.makespan_seconds - rank.busy_seconds, 1e-9) << context;
      }
    }
  }
}

// ZB-H1's formula holds while W <= B_input. With a longer W the last rank still cannot start before the
// P - 1 forwards ahead of it, so no schedule with one chunk per rank idles less than (P - 1) F: the bubble
// is (P - 1)(F + max(B_input - W, 0)).
TEST(PipelineSchedule, ZeroBubbleWithWeightGradientsLongerThanInputGradients) {
  for (const int64_t stages : {2, 4}) {
    const double P = static_cast<double>(stages), M = 8, forward = 1, input = 0.5, weight = 1;
    const PipelineSimulation simulation =
        simulate_pipeline_schedule(build_pipeline_schedule(Kind::zero_bubble, stages, 8, 1),
                                   equal_chunk_op_times(stages, forward, input, weight));
    const double bubble = (P - 1) * forward;
    EXPECT_NEAR(simulation.max_bubble_fraction, bubble / (M * (forward + input + weight) + bubble), 1e-12);
  }
}

// A transfer time delays each hop: 1F1B's idle becomes (P - 1)(F + B + 2 t) (one transfer each way per hop).
TEST(PipelineSchedule, TransferTimeAddsToEachHop) {
  const int64_t stages = 4, micro_batches = 8;
  const PipelineSimulation simulation =
      simulate_pipeline_schedule(build_pipeline_schedule(Kind::gpipe, stages, micro_batches, 1),
                                 equal_chunk_op_times(stages, 1, 0.5, 0.5, 0.25));
  for (const PipelineRankSimulation& rank : simulation.ranks) {
    EXPECT_NEAR(rank.idle_seconds, (stages - 1) * (1 + 1 + 2 * 0.25), 1e-12);
  }
}

std::string lines(const std::vector<std::string>& ranks) {
  std::string text;
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    text += "rank " + std::to_string(rank) + ": " + ranks[rank] + "\n";
  }
  return text;
}

// Orders written out by hand from their definitions (0-based micro-batches).
TEST(PipelineSchedule, HandWrittenOrders) {
  // GPipe (torchtitan's ScheduleGPipe): every forward, then every backward in micro-batch order.
  EXPECT_EQ(format_pipeline_schedule(build_pipeline_schedule(Kind::gpipe, 2, 4, 1)),
            lines({"F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 F2 F3 B0 B1 B2 B3"}));
  // 1F1B: Narayanan et al. 2021 (Megatron), Figure 4 top: 4 devices, 8 micro-batches.
  EXPECT_EQ(format_pipeline_schedule(build_pipeline_schedule(Kind::one_f_one_b, 4, 8, 1)),
            lines({"F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
                   "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
                   "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
                   "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"}));
  // Interleaved, P = 2, V = 2, M = 4 (Megatron's forward_backward_pipelining_with_interleaving): rank 0
  // holds chunks 0 and 2, rank 1 chunks 1 and 3. Forwards in rounds of P micro-batches per chunk
  // (F0c0 F1c0 F0c2 F1c2 F2c0 F3c0 F2c2 F3c2), backwards likewise from the last chunk (B0c2 B1c2 B0c0 ...).
  // Warm-up: rank 0 2 (P - 0 - 1) + (V - 1) P = 4 forwards, rank 1 2.
  EXPECT_EQ(format_pipeline_schedule(build_pipeline_schedule(Kind::interleaved_one_f_one_b, 2, 4, 2)),
            lines({"F0c0 F1c0 F0c2 F1c2 F2c0 B0c2 F3c0 B1c2 F2c2 B0c0 F3c2 B1c0 B2c2 B3c2 B2c0 B3c0",
                   "F0c1 F1c1 F0c3 B0c3 F1c3 B1c3 F2c1 B0c1 F3c1 B1c1 F2c3 B2c3 F3c3 B3c3 B2c1 B3c1"}));
  // ZB-H1 (Qi et al. 2023; torchtitan's ZB1P with one chunk per rank): 1F1B's order with each B split into
  // I (B_input) and W, rank s running W(m) after I(m + s) and its last s W at the end.
  EXPECT_EQ(format_pipeline_schedule(build_pipeline_schedule(Kind::zero_bubble, 4, 8, 1)),
            lines({"F0 F1 F2 F3 I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7",
                   "F0 F1 F2 I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 F6 I4 W3 F7 I5 W4 I6 W5 I7 W6 W7",
                   "F0 F1 I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 F6 I5 W3 F7 I6 W4 I7 W5 W6 W7",
                   "F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7"}));
  // The transfers: a send right after the op that made its tensor, a receive one compute op ahead of the
  // op that reads it.
  EXPECT_EQ(
      format_pipeline_schedule(build_pipeline_schedule(Kind::one_f_one_b, 2, 2, 1), true),
      lines({"F0 sA0c0>1 rG0c1<1 F1 sA1c0>1 rG1c1<1 B0 B1", "rA0c0<0 F0 rA1c0<0 B0 sG0c1>0 F1 B1 sG1c1>0"}));
  // One rank: no transfers, chunk 1 reads chunk 0 on the same rank.
  EXPECT_EQ(format_pipeline_schedule(build_pipeline_schedule(Kind::interleaved_one_f_one_b, 1, 2, 2), true),
            lines({"F0c0 F0c1 B0c1 F1c0 B0c0 F1c1 B1c1 B1c0"}));
}

PipelineOp compute(OpKind kind, int64_t micro, int64_t chunk) {
  return {kind, micro, chunk};
}
PipelineOp transfer(OpKind kind, PipelinePayload payload, int64_t micro, int64_t chunk, int64_t peer) {
  return {kind, micro, chunk, payload, peer};
}

// Rank 0 waits for the gradient of micro-batch 0 before it sends micro-batch 1's activation; rank 1 wants
// that activation before it runs micro-batch 0's backward: neither moves.
TEST(PipelineSchedule, DeadlockIsReportedNotHung) {
  const auto A = PipelinePayload::activation, G = PipelinePayload::gradient;
  PipelineSchedule schedule{Kind::one_f_one_b, 2, 2, 1, {}};
  schedule.ranks = {
      {compute(OpKind::forward, 0, 0), transfer(OpKind::send, A, 0, 0, 1),
       transfer(OpKind::receive, G, 0, 1, 1), compute(OpKind::backward, 0, 0), compute(OpKind::forward, 1, 0),
       transfer(OpKind::send, A, 1, 0, 1), transfer(OpKind::receive, G, 1, 1, 1),
       compute(OpKind::backward, 1, 0)},
      {transfer(OpKind::receive, A, 0, 0, 0), transfer(OpKind::receive, A, 1, 0, 0),
       compute(OpKind::forward, 0, 1), compute(OpKind::forward, 1, 1), compute(OpKind::backward, 0, 1),
       transfer(OpKind::send, G, 0, 1, 0), compute(OpKind::backward, 1, 1),
       transfer(OpKind::send, G, 1, 1, 0)},
  };
  const PipelineOpTimes times = equal_chunk_op_times(2, 1, 0.5, 0.5);
  const std::string message = error_of([&] { simulate_pipeline_schedule(schedule, times); });
  EXPECT_NE(message.find("no deadlock"), std::string::npos) << message;
  EXPECT_NE(
      message.find("rank 0 at op 3 B0 waits for the gradient of micro-batch 0 from chunk 1, which rank 1"),
      std::string::npos)
      << message;
  EXPECT_NE(
      message.find("rank 1 at op 3 F1 waits for the activation of micro-batch 1 from chunk 0, which rank 0"),
      std::string::npos)
      << message;

  // Rank 0 in 1F1B's order (both forwards first) runs.
  schedule.ranks[0] = {compute(OpKind::forward, 0, 0),        transfer(OpKind::send, A, 0, 0, 1),
                       compute(OpKind::forward, 1, 0),        transfer(OpKind::send, A, 1, 0, 1),
                       transfer(OpKind::receive, G, 0, 1, 1), compute(OpKind::backward, 0, 0),
                       transfer(OpKind::receive, G, 1, 1, 1), compute(OpKind::backward, 1, 0)};
  EXPECT_NO_THROW(simulate_pipeline_schedule(schedule, times));

  // A receive nobody sends, a backward before its forward: errors naming the rank and the op.
  PipelineSchedule unmatched = schedule;
  unmatched.ranks[0].insert(unmatched.ranks[0].begin(), transfer(OpKind::receive, G, 1, 3, 1));
  EXPECT_NE(
      error_of([&] { simulate_pipeline_schedule(unmatched, times); }).find("rank 0, op 0 rG1c3<1): expected"),
      std::string::npos);
  PipelineSchedule backward_first = schedule;
  std::swap(backward_first.ranks[1][2], backward_first.ranks[1][4]);
  EXPECT_NE(error_of([&] {
              simulate_pipeline_schedule(backward_first, times);
            }).find("rank 1, op 2 B0): expected ops that read only what an earlier op"),
            std::string::npos);
}

TEST(PipelineSchedule, BadShapesNameTheKeysAndTheFix) {
  const auto message = [](Kind kind, int64_t stages, int64_t micro_batches, int64_t repeats) {
    return error_of([&] { build_pipeline_schedule(kind, stages, micro_batches, repeats); });
  };
  struct Case {
    Shape shape;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{Kind::gpipe, 0, 4, 1},
       "mesh.stage: expected at least 1 stage rank, found mesh.stage=0 (fix: set mesh.stage=1 for no "
       "pipeline, "
       "or more)"},
      {{Kind::gpipe, 2, 0, 1},
       "gradient_accumulation_steps: expected at least 1 micro-batch per step, found "
       "gradient_accumulation_steps=0 (fix: set gradient_accumulation_steps=1 or more)"},
      {{Kind::one_f_one_b, 4, 2, 1},
       "gradient_accumulation_steps: expected at least mesh.stage=4 micro-batches with "
       "pipeline_schedule=1f1b "
       "(the first stage rank runs mesh.stage forwards before its first backward), found "
       "gradient_accumulation_steps=2 (fix: set gradient_accumulation_steps=4 or more, fewer stages "
       "(mesh.stage <= 2), or pipeline_schedule=gpipe)"},
      {{Kind::interleaved_one_f_one_b, 4, 6, 2},
       "gradient_accumulation_steps: expected a multiple of mesh.stage=4 with "
       "pipeline_schedule=interleaved_1f1b "
       "(each chunk runs its forwards in rounds of mesh.stage micro-batches), found "
       "gradient_accumulation_steps=6 "
       "(fix: set gradient_accumulation_steps=8 (or another multiple of mesh.stage), or "
       "pipeline_schedule=1f1b)"},
      {{Kind::one_f_one_b, 2, 4, 2},
       "num_pipeline_repeats: expected 1 with pipeline_schedule=1f1b (only interleaved_1f1b runs several "
       "chunks "
       "per stage rank), found num_pipeline_repeats=2 (fix: set num_pipeline_repeats=1, or "
       "pipeline_schedule=interleaved_1f1b)"},
      {{Kind::interleaved_one_f_one_b, 2, 4, 1},
       "num_pipeline_repeats: expected at least 2 chunks per stage rank with "
       "pipeline_schedule=interleaved_1f1b, "
       "found num_pipeline_repeats=1 (fix: set num_pipeline_repeats=2 or more, or pipeline_schedule=1f1b for "
       "one chunk per stage rank)"},
  };
  for (const Case& bad : cases) EXPECT_EQ(error_of([&] { build(bad.shape); }), bad.expected);
  EXPECT_NE(message(Kind::zero_bubble, 4, 3, 1).find("micro-batches with pipeline_schedule=zero_bubble"),
            std::string::npos);
  EXPECT_NE(message(Kind::interleaved_one_f_one_b, 4, 2, 2).find("gradient_accumulation_steps=4"),
            std::string::npos);
  EXPECT_NE(
      message(Kind::gpipe, 2, 4, 0).find("num_pipeline_repeats: expected at least 1 chunk per stage rank"),
      std::string::npos);
  // GPipe takes any M, fewer micro-batches than stages included.
  EXPECT_NO_THROW(build_pipeline_schedule(Kind::gpipe, 4, 1, 1));
  EXPECT_NE(error_of([] {
              simulate_pipeline_schedule(build_pipeline_schedule(Kind::gpipe, 2, 2, 1),
                                         equal_chunk_op_times(3, 1, 1, 1));
            }).find("pipeline op times: expected 2 seconds per op kind"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtrain
