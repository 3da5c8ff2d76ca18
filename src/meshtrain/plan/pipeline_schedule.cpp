// Pipeline schedules (GPipe, 1F1B, Megatron's interleaved 1F1B, ZB-H1) as per-rank op lists with their
// sends and receives, and the reference simulator that runs them against predicted op times.
#include "meshtrain/plan/pipeline_schedule.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// One F or one B of a schedule: micro-batch m of global chunk c.
struct Slot {
  int64_t micro_batch = 0;
  int64_t chunk = 0;
};

PipelineOp compute_op(PipelineOpKind kind, const Slot& slot) {
  return {kind, slot.micro_batch, slot.chunk};
}

std::string schedule_setting(PipelineScheduleKind kind) {
  return std::string("pipeline_schedule=") + pipeline_schedule_name(kind);
}

void check_schedule_shape(PipelineScheduleKind kind, int64_t stages, int64_t micro_batches, int64_t repeats) {
  const std::string schedule = schedule_setting(kind);
  const std::string stage_setting = "mesh.stage=" + std::to_string(stages);
  const std::string micro_batch_setting = "gradient_accumulation_steps=" + std::to_string(micro_batches);
  const std::string repeat_setting = "num_pipeline_repeats=" + std::to_string(repeats);
  const bool interleaved = kind == PipelineScheduleKind::interleaved_one_f_one_b;
  if (stages < 1) {
    fail("mesh.stage", "at least 1 stage rank", stage_setting, "set mesh.stage=1 for no pipeline, or more");
  }
  if (micro_batches < 1) {
    fail("gradient_accumulation_steps", "at least 1 micro-batch per step", micro_batch_setting,
         "set gradient_accumulation_steps=1 or more");
  }
  if (repeats < 1) {
    fail("num_pipeline_repeats", "at least 1 chunk per stage rank", repeat_setting,
         "set num_pipeline_repeats=1 (2 or more only with pipeline_schedule=interleaved_1f1b)");
  }
  if (!interleaved && repeats > 1) {
    fail("num_pipeline_repeats",
         "1 with " + schedule + " (only interleaved_1f1b runs several chunks per stage rank)", repeat_setting,
         "set num_pipeline_repeats=1, or pipeline_schedule=interleaved_1f1b");
  }
  // One chunk per rank is what 1f1b names (Megatron too runs one virtual stage as its plain 1F1B); the
  // interleaved warm-up formula at V = 1 (2 forwards per hop) would hold more for nothing.
  if (interleaved && repeats < 2) {
    fail("num_pipeline_repeats", "at least 2 chunks per stage rank with " + schedule, repeat_setting,
         "set num_pipeline_repeats=2 or more, or pipeline_schedule=1f1b for one chunk per stage rank");
  }
  const bool one_f_one_b =
      kind == PipelineScheduleKind::one_f_one_b || kind == PipelineScheduleKind::zero_bubble;
  if (one_f_one_b && micro_batches < stages) {
    fail("gradient_accumulation_steps",
         "at least " + stage_setting + " micro-batches with " + schedule +
             " (the first stage rank runs mesh.stage forwards before its first backward)",
         micro_batch_setting,
         "set gradient_accumulation_steps=" + std::to_string(stages) +
             " or more, fewer stages (mesh.stage <= " + std::to_string(micro_batches) +
             "), or pipeline_schedule=gpipe");
  }
  if (interleaved && micro_batches % stages != 0) {
    const int64_t next_multiple = (micro_batches / stages + 1) * stages;
    fail("gradient_accumulation_steps",
         "a multiple of " + stage_setting + " with " + schedule +
             " (each chunk runs its forwards in rounds of mesh.stage micro-batches)",
         micro_batch_setting,
         "set gradient_accumulation_steps=" + std::to_string(next_multiple) +
             " (or another multiple of mesh.stage), or pipeline_schedule=1f1b");
  }
}

