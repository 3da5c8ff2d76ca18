// The ahead-of-time plan (shared/specs/aot-plan.md): from (model config, mesh, topology, micro-batch), one
// plan per kernel (fwd_bwd, fwd_bwd_accum, update, eval; and for pipeline schedules, on request, the split
// kernels zero_gradients, forward and backward over activation slots) with the ordered ops (FLOPs, bytes,
// collective bytes per mesh axis, predicted time), every buffer with its kind, per-device shape, mesh axes
// and live ranges, arena offsets from a liveness-based allocator, and the memory figures. `meshtrain compile`
// and the live engine call the same plan_training(); the engine allocates exactly plan.arena_bytes and runs
// each kernel's op order, binding every buffer an op touches to the planned offset, in the order of the
// step's program (plan/program.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/mesh/sharding.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/plan/pipeline_schedule.h"
#include "meshtrain/plan/program.h"
#include "meshtrain/plan/topology.h"

namespace meshtrain {

// `decode` is the decode spec's one-token step (plan/decode.h); kKernelNames lists the training kernels.
// zero_gradients, forward and backward are a micro-batch's fwd_bwd_accum cut at its backward, for pipeline
// schedules (planned only with PlanRequest::activation_slots > 0; see ActivationStash); backward_input and
// backward_weight are that backward's two parts for zero_bubble (PlanRequest::split_backward): every op but
// the weight-gradient ones (OpDecl::weight_gradients_only and what reads their results), then those.
enum class KernelName {
  fwd_bwd,
  fwd_bwd_accum,
  update,
  eval,
  decode,
  zero_gradients,
  forward,
  backward,
  backward_input,
  backward_weight
};
inline constexpr std::array<KernelName, 4> kKernelNames = {KernelName::fwd_bwd, KernelName::fwd_bwd_accum,
                                                           KernelName::update, KernelName::eval};
const char* kernel_name(KernelName kernel);
// Parses "fwd_bwd" etc.; `where` names the config key or flag for the error.
KernelName parse_kernel_name(const std::string& name, const std::string& where);
// The kernels that run over a micro-batch's activation slot: forward, backward, backward_input and
// backward_weight.
bool runs_over_a_slot(KernelName kernel);

using PlanBufferId = int32_t;

// A buffer of the plan: the spec's buffers (same ids) and the plan's own (FSDP and ZeRO-1 shards, gathered
// copies), all at per-device sizes in their planned dtypes.
struct PlanBuffer {
  PlanBuffer() = default;
  PlanBuffer(std::string buffer_name, BufferKind buffer_kind, DType buffer_dtype, Shape local_shape,
             std::vector<DimSharding> dim_sharding)
      : name(std::move(buffer_name)),
        kind(buffer_kind),
        dtype(buffer_dtype),
        shape(std::move(local_shape)),
        sharding(std::move(dim_sharding)) {}

  std::string name;
  BufferKind kind = BufferKind::scratch;
  DType dtype = DType::f32;
  Shape shape;                        // per device
  std::vector<DimSharding> sharding;  // mesh axes of each dim
  size_t bytes = 0;
  bool persistent = false;  // lives across kernels (the arguments): one offset in the arena
  size_t offset = 0;        // persistent buffers: arena offset
  // A view inside another (persistent) buffer, `part_offset` bytes in: a layer's block of a stacked
  // parameter or of its FSDP shard; or (data_rank_slot) ZeRO-1's shard of a parameter, at this data rank's
  // slot (part_offset + data coordinate x bytes).
  PlanBufferId part_of = -1;
  size_t part_offset = 0;
  bool data_rank_slot = false;
  std::string layer;  // "decoder/layers_3", "token_embedder", ... for --explain
  // A pipeline boundary's tensor (chunk/input and PipelineBoundary's): it lives in the activation slots
  // (ActivationStash), where the transfers between stage ranks read and write it, never among a kernel's
  // temporaries nor in the persistent region.
  bool stashed = false;

