// The step as a planned program (DESIGN.md principle 2): which kernel runs, for which micro-batch, in which
// order. The engine walks it (Engine::run_program); the run loop decides no kernel order.
#pragma once

#include <cstdint>
#include <vector>

namespace meshtrain {

enum class KernelName;

// One kernel invocation of the program.
struct ProgramEntry {
  static constexpr int64_t kNoMicroBatch = -1;
  KernelName kernel{};
  int64_t micro_batch = kNoMicroBatch;  // the micro-batch whose Batch it reads; update reads none
  // The layer chunk the kernel runs (shared/specs/pipeline.md: a pipeline stage rank holds one chunk or, with
  // virtual stages, several); 0 today: one chunk, the whole model.
  int64_t chunk = 0;
  // The step's last backward: the data-axis gradient reductions of update start during it, bucketed and
  // non-blocking, as soon as their gradients are final, and update waits for them (training-step.md's
  // overlap).
  bool last_backward = false;
  // forward and backward (the split kernels; zero_bubble's backward_input and backward_weight): the
  // activation slot (TrainingPlan::stash) the forward of `micro_batch` leaves its activations in, and its
  // backward (or B_input, then W) reads them from. The split path's gradient
  // reductions run in update (last_backward stays false: no overlap).
  static constexpr int64_t kNoSlot = -1;
  int64_t slot = kNoSlot;
  // A pipeline schedule's point-to-point transfer with a neighbouring stage rank (`kernel` unused), started
  // non-blocking; a kernel op touching its memory waits for it, and the phase ends with none in flight.
  // The activation a forward left in its slot (pipeline/output) goes to the next stage, which receives it
  // into the slot its forward reads (chunk/input); the input gradient a backward left (pipeline/
  // input_gradient) goes back, received into the slot the previous stage's backward starts from
  // (pipeline/output_gradient).
  enum class Transfer { none, send_activation, receive_activation, send_gradient, receive_gradient };
  Transfer transfer = Transfer::none;
  int64_t peer = -1;  // the stage rank it goes to or comes from
};

// What a rank runs, in the phases the run sits between. The run keeps what must happen between the
// backward and the update (the loss sums agreed over every rank, where a non-finite one skips the update;
// fault injection; the learning rate), so the step is two phases the run calls in turn rather than one
// call with a hook into the run: the engine never calls back into the run mid-step, and a skipped step is
// simply an update phase not run (Engine::abandon_step waits for what the last backward started).
//
// A pipeline schedule (GPipe, 1F1B, interleaved, zero bubble) is another `gradients` list: zero_gradients,
// then forwards and backwards of micro-batches (the split kernels, each with its activation slot) over this
// rank's chunks, interleaved, with the sends and receives between stage ranks as send_recv ops of those
// kernels (the engine runs them non-blocking). Today every rank runs the same program; with a stage axis the
// plan holds one per stage rank.
struct StepProgram {
  std::vector<ProgramEntry> gradients;  // forward and backward of every micro-batch, accumulated
  std::vector<ProgramEntry> update;     // reductions, norm, clip, optimizer
  std::vector<ProgramEntry> eval;       // one eval batch: forward and loss of its micro-batches
};

// The program of a step of `gradient_accumulation_steps` micro-batches: fwd_bwd on the first (writing the
// gradients), fwd_bwd_accum on each later one (adding into them), the last of them the last backward; then
// update. Eval reads one micro-batch per eval batch (its loader does not accumulate).
StepProgram plan_step_program(int64_t gradient_accumulation_steps);

// The kernels `entries` run, each once, in their first use's order (transfers are none).
std::vector<KernelName> program_kernels(const std::vector<ProgramEntry>& entries);

}  // namespace meshtrain