// One rank's compute ops in the 1F1B pattern (PipeDream-flush, Megatron): `warmup` forwards, then a forward
// and a backward in turn, then the backwards left. Everything rests on the order of `forwards` and
// `backwards`; a warm-up of every forward is GPipe. With split_backward each backward is B_input, and the
// W of backward slot k runs right after B_input of slot k + weight_delay (the last weight_delay W at the
// end): ZB-H1's deferral, see build_pipeline_schedule.
std::vector<PipelineOp> one_forward_one_backward(const std::vector<Slot>& forwards,
                                                 const std::vector<Slot>& backwards, int64_t warmup,
                                                 bool split_backward, int64_t weight_delay) {
  const int64_t count = static_cast<int64_t>(forwards.size());
  std::vector<PipelineOp> ops;
  int64_t weights_done = 0;
  const auto add_backward = [&](int64_t slot) {
    if (!split_backward) {
      ops.push_back(compute_op(PipelineOpKind::backward, backwards[slot]));
      return;
    }
    ops.push_back(compute_op(PipelineOpKind::backward_input, backwards[slot]));
    if (slot >= weight_delay)
      ops.push_back(compute_op(PipelineOpKind::backward_weight, backwards[weights_done++]));
  };
  for (int64_t slot = 0; slot < warmup; ++slot)
    ops.push_back(compute_op(PipelineOpKind::forward, forwards[slot]));
  for (int64_t slot = 0; slot < count - warmup; ++slot) {
    ops.push_back(compute_op(PipelineOpKind::forward, forwards[warmup + slot]));
    add_backward(slot);
  }
  for (int64_t slot = count - warmup; slot < count; ++slot) add_backward(slot);
  while (split_backward && weights_done < count) {
    ops.push_back(compute_op(PipelineOpKind::backward_weight, backwards[weights_done++]));
  }
  return ops;
}

// The forward (or backward) slots of rank `rank` in Megatron's interleaved order: rounds of P micro-batches,
// each round through the rank's chunks in turn (forward: first chunk first; backward: last chunk first).
std::vector<Slot> interleaved_slots(int64_t stages, int64_t micro_batches, int64_t repeats, int64_t rank,
                                    bool backward) {
  std::vector<Slot> slots;
  for (int64_t slot = 0; slot < micro_batches * repeats; ++slot) {
    const int64_t round = slot / (stages * repeats), in_round = slot % (stages * repeats);
    const int64_t local_chunk = backward ? repeats - 1 - in_round / stages : in_round / stages;
    slots.push_back({round * stages + in_round % stages, local_chunk * stages + rank});
  }
  return slots;
}

// The tensor a compute op reads from a neighbouring chunk, or makes for one: the payload, the chunk that
// made it and the rank of the other chunk. Only a remote one (P > 1) is sent.
struct Transfer {
  bool exists = false;
  bool remote = false;
  PipelinePayload payload = PipelinePayload::activation;
  int64_t chunk = 0;  // the producing chunk
  int64_t peer = -1;
};

Transfer input_transfer(const PipelineSchedule& schedule, const PipelineOp& op, int64_t rank) {
  const bool backward = op.kind == PipelineOpKind::backward || op.kind == PipelineOpKind::backward_input;
  if (op.kind == PipelineOpKind::forward && op.chunk > 0) {
    const int64_t peer = schedule.rank_of_chunk(op.chunk - 1);
    return {true, peer != rank, PipelinePayload::activation, op.chunk - 1, peer};
  }
  if (backward && op.chunk + 1 < schedule.chunks()) {
    const int64_t peer = schedule.rank_of_chunk(op.chunk + 1);
    return {true, peer != rank, PipelinePayload::gradient, op.chunk + 1, peer};
  }
  return {};
}

Transfer output_transfer(const PipelineSchedule& schedule, const PipelineOp& op, int64_t rank) {
  const bool backward = op.kind == PipelineOpKind::backward || op.kind == PipelineOpKind::backward_input;
  if (op.kind == PipelineOpKind::forward && op.chunk + 1 < schedule.chunks()) {
    const int64_t peer = schedule.rank_of_chunk(op.chunk + 1);
    return {true, peer != rank, PipelinePayload::activation, op.chunk, peer};
  }
  if (backward && op.chunk > 0) {
    const int64_t peer = schedule.rank_of_chunk(op.chunk - 1);
    return {true, peer != rank, PipelinePayload::gradient, op.chunk, peer};
  }
  return {};
}

PipelineOp transfer_op(PipelineOpKind kind, const PipelineOp& compute, const Transfer& transfer) {
  return {kind, compute.micro_batch, transfer.chunk, transfer.payload, transfer.peer};
}