  // Whether any dim is split over `axis` (else every rank of that axis holds the same values).
  bool split_over(MeshAxis axis) const {
    for (const DimSharding& dim : sharding) {
      for (MeshAxis split : dim.axes) {
        if (split == axis) return true;
      }
    }
    return false;
  }
};

// One live range of a temporary buffer inside one kernel: [first_op, last_op], at `offset` in the arena.
struct PlanValue {
  PlanBufferId buffer = -1;
  int32_t first_op = 0, last_op = 0;
  size_t offset = 0;
};

struct PlanOp {
  const OpDecl* op = nullptr;  // what runs (spec op, remat recompute, or the plan's own)
  bool recompute = false;      // a forward op run again before its block's backward (remat)
  double flops = 0.0;
  double bytes_accessed = 0.0;
  double collective_bytes = 0.0;  // payload bytes per rank (aot-plan.md definitions)
  double seconds = 0.0;           // predicted: roofline for compute, bytes / link bandwidth for collectives
  double share = 1.0;             // OpContext::share while it runs
  // The plan buffer and arena offset behind every buffer id the op touches (spec ids; under FSDP / ZeRO-1
  // a spec id may be bound to a shard).
  std::vector<std::pair<BufferId, PlanBufferId>> buffers;
  std::vector<size_t> offsets;  // parallel to `buffers`
};

// The logits an op's softmax passes over, counted once per GEMM pass (1 in eval, 3 with the gradient): the
// cross-entropy's (the loss op that reads the targets) op FLOPs / 2 D, as it declares 2 D FLOPs per logit and
// pass; 0 for every other op. The cost pass prices them at Topology::loss_softmax_logits (cost.cpp).
double loss_softmax_logit_passes(const ModelSpec& spec, const PlanOp& op);

struct MemoryFigures {
  size_t arguments = 0, outputs = 0, aliases = 0, temps = 0, peak = 0;
};

struct KernelPlan {
  KernelName kernel = KernelName::fwd_bwd;
  int64_t chunk = 0;  // the spec's chunk it runs (ModelSpec::chunks): a stage with virtual stages has several
  std::vector<PlanOp> ops;
  std::vector<PlanValue> values;  // temporaries' live ranges
  MemoryFigures memory;
  double flops = 0.0, bytes_accessed = 0.0, seconds = 0.0;
  std::map<std::string, double> collective_bytes;  // per mesh axis name
};

// What the plan depends on, as "key=value" lines (config keys plus derived inputs), and their hash.
struct PlanIdentity {
  std::vector<std::pair<std::string, std::string>> keys;
  std::string hash;  // 16 hex digits, FNV-1a 64 of the lines
};

// Where a parameter and its gradient accumulator persist: the spec's buffers, or (FSDP) the plan's shards;
// ZeRO-1's data shards view part of them during update.
struct ParameterStorage {
  PlanBufferId value_store = -1, gradient_store = -1;
  bool gathered = false;  // FSDP: the spec's value and gradient are per-layer temporaries
  PlanBufferId value_data_shard = -1, gradient_data_shard = -1;
  int64_t data_outer = 1;  // ZeRO-1: > 1 when the data shard is strided in the parameter
  // A stacked parameter: where each member's value and gradient persist (views of the stores' blocks),
  // parallel to ParameterDecl::members.
  std::vector<PlanBufferId> member_value_stores, member_gradient_stores;
};

// When the data-axis gradient reductions of update may start early, during the last micro-batch's backward
// (the engine starts them a bucket at a time and update waits for them instead of running them).
struct OverlapSchedule {
  // kernel (fwd_bwd, fwd_bwd_accum) -> op index -> indices of the update ops whose gradient is final after it
  std::map<KernelName, std::vector<std::vector<size_t>>> ready_after;
  size_t bucket_capacity = 0;  // bytes of gradients gathered before a bucket starts
};

// The split kernels' activation slots. forward and backward are fwd_bwd_accum's steps cut where its backward
// phase starts (so they run exactly its ops); what the forward leaves for the backward (every value live
// across the cut: the activations the remat policy saves, and the batch inputs the backward reads) must
// survive other micro-batches' kernels in between, so it lives in a stash instead of among either kernel's
// temporaries: one slot per micro-batch in flight, slot k at offset + k x slot_bytes, above the persistent
// region; the split kernels' temporaries sit above the last slot. A split kernel's binding at an offset
// inside slot 0 is a stash binding: the engine moves it to the slot its program entry names. The fused
// kernels' temporaries overlap the slots (no micro-batch is in flight while they run), so they and their
// plans do not change.
// With backward_input and backward_weight planned (zero_bubble), a slot also holds what B_input leaves for W:
// each value an input op writes and a weight op reads (a projection's output gradient, a recomputed layer
// input, a weight gradient under FSDP), and a copy of each value a weight op reads that a later input op
// adds into (the residual stream's gradient), taken where the weight op stood in the fused order; a slot is
// then held from F until W. Its layout is allocated over the parts' order: those take the place of forward
// values that only B_input reads.
struct ActivationStash {
  struct Entry {
    PlanBufferId buffer = -1;
    size_t offset = 0;  // in a slot
    int64_t chunk = 0;  // whose kernels bind it (a slot holds one chunk's micro-batch at a time)
  };
  std::vector<Entry> entries;
  int64_t slots = 0;  // 0: no split kernels planned
  size_t slot_bytes = 0;
  size_t weight_bytes = 0;  // of slot_bytes, what zero_bubble's W adds to a slot of the forward's stash alone
  size_t offset = 0;        // of slot 0 in the arena

