// The live engine: plans the run with the same plan_training() as `meshtrain compile`, allocates exactly
// the planned arena, initialises parameters from the counter-based RNG, and runs the step's planned program
// (plan/program.h): the kernels of shared/specs/training-step.md (fwd_bwd, fwd_bwd_accum, update, eval), or a
// pipeline schedule's split kernels (zero_gradients, forward and backward, or zero_bubble's backward_input
// and backward_weight, over activation slots), each in the planned op order, each op seeing its buffers at
// their planned offsets. A decode plan (plan/decode.h) runs the same way: its one kernel, decode, over an
// arena of parameter values, caches and scratch.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/core/arena.h"
#include "meshtrain/data/batch.h"
#include "meshtrain/model/parameter_store.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/runtime/transfers.h"

namespace meshtrain {

class TraceRecorder;

struct UpdateResult {
  double raw_grad_norm = 0.0;  // of the token-averaged gradient, before clipping
  double grad_norm = 0.0;      // after clipping
  bool nonfinite = false;      // a gradient was NaN or infinite on some rank: parameters were left unchanged
};

// The Batch of one micro-batch of the step (ProgramEntry::micro_batch), asked for when its entry runs.
using MicroBatchSource = std::function<Batch(int64_t micro_batch)>;

// What a program's entries read: their micro-batches, and the update's arguments (Engine::update).
struct ProgramInputs {
  MicroBatchSource micro_batch;  // for entries that read a batch
  int64_t valid_count = 0;       // this rank's valid-token count over the step's micro-batches
  double learning_rate = 0.0;
  int64_t step = 0;
};

struct ProgramResult {
  LossSums sums;        // added over the entries, in their order
  UpdateResult update;  // the update entry's
};

// A plan this engine can run on `world` processes: one device per process, float32 storage, an arena
// within the device's memory, and a device kind whose backend runs here: cpu, or an NVIDIA GPU topology
// (h100xN, h200xN, ...) where this build has CUDA and a GPU is visible, for what the cuda kernels cover
// (no mixture of experts, MLA, Engram or mHC, tensor or context parallelism yet), and at most one process
// per GPU of this host unless share_gpus (`host_ranks`: the processes on this host; 0 where not known, as
// inside the engine). A MeshError naming the key otherwise.
void check_plan_runs_here(const TrainingPlan& plan, int64_t world, int64_t host_ranks = 0);

// The part of check_plan_runs_here that asks the device itself (the backend's device_resources), apart so
// that it is tested without one: the plan's arena plus what the process holds beside it within the device's
// free memory now (unchecked where free_bytes is 0: the host), and a bfloat16 compute dtype only on a device
// that runs it (a decode plan computes in float32). A MeshError naming the device, the numbers and the fix.
void check_device_runs_plan(const TrainingPlan& plan, const kernels::DeviceResources& device);

// The ranks a live run spans: the world and one communicator per mesh axis (null members: one process).
struct EngineRanks {
  Communicator* world = nullptr;
  MeshCommunicators* axes = nullptr;
};

class Engine {
 public:
  // Plans the config for one process, checks that the CPU kernels can run it, allocates the arena and
  // initialises parameters.
  explicit Engine(const Config& config);
  // Runs an existing plan (training, or plan_decode's) on this rank of `ranks` (one process when empty).
  explicit Engine(TrainingPlan plan, EngineRanks ranks = {});
  ~Engine();
  Engine(Engine&&) = default;

  // Runs a phase of the plan's program (plan().program.gradients, .update or .eval) in its order: each
  // kernel on its micro-batch's Batch; the entry marked last_backward starts the data-axis reductions.
  ProgramResult run_program(const std::vector<ProgramEntry>& entries, const ProgramInputs& inputs);
  // The kernels one at a time (what run_program calls, and tests). First micro-batch: WRITES the gradients;
  // later ones ADD into them. On the last micro-batch of a step (`last`), the data-axis gradient reductions
  // of update start, bucketed and non-blocking, as soon as their gradients are final, and update waits for
  // them (training-step.md's overlap).
  LossSums fwd_bwd(const Batch& batch, bool last = false);
  LossSums fwd_bwd_accum(const Batch& batch, bool last = false);
  // Reduces gradients over the data axis, sums the valid-token counts of the ranks (`valid_count` is this
  // rank's), divides, clips by the global norm and steps AdamW; skips the step everywhere when any
  // gradient is non-finite. `step` is 0-based; Adam's bias correction uses step + 1.
  UpdateResult update(int64_t valid_count, double learning_rate, int64_t step);
  // Forward and loss only; a stage plan's in activation `slot` (its received activation is there), on the
  // last stage with the loss.
  LossSums eval(const Batch& batch, int64_t slot = ProgramEntry::kNoSlot, int64_t chunk = 0);
  // The split kernels (a plan with activation slots, PlanRequest::activation_slots): a micro-batch's
  // fwd_bwd_accum as two kernels, so a pipeline schedule can run other micro-batches' kernels between them.
  // zero_gradients starts a step (what fwd_bwd's first op does); forward loads `batch` and leaves what its
  // backward reads in activation slot `slot`; backward(slot) reads it from there, ADDS into the gradients
  // and frees the slot. Their data-axis reductions run in update (no overlap with the last backward).
  // `chunk`: the spec's chunk they run (a pipeline stage with virtual stages holds several); `micro_batch`
  // names what a slot holds: a backward must be of the micro-batch and chunk whose forward filled its slot.
  // zero_bubble (PlanRequest::split_backward) runs backward as backward_input, the input gradients (what the
  // previous stage waits for), then later backward_weight, the weight gradients, which frees the slot.
  void zero_gradients();
  LossSums forward(const Batch& batch, int64_t slot, int64_t chunk = 0, int64_t micro_batch = 0);
  LossSums backward(int64_t slot, int64_t chunk = 0, int64_t micro_batch = 0);
  LossSums backward_input(int64_t slot, int64_t chunk = 0, int64_t micro_batch = 0);
  LossSums backward_weight(int64_t slot, int64_t chunk = 0, int64_t micro_batch = 0);
  // A decode plan's step (plan/decode.h): `token` at `position` (both checked by the caller) joins the
  // caches; returns the next token's logits [1, V], valid until the next call. Models with Engram: the
  // token's hash ids per Engram layer ([H (N - 1)] each, data/engram_hash.h's last_token_ids).
  TensorView decode(int32_t token, int32_t position,
                    const std::vector<std::vector<int32_t>>& engram_hash_ids = {});