// A rank's compute ops with its sends and receives: a send right after the op that produced the tensor,
// a receive one compute op ahead of the op that reads it, so that the transfer overlaps that op. Except an
// activation's receive ahead of a W: the received activation takes the forward's activation slot, and the W
// frees one only when it ends (its micro-batch's slot is held until then), so received ahead of it the stage
// would hold a slot more than ZB-H1's micro-batches; it is received right before its forward instead.
std::vector<PipelineOp> with_transfers(const PipelineSchedule& schedule,
                                       const std::vector<PipelineOp>& computes, int64_t rank) {
  std::vector<std::vector<PipelineOp>> receives_before(computes.size());
  for (size_t index = 0; index < computes.size(); ++index) {
    const Transfer input = input_transfer(schedule, computes[index], rank);
    if (!input.remote) continue;
    const bool after_weights = index > 0 && input.payload == PipelinePayload::activation &&
                               computes[index - 1].kind == PipelineOpKind::backward_weight;
    receives_before[index == 0 || after_weights ? index : index - 1].push_back(
        transfer_op(PipelineOpKind::receive, computes[index], input));
  }
  std::vector<PipelineOp> ops;
  for (size_t index = 0; index < computes.size(); ++index) {
    ops.insert(ops.end(), receives_before[index].begin(), receives_before[index].end());
    ops.push_back(computes[index]);
    const Transfer output = output_transfer(schedule, computes[index], rank);
    if (output.remote) ops.push_back(transfer_op(PipelineOpKind::send, computes[index], output));
  }
  return ops;
}

}  // namespace

PipelineSchedule build_pipeline_schedule(PipelineScheduleKind kind, int64_t stages, int64_t micro_batches,
                                         int64_t repeats) {
  check_schedule_shape(kind, stages, micro_batches, repeats);
  PipelineSchedule schedule{kind, stages, micro_batches, repeats, {}};
  for (int64_t rank = 0; rank < stages; ++rank) {
    std::vector<PipelineOp> computes;
    if (kind == PipelineScheduleKind::interleaved_one_f_one_b) {
      // Megatron's forward_backward_pipelining_with_interleaving (and torchtitan's Interleaved1F1B). The
      // last rank runs the first V - 1 rounds of forwards (every chunk but its last) before its first
      // backward can exist; each hop up the pipeline adds 2 chunk-forwards, the time the first backward
      // takes to come back one hop. Megatron runs every forward first when M = P; torchtitan keeps the
      // formula, as here: the simulated bubble is the same, the later ranks hold fewer activations, and the
      // non-blocking transfers need no other order.
      const int64_t total = micro_batches * repeats;
      const int64_t warmup = std::min(2 * (stages - rank - 1) + (repeats - 1) * stages, total);
      computes = one_forward_one_backward(interleaved_slots(stages, micro_batches, repeats, rank, false),
                                          interleaved_slots(stages, micro_batches, repeats, rank, true),
                                          warmup, false, 0);
    } else {
      std::vector<Slot> slots;
      for (int64_t micro = 0; micro < micro_batches; ++micro) slots.push_back({micro, rank});
      if (kind == PipelineScheduleKind::gpipe) {
        // Every forward, then every backward in micro-batch order (torchtitan's ScheduleGPipe).
        computes = one_forward_one_backward(slots, slots, micro_batches, false, 0);
      } else {
        // 1F1B (PipeDream-flush, Megatron's non-interleaved schedule): rank s's first backward waits for
        // micro-batch 0 to reach the last rank and come back P - 1 - s hops; P - 1 - s forwards ahead (and
        // the first steady forward) fill that wait, and after it each backward frees a micro-batch before
        // the next forward: at most P - s held. ZB-H1 keeps this placement and splits each backward:
        // B_input is what the rank before waits for, W nobody waits for. Rank s's last backward ends s
        // backwards before rank 0's (the last micro-batch still has s hops to go), an idle tail 1F1B leaves
        // there; deferring rank s's W by s backward slots moves s of them into that tail, and until then
        // the B_input wave runs up the pipeline without W in its way: the bubble becomes
        // (P - 1)(F + B_input - W) while W <= B_input (Qi et al. 2023, ZB-H1, Figure 3; torchtitan's ZB1P
        // with one chunk per rank). Rank s then keeps up to s W's inputs beside its P - s micro-batches: the
        // peak over ranks stays 1F1B's, P micro-batches on rank 0.
        const bool zero_bubble = kind == PipelineScheduleKind::zero_bubble;
        computes = one_forward_one_backward(slots, slots, stages - 1 - rank, zero_bubble, rank);
      }
    }
    schedule.ranks.push_back(with_transfers(schedule, computes, rank));
  }
  return schedule;
}