  size_t slot_offset(int64_t slot) const { return offset + static_cast<size_t>(slot) * slot_bytes; }
  size_t end() const { return slot_offset(slots); }
  bool in_slot_zero(size_t arena_offset) const {
    return arena_offset >= offset && arena_offset < offset + slot_bytes;
  }
  // The same place in slot `slot` as `arena_offset` (in slot 0: where plans bind the stash) is in slot 0.
  size_t moved_to_slot(size_t arena_offset, int64_t slot) const {
    return slot_offset(slot) + (arena_offset - offset);
  }
  const Entry* find(PlanBufferId buffer, int64_t chunk = 0) const {
    for (const Entry& entry : entries) {
      if (entry.buffer == buffer && entry.chunk == chunk) return &entry;
    }
    return nullptr;
  }
};

// A stage rank's plan (mesh.stage > 1, shared/specs/pipeline.md): which stage, its schedule, and per chunk
// it holds the buffers its transfers move, each in the activation slots (-1 where the chunk has no such
// neighbour). A chunk's forward copies its last layer's output into `output` (sent to the next chunk's
// rank); its backward starts by copying the received `output_gradient` into the chunk's gradient buffer
// and ends by copying its input's gradient into `input_gradient` (sent back); `input` is its chunk/input,
// received from the previous chunk's rank.
struct PipelineStage {
  struct ChunkTransfers {
    PlanBufferId input = -1, output = -1, output_gradient = -1, input_gradient = -1;
    // The boundary copies (the plan's own ops; null where the chunk has no such neighbour).
    const OpDecl *output_copy = nullptr, *output_gradient_copy = nullptr, *input_gradient_copy = nullptr;
  };
  int64_t stage = 0, stages = 1;
  PipelineSchedule schedule;           // every rank's ops (compile prints them; the program is this rank's)
  std::vector<ChunkTransfers> chunks;  // parallel to ModelSpec::chunks; empty: no pipeline
  bool first() const { return stage == 0; }
  bool last() const { return stage + 1 == stages; }
  // The boundary buffer a program's transfer of chunk `chunk` sends from or receives into.
  PlanBufferId buffer_of(ProgramEntry::Transfer transfer, int64_t chunk) const;
  // A chunk's copies, where it has them (null without a pipeline).
  const ChunkTransfers* transfers(int64_t chunk) const {
    return chunks.empty() ? nullptr : &chunks.at(static_cast<size_t>(chunk));
  }
};

struct TrainingPlan {
  ModelSpec spec;  // per-device spec (its ops are what PlanOp::op points at)
  // The optimizer pass's state table and update ops (PlanOp::op points at those too); empty when decoding.
  OptimizerDecl optimizer;
  Topology topology;
  Mesh mesh;
  int64_t threads = 1;  // compute threads per rank (scratch sizes depend on it)
  PlanIdentity identity;
  std::vector<PlanBuffer> buffers;
  std::vector<ParameterStorage> storage;  // per spec parameter
  std::deque<OpDecl> plan_ops;            // the plan's own ops (gathers, scatters, zeroing); stable addresses
  std::vector<KernelPlan> kernels;        // in kKernelNames order, those requested
  OverlapSchedule overlap;                // empty without a data axis or an update kernel
  StepProgram program;     // the kernels a step and an eval batch run, in order (empty: decode)
  ActivationStash stash;   // the split kernels' (empty without them)
  PipelineStage pipeline;  // stages == 1: no pipeline
  size_t persistent_bytes = 0;
  size_t arena_bytes = 0;  // persistent + the largest temporary region over the planned kernels (the split
                           // kernels' counts the stash's slots)
  double device_memory_bytes = 0.0;

  TrainingPlan() = default;
  TrainingPlan(const TrainingPlan&) = delete;  // PlanOp::op points into spec and plan_ops
  TrainingPlan& operator=(const TrainingPlan&) = delete;
  TrainingPlan(TrainingPlan&&) = default;
  TrainingPlan& operator=(TrainingPlan&&) = default;

