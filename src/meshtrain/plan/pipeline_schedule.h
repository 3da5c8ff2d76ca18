// Pipeline schedules as data (shared/specs/pipeline.md, DESIGN.md principle 2: a schedule is a program, not
// a loop): for each stage rank, the ordered forward / backward ops over micro-batches and layer chunks with
// the sends and receives between ranks; and a plain reference simulator that runs those lists against
// predicted op times (the planned bubble, the in-flight activations) and finds a schedule that deadlocks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"  // PipelineScheduleKind: the config key pipeline_schedule's values

namespace meshtrain {

enum class PipelineOpKind {
  forward,          // F: one micro-batch through one chunk
  backward,         // B: its whole backward (input and weight gradients)
  backward_input,   // zero_bubble's B_input: the input gradient only (what the previous chunk waits for)
  backward_weight,  // zero_bubble's W: the weight gradients, from the activations F saved and B_input's
                    // output gradients
  send,             // start a non-blocking send of a tensor this rank computed
  receive,          // start a non-blocking receive; the compute op that reads the tensor waits for it
};

// What a send or receive carries. Both are named by the op that produced the tensor: an activation is the
// output of chunk c's forward of micro-batch m (read by chunk c + 1's forward), a gradient the input
// gradient chunk c's backward made (read by chunk c - 1's backward).
enum class PipelinePayload { activation, gradient };

struct PipelineOp {
  PipelineOpKind kind = PipelineOpKind::forward;
  int64_t micro_batch = 0;  // in [0, M)
  // The global chunk in [0, P x V): compute ops the chunk they run; a send or receive the chunk that
  // produced its tensor. Rank s holds chunks s, s + P, s + 2P, ... (round robin: Megatron, MaxText circular).
  int64_t chunk = 0;
  PipelinePayload payload = PipelinePayload::activation;  // send / receive only
  int64_t peer = -1;  // send: the rank it goes to; receive: the rank it comes from; -1 for compute ops

  bool is_compute() const { return kind != PipelineOpKind::send && kind != PipelineOpKind::receive; }
};

struct PipelineSchedule {
  PipelineScheduleKind kind = PipelineScheduleKind::gpipe;
  int64_t stages = 1;                          // P (mesh.stage)
  int64_t micro_batches = 1;                   // M (gradient_accumulation_steps)
  int64_t repeats = 1;                         // V (num_pipeline_repeats): chunks per rank
  std::vector<std::vector<PipelineOp>> ranks;  // per stage rank, its ops in the order it runs them

  int64_t chunks() const { return stages * repeats; }
  int64_t rank_of_chunk(int64_t chunk) const { return chunk % stages; }
};

// The schedule `kind` for P stage ranks, M micro-batches and V chunks per rank. Each rank's list holds F and
// B (zero_bubble: F, B_input and W) of every micro-batch of each of its chunks once; a send follows the op
// that produced its tensor; a receive is posted one compute op ahead of the op that reads it (so the
// transfer overlaps that op); a neighbour on the same rank (P = 1) needs none. Fails, naming the keys
// (mesh.stage, gradient_accumulation_steps, num_pipeline_repeats, pipeline_schedule), for P < 1, M < 1,
// V < 1, V > 1 with a schedule other than interleaved_1f1b, V < 2 with interleaved_1f1b (V = 1 would be
// 1f1b under another name), M < P with 1f1b or zero_bubble, M not a multiple of P with interleaved_1f1b.
PipelineSchedule build_pipeline_schedule(PipelineScheduleKind kind, int64_t stages, int64_t micro_batches,
                                         int64_t repeats);

// One op as text: F3, B3, I3 (B_input), W3; with several chunks per rank the chunk follows (F3c5). A send
// of the activation of micro-batch 3 from chunk 5 to rank 2 is sA3c5>2, its receive rA3c5<1 (G for a
// gradient).
std::string pipeline_op_text(const PipelineOp& op, int64_t repeats);
// One line per rank, "rank 0: F0 F1 B0 F2 B1 ...": compute ops only, or with the sends and receives.
std::string format_pipeline_schedule(const PipelineSchedule& schedule, bool with_transfers = false);

// Predicted seconds of each op, per global chunk (P x V entries each).
struct PipelineOpTimes {
  std::vector<double> forward, backward, backward_input, backward_weight;
  double transfer = 0;  // from the moment both the send and its receive are started to the data's arrival
};
// Every chunk the same: B = B_input + W.
PipelineOpTimes equal_chunk_op_times(int64_t chunks, double forward, double backward_input,
                                     double backward_weight, double transfer = 0);

struct PipelineRankSimulation {
  double busy_seconds = 0;     // its compute ops
  double idle_seconds = 0;     // the step's span (first op start to last op end, over every rank) minus busy
  double bubble_fraction = 0;  // idle / span
  // Chunk-micro-batches whose forward has run and whose last backward op has not: held until B, or with
  // zero_bubble until W, which still reads the layer inputs the forward saved.
  int64_t peak_activations = 0;
  // The same held only until B or B_input: the whole of what a forward saves (with zero_bubble, B_input
  // leaves only W's inputs). Equal to peak_activations except with zero_bubble.
  int64_t peak_activations_before_input_gradient = 0;
};

struct PipelineSimulation {
  std::vector<PipelineRankSimulation> ranks;
  double makespan_seconds = 0;
  double max_bubble_fraction = 0;
};

// Runs every rank's list in order: a compute op starts when its rank is free and the tensors it reads have
// arrived; a transfer takes times.transfer once both its send and its receive are started (a send when its
// rank reaches it, which is after the op that produced the tensor). Fails naming the rank and the op for a
// schedule that cannot run: an op reading what no earlier op produced, a receive whose send never runs
// (deadlock), a send nobody receives, a tensor sent or received twice.
PipelineSimulation simulate_pipeline_schedule(const PipelineSchedule& schedule, const PipelineOpTimes& times);

}  // namespace meshtrain