std::string pipeline_op_text(const PipelineOp& op, int64_t repeats) {
  const std::string chunk = "c" + std::to_string(op.chunk);
  const std::string micro = std::to_string(op.micro_batch);
  const char payload = op.payload == PipelinePayload::activation ? 'A' : 'G';
  switch (op.kind) {
    case PipelineOpKind::forward:
      return "F" + micro + (repeats > 1 ? chunk : "");
    case PipelineOpKind::backward:
      return "B" + micro + (repeats > 1 ? chunk : "");
    case PipelineOpKind::backward_input:
      return "I" + micro + (repeats > 1 ? chunk : "");
    case PipelineOpKind::backward_weight:
      return "W" + micro + (repeats > 1 ? chunk : "");
    case PipelineOpKind::send:
      return std::string("s") + payload + micro + chunk + ">" + std::to_string(op.peer);
    case PipelineOpKind::receive:
      return std::string("r") + payload + micro + chunk + "<" + std::to_string(op.peer);
  }
  return "?";
}

std::string format_pipeline_schedule(const PipelineSchedule& schedule, bool with_transfers) {
  std::string text;
  for (size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    text += "rank " + std::to_string(rank) + ":";
    for (const PipelineOp& op : schedule.ranks[rank]) {
      if (with_transfers || op.is_compute()) text += " " + pipeline_op_text(op, schedule.repeats);
    }
    text += "\n";
  }
  return text;
}

PipelineOpTimes equal_chunk_op_times(int64_t chunks, double forward, double backward_input,
                                     double backward_weight, double transfer) {
  const size_t count = static_cast<size_t>(chunks);
  return {std::vector<double>(count, forward), std::vector<double>(count, backward_input + backward_weight),
          std::vector<double>(count, backward_input), std::vector<double>(count, backward_weight), transfer};
}

namespace {

// A transfer's identity, the same on its send and its receive.
struct TransferKey {
  PipelinePayload payload = PipelinePayload::activation;
  int64_t micro_batch = 0, chunk = 0, from = 0, to = 0;
  auto operator<=>(const TransferKey&) const = default;
};

struct ComputeKey {
  PipelineOpKind kind = PipelineOpKind::forward;
  int64_t micro_batch = 0, chunk = 0;
  auto operator<=>(const ComputeKey&) const = default;
};

std::string payload_text(const TransferKey& key) {
  return std::string(key.payload == PipelinePayload::activation ? "activation" : "gradient") +
         " of micro-batch " + std::to_string(key.micro_batch) + " from chunk " + std::to_string(key.chunk);
}

// One rank's progress through its list.
struct RankState {
  size_t next = 0;                    // the next op of its list
  double clock = 0;                   // when it is free: the end of its last compute op
  double first_start = -1;            // its first compute op's start
  std::map<ComputeKey, double> done;  // compute ops run, to their end
  std::map<TransferKey, double> receives_started;
  std::set<TransferKey> receives_read;
  int64_t held = 0, held_before_input_gradient = 0;
  PipelineRankSimulation result;
};

class Simulator {
 public:
  Simulator(const PipelineSchedule& schedule, const PipelineOpTimes& times)
      : schedule_(schedule), times_(times), ranks_(schedule.ranks.size()) {}