  const ModelSpec& spec() const { return plan_.spec; }
  // The parameters' stored values (this rank's shards under FSDP), by index or checkpoint name.
  const ParameterStore& parameters() const { return parameters_; }
  ParameterStore& parameters() { return parameters_; }
  const TrainingPlan& plan() const { return plan_; }
  // The kernels and memory this engine runs on (the plan's backend: cpu, or cuda on a GPU).
  const kernels::KernelBackend& backend() const { return *plan_.spec.kernels; }
  // A device arena is not host-addressable: checkpoints read and write a host copy of the persistent
  // region (parameters, moments) through local_shard / scatter_global, brought over by these two (no-ops
  // when the arena is host memory). Savers call persistent_to_host first; loaders call it first and
  // persistent_to_device last.
  void persistent_to_host() const;
  void persistent_to_device();
  // Frees the host copy once a save has read it (persistent_to_device frees it after a load), so a GPU
  // run does not hold a second copy of its parameters and moments in host memory between checkpoints.
  void release_host_copy() const;
  // Host bytes the copy holds now: 0 outside a save or load, and always with a host arena.
  size_t host_copy_bytes() const { return host_persistent_.capacity(); }
  // A persistent buffer (parameters, gradients, optimizer state, batch), or a temporary's last value in
  // the kernel that ran last when nothing after it reused its memory (checked). Its data is device memory
  // under a device backend: read it with read().
  TensorView view(BufferId id) const;
  // view(id)'s values copied to the host as float32 (a float32 buffer).
  std::vector<float> read(BufferId id) const;
  size_t arena_bytes() const { return arena_.bytes(); }
  // Tests: fill the temporary region with NaN before every kernel, so an op that reads what it did not
  // declare (or what no earlier op wrote) shows up in the results.
  void set_poison_temporaries(bool poison) { poison_temporaries_ = poison; }
  // After a step: each MoE layer's selection bias moves by rate * sign(mean load - load) per expert, from
  // `expert_load` [moe layers, E] counted over the whole global batch (RoutingSums, summed over ranks), so
  // every rank moves its shard of the same global bias alike.
  void update_selection_biases(const std::vector<double>& expert_load, double rate);
  // Checkpoints hold global (unsharded) tensors, so they load on any mesh. For a parameter's value or
  // optimizer moment (by its spec id): the global shape, and setting this rank's elements from a whole tensor
  // (single-file checkpoints). A pipeline stage's stacked parameter spans the layers its chunk holds of its
  // scan group (the checkpoint layout places them at their offset in the group).
  std::vector<int64_t> global_shape(BufferId id) const;
  void scatter_global(BufferId id, const float* global);
  // The spec of the whole model at this engine's mesh: spec() itself, or on a pipeline stage (whose spec
  // holds its chunk) every stage's layers, built once on first use; for what spans every stage (the
  // tensors a checkpoint holds, the parameter count). Its parameters' global shapes are
  // global_dims(plan(), shape), as global_shape's.
  const ModelSpec& whole_model() const;
  // Elements of every parameter of the whole model at its global shape (spec().parameter_count() counts
  // this device's compute shapes, which tensor parallelism splits, and a stage's chunk only).
  int64_t global_parameter_count() const;
  // This rank's part of a parameter's value or moment: the box of the global tensor it holds, row-major at
  // `data`, and whether this rank is the one replica that saves it (coordinate 0 on every mesh axis the
  // buffer is not split over, and the first of replicated kv heads). Distributed checkpoints write and read
  // these boxes directly, without gathering.
  struct LocalShard {
    float* data = nullptr;
    std::vector<int64_t> offsets, dims;  // into the global shape, per dim
    bool saving_replica = false;
  };
  LocalShard local_shard(BufferId id) const;
  Communicator* world() const { return ranks_.world; }                      // null: one process
  bool lead() const { return !ranks_.world || ranks_.world->rank() == 0; }  // the rank that writes files
  // Payload bytes per rank the kernels moved since the last reset, per mesh axis of more than one rank
  // (aot-plan.md definitions; comparable with the plan's collective bytes).
  std::map<std::string, double> collective_bytes() const;
  void reset_collective_stats();
  // A step that will not reach update (a non-finite loss): waits for the reductions its last micro-batch
  // started, so nothing reuses their buffers while they are in flight.
  void abandon_step();
  // Test hook (MESHTRAIN_FAULT=nan_gradient): the next last backward (fwd_bwd / fwd_bwd_accum with `last`)
  // leaves a NaN in a gradient.
  void inject_nan_gradient() { nan_gradient_pending_ = true; }
  // Re-initialises every parameter from (init_weights_seed, canonical name, element index); zeroes moments.
  void initialize_parameters();
  // Ops are recorded as trace events while the recorder is active (profiler=trace); null: off.
  void set_trace(TraceRecorder* trace) { trace_ = trace; }