  const KernelPlan* find(KernelName kernel, int64_t chunk = 0) const;
  const KernelPlan& kernel(KernelName kernel, int64_t chunk = 0) const;
  bool fits() const { return static_cast<double>(arena_bytes) <= device_memory_bytes; }
};

struct PlanRequest {
  Config config;
  std::string topology;  // defaults to config.topology when empty
  int64_t devices = 0;   // ranks of a live run; 0: the topology's device count (cpu: the mesh product)
  std::vector<KernelName> kernels = {kKernelNames.begin(), kKernelNames.end()};
  // > 0: plan the decode spec over caches of this many rows instead (plan_decode); `kernels` is ignored.
  int64_t decode_cache_length = 0;
  // > 0: also plan the split kernels (zero_gradients, forward, backward) with this many activation slots,
  // the most micro-batches whose forward has run and backward not yet (GPipe: all M; 1F1B: at most the
  // stage count). The requested kernels and their plans do not depend on it.
  int64_t activation_slots = 0;
  // With activation_slots: also plan backward_input and backward_weight (a stage plan does for zero_bubble).
  bool split_backward = false;
  // mesh.stage > 1: the stage rank to plan (its coordinate on the stage axis): its chunk of the layers, its
  // schedule's program (activation slots as it needs; the fused kernels are not planned).
  int64_t stage = 0;
  // > 0: the threads this rank runs (a live run's, from its launcher: comm/process_placement.h) unless
  // num_threads sets them; 0: the topology's cores over the ranks on one host.
  int64_t threads = 0;
  // With devices: who started them, for messages ("srun (SLURM job 12) on 2 hosts"); "" says processes.
  std::string devices_launcher;
  // The kernel table to build and run the spec with; nullptr: the topology's device kind's
  // (kernel_backend_for_device). Tests pass a variant of a table to compare two ways of storing a run.
  const kernels::KernelBackend* backend = nullptr;
};

// The one planning function. Validates mesh, sharding and model (clear errors), builds the per-device
// spec, applies the optimizer to it (training), and plans the requested kernels. A mesh with pipeline
// stages (mesh.stage > 1) plans one stage rank (PlanRequest::stage): the layers of its chunk
// (model/pipeline_placement.h), the split kernels with its boundary copies, update and eval, and the
// program of its schedule (plan/pipeline_schedule.h, plan/pipeline_program.h).
TrainingPlan plan_training(const PlanRequest& request);

// What a request plans for, before anything else is planned: the topology, the device count and the
// resolved mesh (plan_training's first step; compile prints a pipeline's placement from it).
struct PlanTarget {
  Topology topology;
  Mesh mesh;  // its product: the devices
};
PlanTarget resolve_plan_target(const PlanRequest& request);

// The unsharded sizes of a buffer declared at per-device compute shape `local` (kv heads replicated over
// a larger tensor degree count once; the vocabulary is the padded one).
std::vector<int64_t> global_dims(const TrainingPlan& plan, const Shape& local);

// How many devices a plan is for: `live_ranks` when a live run gives them, else the topology's count, else
// (cpu topologies) the mesh product; `source` says which, for errors.
struct DeviceCount {
  int64_t count = 1;
  std::string source;
};
DeviceCount resolve_devices(const Config& config, const Topology& topology, int64_t live_ranks,
                            const std::string& launcher = "");

// How many tensor ranks hold the same values of a buffer with a kv_heads axis (tensor degree above the kv
// head count: each kv head is replicated on tensor / kv_heads consecutive ranks); 1 otherwise.
int64_t kv_replicas(const TrainingPlan& plan, BufferId id);

// Compute threads per rank: num_threads when set; on cpu topologies this machine's cores / ranks on the host;
// elsewhere 1 (the CPU kernels' per-thread scratch does not exist there, and plans stay machine-independent).
int64_t resolve_threads(const Config& config, const Topology& topology, int64_t devices);

// Payload bytes per rank of one step, per mesh axis (comparable with Engine::collective_bytes): each planned
// kernel's collective bytes times its entries in the step's program (gradients and update), and a pipeline
// program's transfers on the stage axis (the bytes a rank sends: a received message is its sender's).
std::map<std::string, double> step_collective_bytes(const TrainingPlan& plan);
// Of those, the bytes a stage rank's transfers send in one step (its activations to the next chunk's rank
// and its input gradients to the previous one's; 0 without stages). The rest of the stage axis's bytes is
// the tied embedding table's sum between the ends.
double step_transfer_bytes(const TrainingPlan& plan);

// The plan file of one kernel (of the rank's chunk `chunk`: a stage rank with several chunks has a forward,
// a backward and an eval per chunk): deterministic JSON text (the same inputs give the same bytes).
std::string serialize_kernel_plan(const TrainingPlan& plan, KernelName kernel, int64_t chunk = 0);
// "STEM_<kernel>.json"; a rank's later chunks' "STEM_<kernel>_chunk<k>.json" (k > 0, its k-th chunk)
std::string plan_file_path(const std::string& stem, KernelName kernel, int64_t chunk = 0);
// The stem of `plan`'s files: STEM itself, or under mesh.stage > 1 STEM_stage<s> for stage rank s (each stage
// has its own plan; `compile plan_out=STEM` writes every stage's, a run's rank reads its own stage's).
std::string plan_file_stem(const std::string& stem, const TrainingPlan& plan);
// Reads plan_file_path(plan_file_stem(STEM), kernel, chunk) and compares it with `plan`: a missing file or
// any difference is an error that names the file and the first differing config key (or field), never a
// silent re-plan.
void verify_plan_file(const TrainingPlan& plan, KernelName kernel, const std::string& stem,
                      int64_t chunk = 0);

}  // namespace meshtrain