  PipelineSimulation run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (size_t rank = 0; rank < ranks_.size(); ++rank) {
        while (ranks_[rank].next < schedule_.ranks[rank].size() && step(rank)) progress = true;
      }
    }
    report_deadlock();
    check_every_transfer_used();
    return summary();
  }

 private:
  const PipelineSchedule& schedule_;
  const PipelineOpTimes& times_;
  std::vector<RankState> ranks_;
  std::map<TransferKey, double> sends_started_;

  [[noreturn]] void fail_at(size_t rank, size_t index, const std::string& found) const {
    fail("pipeline schedule (" + std::string(pipeline_schedule_name(schedule_.kind)) + ", rank " +
             std::to_string(rank) + ", op " + std::to_string(index) + " " +
             pipeline_op_text(schedule_.ranks[rank][index], schedule_.repeats) + ")",
         "ops that read only what an earlier op or a matched send produced, each tensor sent and received "
         "once",
         found, "the schedule's order is wrong: a bug in its builder (plan/pipeline_schedule.cpp)");
  }

  TransferKey key_of(size_t rank, const PipelineOp& op) const {
    const int64_t self = static_cast<int64_t>(rank);
    return op.kind == PipelineOpKind::send ? TransferKey{op.payload, op.micro_batch, op.chunk, self, op.peer}
                                           : TransferKey{op.payload, op.micro_batch, op.chunk, op.peer, self};
  }

  // When the tensor `op` reads has arrived, or -1 while its send has not started yet.
  double input_ready(size_t rank, size_t index) const {
    const RankState& state = ranks_[rank];
    const PipelineOp& op = schedule_.ranks[rank][index];
    const auto finished = [&](PipelineOpKind kind, int64_t chunk) {
      const auto it = state.done.find({kind, op.micro_batch, chunk});
      return it == state.done.end() ? -1.0 : it->second;
    };
    // What the op itself saved: B and B_input read F's activations, W reads B_input's output gradients.
    if (op.kind == PipelineOpKind::backward || op.kind == PipelineOpKind::backward_input) {
      if (finished(PipelineOpKind::forward, op.chunk) < 0) fail_at(rank, index, "no forward of it before it");
    }
    if (op.kind == PipelineOpKind::backward_weight &&
        finished(PipelineOpKind::backward_input, op.chunk) < 0) {
      fail_at(rank, index, "no B_input of it before it");
    }
    const Transfer input = input_transfer(schedule_, op, static_cast<int64_t>(rank));
    if (!input.exists) return 0;
    if (!input.remote) {
      // The neighbouring chunk is on this rank (P = 1): its op must have run earlier in this list.
      const PipelineOpKind producer =
          input.payload == PipelinePayload::activation
              ? PipelineOpKind::forward
              : (schedule_.kind == PipelineScheduleKind::zero_bubble ? PipelineOpKind::backward_input
                                                                     : PipelineOpKind::backward);
      const double end = finished(producer, input.chunk);
      if (end < 0)
        fail_at(rank, index,
                "its input from chunk " + std::to_string(input.chunk) + " not computed before it");
      return end;
    }
    const TransferKey key{input.payload, op.micro_batch, input.chunk, input.peer, static_cast<int64_t>(rank)};
    const auto received = state.receives_started.find(key);
    if (received == state.receives_started.end()) {
      fail_at(rank, index, "no receive of the " + payload_text(key) + " before it");
    }
    const auto sent = sends_started_.find(key);
    if (sent == sends_started_.end()) return -1;
    return std::max(sent->second, received->second) + times_.transfer;
  }

  double duration(const PipelineOp& op) const {
    const size_t chunk = static_cast<size_t>(op.chunk);
    switch (op.kind) {
      case PipelineOpKind::forward:
        return times_.forward[chunk];
      case PipelineOpKind::backward:
        return times_.backward[chunk];
      case PipelineOpKind::backward_input:
        return times_.backward_input[chunk];
      case PipelineOpKind::backward_weight:
        return times_.backward_weight[chunk];
      case PipelineOpKind::send:
      case PipelineOpKind::receive:
        break;
    }
    return 0;
  }

  void count_activations(RankState& state, PipelineOpKind kind) {
    const bool frees_all = kind == PipelineOpKind::backward || kind == PipelineOpKind::backward_weight;
    const bool frees_forward_saves =
        kind == PipelineOpKind::backward || kind == PipelineOpKind::backward_input;
    if (kind == PipelineOpKind::forward) {
      state.result.peak_activations = std::max(state.result.peak_activations, ++state.held);
      state.result.peak_activations_before_input_gradient =
          std::max(state.result.peak_activations_before_input_gradient, ++state.held_before_input_gradient);
    }
    if (frees_all) --state.held;
    if (frees_forward_saves) --state.held_before_input_gradient;
  }

  // Runs rank's next op; false while it waits for another rank.
  bool step(size_t rank) {
    RankState& state = ranks_[rank];
    const size_t index = state.next;
    const PipelineOp& op = schedule_.ranks[rank][index];
    if (op.kind == PipelineOpKind::send || op.kind == PipelineOpKind::receive) {
      if (op.peer < 0 || op.peer >= static_cast<int64_t>(ranks_.size()) ||
          op.peer == static_cast<int64_t>(rank)) {
        fail_at(rank, index, "a peer that is not another stage rank");
      }
      const TransferKey key = key_of(rank, op);
      auto& started = op.kind == PipelineOpKind::send ? sends_started_ : state.receives_started;
      if (!started.emplace(key, state.clock).second) fail_at(rank, index, "the same transfer started twice");
      ++state.next;
      return true;
    }
    if (op.chunk < 0 || op.chunk >= schedule_.chunks() ||
        schedule_.rank_of_chunk(op.chunk) != static_cast<int64_t>(rank) || op.micro_batch < 0 ||
        op.micro_batch >= schedule_.micro_batches) {
      fail_at(rank, index, "a micro-batch or chunk this rank does not hold");
    }
    const double ready = input_ready(rank, index);
    if (ready < 0) return false;
    const double start = std::max(state.clock, ready);
    state.clock = start + duration(op);
    if (state.first_start < 0) state.first_start = start;
    if (!state.done.emplace(ComputeKey{op.kind, op.micro_batch, op.chunk}, state.clock).second) {
      fail_at(rank, index, "the same op twice");
    }
    const Transfer input = input_transfer(schedule_, op, static_cast<int64_t>(rank));
    if (input.remote) {
      state.receives_read.insert(
          {input.payload, op.micro_batch, input.chunk, input.peer, static_cast<int64_t>(rank)});
    }
    state.result.busy_seconds += duration(op);
    count_activations(state, op.kind);
    ++state.next;
    return true;
  }

  void report_deadlock() const {
    std::string blocked;
    for (size_t rank = 0; rank < ranks_.size(); ++rank) {
      const size_t index = ranks_[rank].next;
      if (index == schedule_.ranks[rank].size()) continue;
      const PipelineOp& op = schedule_.ranks[rank][index];
      const Transfer input = input_transfer(schedule_, op, static_cast<int64_t>(rank));
      blocked +=
          (blocked.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) + " at op " +
          std::to_string(index) + " " + pipeline_op_text(op, schedule_.repeats) + " waits for the " +
          payload_text({input.payload, op.micro_batch, input.chunk, input.peer, static_cast<int64_t>(rank)}) +
          ", which rank " + std::to_string(input.peer) + " never sends";
    }
    if (!blocked.empty()) {
      fail("pipeline schedule (" + std::string(pipeline_schedule_name(schedule_.kind)) + ")",
           "every receive's send reached (no deadlock)", blocked,
           "the schedule's order is wrong: a bug in its builder (plan/pipeline_schedule.cpp)");
    }
  }

  void check_every_transfer_used() const {
    for (size_t rank = 0; rank < ranks_.size(); ++rank) {
      for (size_t index = 0; index < schedule_.ranks[rank].size(); ++index) {
        const PipelineOp& op = schedule_.ranks[rank][index];
        if (op.is_compute()) continue;
        const TransferKey key = key_of(rank, op);
        if (op.kind == PipelineOpKind::send &&
            !ranks_[static_cast<size_t>(op.peer)].receives_started.contains(key)) {
          fail_at(rank, index, "no receive of it on rank " + std::to_string(op.peer));
        }
        if (op.kind == PipelineOpKind::receive && !sends_started_.contains(key)) {
          fail_at(rank, index, "no send of it on rank " + std::to_string(op.peer));
        }
        if (op.kind == PipelineOpKind::receive && !ranks_[rank].receives_read.contains(key)) {
          fail_at(rank, index, "no op that reads it");
        }
      }
    }
  }

  PipelineSimulation summary() {
    PipelineSimulation simulation;
    double first_start = std::numeric_limits<double>::infinity(), last_end = 0;
    for (const RankState& state : ranks_) {
      if (state.first_start < 0) continue;  // no compute ops
      first_start = std::min(first_start, state.first_start);
      last_end = std::max(last_end, state.clock);
    }
    simulation.makespan_seconds = last_end > first_start ? last_end - first_start : 0;
    for (RankState& state : ranks_) {
      PipelineRankSimulation& result = state.result;
      result.idle_seconds = simulation.makespan_seconds - result.busy_seconds;
      result.bubble_fraction =
          simulation.makespan_seconds > 0 ? result.idle_seconds / simulation.makespan_seconds : 0;
      simulation.max_bubble_fraction = std::max(simulation.max_bubble_fraction, result.bubble_fraction);
      simulation.ranks.push_back(result);
    }
    return simulation;
  }
};

}  // namespace

PipelineSimulation simulate_pipeline_schedule(const PipelineSchedule& schedule,
                                              const PipelineOpTimes& times) {
  const size_t chunks = static_cast<size_t>(schedule.chunks());
  for (const std::vector<double>* per_chunk :
       {&times.forward, &times.backward, &times.backward_input, &times.backward_weight}) {
    if (per_chunk->size() != chunks) {
      fail("pipeline op times", std::to_string(chunks) + " seconds per op kind (one per chunk: P x V)",
           std::to_string(per_chunk->size()), "give every op kind one time per global chunk");
    }
  }
  return Simulator(schedule, times).run();
}

}  // namespace meshtrain