 private:
  friend class PlannedOpContext;
  void load_batch(const Batch& batch);
  TensorView batch_view(BufferId input) const;
  TensorView stashed_view(const ActivationStash::Entry& entry, int64_t slot) const;
  void check_slot(int64_t slot) const;
  void start_transfer(const ProgramEntry& entry);
  LossSums with_batch_valid_count(LossSums sums, const Batch& batch) const;
  LossSums run(KernelName kernel, UpdateState* update = nullptr);
  void run_collective(const PlanOp& op, const OpContext& context, UpdateState* update);
  void start_ready_collectives(KernelName kernel, size_t op_index, bool kernel_done);
  Communicator& communicator(MeshAxis axis) const;
  std::optional<kernels::ContextRing> context_ring();
  PlanBufferId stored_buffer(BufferId id) const;  // where a parameter's value or moment persists
  std::byte* host_address(size_t offset) const;   // a persistent byte, in the arena or its host copy
  void copy_in(const TensorView& to, const void* from, size_t bytes);
  GlobalIndex global_index(PlanBufferId stored, BufferId id) const;
  // Whether `id` is a pipeline's tied embedding table or one of its moments.
  bool tied_table_state(BufferId id) const;

  TrainingPlan plan_;
  mutable std::optional<ModelSpec> whole_model_;  // a pipeline stage's: whole_model()
  Arena arena_;
  mutable std::vector<std::byte> host_persistent_;  // device arenas: the persistent region's host copy
  ParameterStore parameters_;                       // views into arena_
  TraceRecorder* trace_ = nullptr;
  const KernelPlan* last_kernel_ = nullptr;
  bool poison_temporaries_ = false;
  EngineRanks ranks_;
  MeshCoordinates coordinates_;  // this rank's place on the mesh
  // tensor > 1: the vocab-parallel loss's mid-kernel reductions
  std::optional<kernels::TensorGroup> tensor_group_;
  std::unique_ptr<Communicator> kv_replica_group_;  // tensor > kv heads: the ranks holding the same kv head
  std::unique_ptr<Communicator> pipeline_ends_group_;  // mesh.stage > 2: the first and last stage ranks
  std::vector<std::unique_ptr<CollectiveRequest>> ring_passes_;  // ring attention's, not yet waited for
  Transfers transfers_;                                          // send_recv ops' transfers in flight
  Transfers pipeline_transfers_;  // a pipeline program's, across its kernels until its phase ends
  std::vector<size_t> bucket_;    // update op indices ready (plan_.overlap), not yet started
  size_t bucket_bytes_ = 0;
  std::map<size_t, std::unique_ptr<CollectiveRequest>> in_flight_;  // update op index -> started reduction
  bool overlap_ = false;  // this kernel is a step's last micro-batch
  bool nan_gradient_pending_ = false;
  // The activation slot the running split kernel binds its stash to (ProgramEntry::kNoSlot: none), and
  // which (micro-batch, chunk) each slot holds and how far it is: its forward run (its backward or B_input
  // to come), or its B_input run (its W to come: zero_bubble holds the slot until then).
  int64_t slot_ = ProgramEntry::kNoSlot;
  int64_t chunk_ = 0;  // the running kernel's chunk of the spec
  enum class SlotState { free, forward_done, input_gradients_done };
  struct SlotHolder {
    int64_t micro_batch = ProgramEntry::kNoMicroBatch;
    int64_t chunk = 0;
    SlotState state = SlotState::free;
  };
  std::vector<SlotHolder> slot_holders_;
  LossSums run_in_slot(KernelName kernel, int64_t slot, int64_t chunk, int64_t micro_batch,
                       SlotState expected, SlotState after);
};

}  // namespace meshtrain
