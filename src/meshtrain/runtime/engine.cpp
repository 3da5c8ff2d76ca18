#include "meshtrain/runtime/engine.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/metrics/trace.h"
#include "meshtrain/runtime/device_communicator.h"

namespace meshtrain {

// What the ops call on other ranks while they run (kernels/collectives.h): this engine implements both.
using kernels::ContextRing;
using kernels::TensorGroup;

// The CPU kernels store float32 and compute float32, or (dtype=bfloat16) round the inputs of every dense
// matmul to bf16; weights, gradients and moments stay float32. The cuda kernels do the same on an NVIDIA GPU
// for the dense decoders, with Engram, mHC, MoE and MLA. Other layouts are planned, not run, here.
void check_plan_runs_here(const TrainingPlan& plan, int64_t world, int64_t host_ranks) {
  const Config& c = plan.spec.config;
  const std::string& kind = plan.topology.device_kind;
  const bool on_gpu = kernels::nvidia_device_kind(kind);
  if (on_gpu) {
    // What the cuda kernels do not cover yet: each named with its key, before anything is allocated.
    const auto not_on_gpu = [&](const std::string& key, const std::string& found, const std::string& fix) {
      fail("config key '" + key + "'",
           "what the cuda backend runs today (Qwen3, GPT-2 and DeepSeek-style decoders)", found,
           fix + ", or set topology=cpu; meshtrain compile plans it for GPUs");
    };
    // Several processes run (NCCL, or MPI staged through host memory under share_gpus); what their layouts
    // need of the cuda kernels or of the engine's host code is not all there yet.
    if (plan.mesh.size(MeshAxis::tensor) > 1) {
      not_on_gpu("mesh.tensor", to_text(plan.mesh.size(MeshAxis::tensor)) + " (the vocabulary-parallel loss)",
                 "set mesh.tensor=1 (the cuda loss kernel has no vocabulary-parallel form yet)");
    }
    if (plan.mesh.size(MeshAxis::context) > 1 && plan.spec.kernels->context_attention_forward == nullptr) {
      not_on_gpu("mesh.context", to_text(plan.mesh.size(MeshAxis::context)) + " (context attention)",
                 "set mesh.context=1 (the cuda backend has no context attention kernels yet)");
    }
    if (plan.mesh.size(MeshAxis::expert) > 1 && plan.spec.kernels->moe_dispatch_plan == nullptr) {
      not_on_gpu("mesh.expert", to_text(plan.mesh.size(MeshAxis::expert)) + " (expert parallelism)",
                 "set mesh.expert=1 (the cuda backend has no expert-parallel block plans yet)");
    }
    if (c.opt_type != OptimizerType::adamw) {
      not_on_gpu("opt_type", optimizer_type_name(c.opt_type),
                 "set opt_type=adamw (no Muon kernel for GPUs yet)");
    }
    // The cuda loss kernel has no z-loss (kernels/cuda/cross_entropy.h): not run on a GPU yet.
    if (c.z_loss_multiplier > 0.0) {
      not_on_gpu(
          "z_loss_multiplier",
          to_text(c.z_loss_multiplier) + " (a z-loss, which the cuda loss kernel does not compute yet)",
          "set z_loss_multiplier=0");
    }
  }
  // Whether this process can run the backend's kernels at all: a topology without a backend here (TPU,
  // MI300X), a build without CUDA, no GPU; each table says why.
  if (const std::string why = plan.spec.kernels->device_check(); !why.empty()) {
    fail("config key 'topology'",
         "kernels this process can run for topology '" + plan.topology.name + "' (device kind " + kind + ")",
         why,
         "set topology=cpu, or an NVIDIA topology (a100xN, h100xN, h200xN, b200xN) on a machine with an "
         "NVIDIA "
         "GPU and its driver (nvidia-smi lists it); meshtrain compile plans every topology");
  }
  if (c.share_gpus && !on_gpu) {
    fail(
        "config key 'share_gpus'",
        "false on topology '" + plan.topology.name + "' (device kind " + kind + ")", "true",
        "set share_gpus=false: it lets processes share an NVIDIA GPU, and applies to NVIDIA topologies only");
  }
  // NCCL takes one process per GPU; more processes than GPUs on a host share them only when asked.
  const int gpus = on_gpu && host_ranks > 1 ? plan.spec.kernels->device_count() : 0;
  if (on_gpu && host_ranks > 1 && host_ranks > gpus && !c.share_gpus) {
    fail(
        "config key 'share_gpus'",
        "at most one process per GPU on each host (this host's GPUs: " + std::to_string(gpus) +
            ") unless share_gpus=true",
        std::to_string(host_ranks) + " processes on this host, share_gpus=false",
        "set share_gpus=true to let them share the GPU(s), their collectives staged through host memory over "
        "MPI (slower than NCCL; for testing layouts on one GPU), or start at most " +
            std::to_string(gpus) + " process(es) per host");
  }
  if (on_gpu && world > 1 && !c.share_gpus && !nccl_communicator_built()) {
    fail(
        "config key 'share_gpus'",
        "NCCL for " + std::to_string(world) + " processes on NVIDIA GPUs (share_gpus=false)",
        "a meshtrain built without NCCL (CMake found no nccl.h and libnccl, or MESHTRAIN_NCCL=OFF)",
        "set share_gpus=true to run over MPI staged through host memory, or rebuild where NCCL is installed");
  }
  // bf16 compute without bf16 instructions would be emulated (oneDNN 2.6 has no bf16 matmul on AVX2 CPUs),
  // so say what this machine has.
  // A decode spec computes in float32 whatever the dtype (SpecBuilder::bf16_inputs_scratch), so a
  // checkpoint trained in bf16 samples anywhere.
  if (const CpuFeatures& cpu = cpu_features();
      kind == "cpu" && c.dtype == DType::bf16 && !plan.spec.decoding() && !cpu.avx512_bf16 && !cpu.amx_bf16) {
    fail("config key 'dtype'", "a CPU with AVX512-BF16 or AMX-BF16 instructions for bfloat16", cpu.describe(),
         "set dtype=float32 on this machine (its float32 GEMM is its fastest); meshtrain compile still plans "
         "bfloat16 for other machines");
  }
  for (const auto& [key, dtype] :
       {std::pair{"weight_dtype", c.weight_dtype}, std::pair{"grad_dtype", c.grad_dtype},
        std::pair{"mu_dtype", c.mu_dtype}}) {
    if (dtype != DType::f32) {
      fail(std::string("config key '") + key + "'", "float32 for a live run", dtype_config_name(dtype),
           std::string("set ") + key +
               "=float32: the cpu and cuda kernels keep weights, gradients and moments in float32 "
               "(dtype=bfloat16 rounds the matmul inputs); meshtrain compile plans other storage dtypes");
    }
  }
  if (plan.mesh.devices() != world) {
    fail("config key 'mesh'", "a mesh of " + std::to_string(world) + " device(s), one per process",
         plan.mesh.to_string(),
         "launch with mpirun -np " + std::to_string(plan.mesh.devices()) + ", or change mesh.*");
  }
  if (!plan.fits()) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    std::vector<const PlanBuffer*> largest;
    for (const PlanBuffer& buffer : plan.buffers) largest.push_back(&buffer);
    std::sort(largest.begin(), largest.end(),
              [](const auto* a, const auto* b) { return a->bytes > b->bytes; });
    std::string listing;
    for (size_t i = 0; i < std::min<size_t>(3, largest.size()); ++i) {
      listing += (i ? ", " : "") + largest[i]->name + " " +
                 to_text(static_cast<double>(largest[i]->bytes) / kGiB) + " GiB";
    }
    fail("config (plan for topology '" + plan.topology.name + "')",
         "a plan within the device's " + to_text(plan.device_memory_bytes / kGiB) + " GiB",
         to_text(static_cast<double>(plan.arena_bytes) / kGiB) + " GiB (largest buffers: " + listing + ")",
         "lower per_device_batch_size or max_target_length, or set remat_policy=full; meshtrain compile "
         "--explain "
         "shows the breakdown");
  }
  // Then what the device itself has now (the plan's figure above is the topology's stated memory).
  check_device_runs_plan(plan, plan.spec.kernels->device_resources());
}

void check_device_runs_plan(const TrainingPlan& plan, const kernels::DeviceResources& device) {
  const Config& c = plan.spec.config;
  if (c.dtype == DType::bf16 && !plan.spec.decoding() && !device.bf16) {
    fail("config key 'dtype'",
         "a device that computes with bf16 inputs (an NVIDIA GPU of compute capability 8.0 or "
         "later: A100, H100, H200, B200)",
         "bfloat16 on " + device.name,
         "set dtype=float32 on this GPU, or run on an A100 or later; meshtrain compile still plans bfloat16");
  }
  if (device.free_bytes == 0) return;  // the host: the topology's memory, checked by the plan
  const size_t needed = plan.arena_bytes + device.overhead_bytes;
  if (needed > device.free_bytes) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    const auto gib = [&](size_t bytes) { return to_text(static_cast<double>(bytes) / kGiB) + " GiB"; };
    fail(
        "config (plan for topology '" + plan.topology.name + "')",
        "the planned arena " + gib(plan.arena_bytes) + " + " + gib(device.overhead_bytes) +
            " the process holds beside it (library workspace, kernel modules) within the " +
            gib(device.free_bytes) + " free on " + device.name,
        gib(needed) + ", " + gib(needed - device.free_bytes) + " more than is free",
        "free the device (nvidia-smi lists the processes using it), or lower per_device_batch_size or "
        "max_target_length, or set remat_policy=full; meshtrain compile --explain shows the arena's buffers");
  }
}

namespace {

// What of this config runs cuda kernels that are built but have not run on a GPU yet, in words ("" when
// nothing): said at start-up on a GPU. Remove a kind here when tests/gpu/run.sh's device checks of its
// kernels and its model have passed on a GPU (docs/gpus.md).
std::string gpu_unverified_layers(const Config& c, int64_t world) {
  std::vector<std::string> kinds = {"the loss over the padded vocabulary"};
  if (world > 1)
    kinds.push_back(c.share_gpus ? "collectives staged through host memory (share_gpus)" : "NCCL");
  if (c.dtype == DType::bf16) kinds.push_back("bf16 attention on tensor cores and bf16 activations");
  if (c.num_experts > 0)
    kinds.push_back("mixture of experts (num_experts=" + std::to_string(c.num_experts) + ")");
  if (c.attention_type == AttentionType::mla) kinds.push_back("MLA");
  if (!c.engram_layers.empty()) kinds.push_back("Engram (engram_layers)");
  if (c.mhc_expansion_rate > 1) kinds.push_back("mHC (mhc_expansion_rate)");
  std::string words;
  for (const std::string& kind : kinds) words += (words.empty() ? "" : ", ") + kind;
  return words;
}

TrainingPlan require_runnable(TrainingPlan plan, const EngineRanks& ranks) {
  check_plan_runs_here(plan, ranks.world ? ranks.world->size() : 1);
  return plan;
}

TrainingPlan plan_for_one_process(const Config& config) {
  PlanRequest request;
  request.config = config;
  request.devices = 1;
  return plan_training(request);
}

template <class T>
void check_field(const std::vector<T>& source, const char* field, int64_t expected) {
  if (static_cast<int64_t>(source.size()) != expected) {
    fail(std::string("batch field '") + field + "'", std::to_string(expected) + " values (B x S)",
         std::to_string(source.size()));
  }
}

// A split kernel's activation slot and the spec's chunk it runs, bound while it loads its batch and runs, and
// unbound however that ends.
class SlotScope {
 public:
  SlotScope(int64_t& bound_slot, int64_t& bound_chunk, int64_t slot, int64_t chunk)
      : slot_(bound_slot), chunk_(bound_chunk) {
    slot_ = slot;
    chunk_ = chunk;
  }
  ~SlotScope() {
    slot_ = ProgramEntry::kNoSlot;
    chunk_ = 0;
  }
  SlotScope(const SlotScope&) = delete;
  SlotScope& operator=(const SlotScope&) = delete;

 private:
  int64_t& slot_;
  int64_t& chunk_;
};

ArenaMemory arena_memory(const kernels::KernelBackend& backend) {
  return {backend.memory_allocate, backend.memory_free, backend.device_description()};
}

}  // namespace

// What an op sees: each buffer it declared, at the offset the plan gave it for this op.
class PlannedOpContext : public OpContext {
 public:
  PlannedOpContext(const Engine& engine, const PlanOp* op) : engine_(engine), op_(op) {}
  void set_op(const PlanOp* op) { op_ = op; }
  TensorView view(BufferId id) const override {
    for (size_t i = 0; i < op_->buffers.size(); ++i) {
      if (op_->buffers[i].first != id) continue;
      const PlanBuffer& buffer = engine_.plan_.buffers[static_cast<size_t>(op_->buffers[i].second)];
      // ZeRO-1's shard of a parameter is this data rank's contiguous slot of it.
      const size_t slot = buffer.data_rank_slot
                              ? static_cast<size_t>(engine_.coordinates_[MeshAxis::data]) * buffer.bytes
                              : 0;
      size_t offset = op_->offsets[i] + slot;
      // A split kernel's stash bindings are planned in activation slot 0; its entry's slot holds them.
      const ActivationStash& stash = engine_.plan_.stash;
      if (engine_.slot_ != ProgramEntry::kNoSlot && stash.in_slot_zero(offset))
        offset = stash.moved_to_slot(offset, engine_.slot_);
      return {engine_.arena_.at(offset), buffer.dtype, buffer.shape};
    }
    MT_CHECK(false, "op '" + op_->op->name + "' touches '" +
                        engine_.plan_.buffers.at(static_cast<size_t>(id)).name +
                        "', which it does not declare in its reads or writes");
    return {};
  }

 private:
  const Engine& engine_;
  const PlanOp* op_;
};

Engine::Engine(const Config& config) : Engine(plan_for_one_process(config)) {}

Engine::Engine(TrainingPlan plan, EngineRanks ranks)
    : plan_(require_runnable(std::move(plan), ranks)),
      arena_(plan_.arena_bytes, arena_memory(*plan_.spec.kernels)),
      ranks_(ranks),
      slot_holders_(static_cast<size_t>(plan_.stash.slots)) {
  coordinates_ = mesh_coordinates(plan_.mesh, ranks_.world ? ranks_.world->rank() : 0);
  if (const std::string kinds =
          gpu_unverified_layers(plan_.spec.config, ranks_.world ? ranks_.world->size() : 1);
      kernels::nvidia_device_kind(plan_.topology.device_kind) && !kinds.empty()) {
    std::fprintf(stderr,
                 "meshtrain: note: the cuda kernels of %s are built but have not been verified on a GPU yet "
                 "(tests/gpu/run.sh checks them; docs/gpus.md)\n",
                 kinds.c_str());
  }
  if (plan_.mesh.size(MeshAxis::tensor) > plan_.spec.config.base_num_kv_heads) {
    // The tensor ranks that hold the same kv head (consecutive ones) sum its gradient.
    const int64_t replicas =
        plan_.mesh.size(MeshAxis::tensor) / plan_.spec.config.base_num_kv_heads;  // as kv_replicas()
    kv_replica_group_ = communicator(MeshAxis::tensor)
                            .split(static_cast<int>(coordinates_[MeshAxis::tensor] / replicas),
                                   static_cast<int>(coordinates_[MeshAxis::tensor]), "tensor kv replicas");
  }
  if (const PipelineStage& stage = plan_.pipeline; stage.stages > 2) {
    // The first and last stage ranks sum a tied table's gradients (every other stage gets a group of its
    // own).
    const bool end = stage.first() || stage.last();
    pipeline_ends_group_ =
        communicator(MeshAxis::stage)
            .split(end ? 0 : static_cast<int>(1 + stage.stage), static_cast<int>(stage.stage), "stage ends");
  }
  if (plan_.mesh.size(MeshAxis::tensor) > 1) {
    Communicator* tensor = &communicator(MeshAxis::tensor);
    tensor_group_ =
        TensorGroup{coordinates_[MeshAxis::tensor], plan_.mesh.size(MeshAxis::tensor),
                    [tensor](float* values, int64_t count) {
                      tensor->all_reduce(comm_buffer(values, count), ReduceOp::max, "loss/vocab_statistics");
                    },
                    [tensor](double* values, int64_t count) {
                      tensor->all_reduce(comm_buffer(values, count), ReduceOp::sum, "loss/vocab_statistics");
                    }};
  }
  std::vector<TensorView> values;
  for (const ParameterStorage& store : plan_.storage) values.push_back(view(store.value_store));
  parameters_ = ParameterStore(plan_.spec, std::move(values));
  omp_set_num_threads(static_cast<int>(plan_.threads));
  initialize_parameters();
}

Engine::~Engine() {
  // Unwinding from an error: reductions still in flight are not waited for (their peers may be waiting
  // elsewhere); the caller reports the error and ends every rank.
  if (std::uncaught_exceptions() > 0) {
    for (auto& entry : in_flight_) static_cast<void>(entry.second.release());
    for (auto& pass : ring_passes_) static_cast<void>(pass.release());
    transfers_.release_unwaited();
    pipeline_transfers_.release_unwaited();
  }
}

void Engine::abandon_step() {
  for (auto& entry : in_flight_) entry.second->wait();
  in_flight_.clear();
  bucket_.clear();
  bucket_bytes_ = 0;
}

std::map<std::string, double> Engine::collective_bytes() const {
  std::map<std::string, double> bytes;
  if (!ranks_.axes) return bytes;
  for (MeshAxis axis : kMeshAxes) {
    if (plan_.mesh.size(axis) > 1) bytes[mesh_axis_name(axis)] = communicator(axis).stats().total_bytes();
  }
  if (kv_replica_group_)
    bytes["tensor"] += kv_replica_group_->stats().total_bytes();  // part of the tensor axis
  if (pipeline_ends_group_) bytes["stage"] += pipeline_ends_group_->stats().total_bytes();
  return bytes;
}

void Engine::reset_collective_stats() {
  if (!ranks_.axes) return;
  for (MeshAxis axis : kMeshAxes) communicator(axis).reset_stats();
  if (kv_replica_group_) kv_replica_group_->reset_stats();
  if (pipeline_ends_group_) pipeline_ends_group_->reset_stats();
}

Communicator& Engine::communicator(MeshAxis axis) const {
  MT_CHECK(ranks_.axes != nullptr, "a collective in a one-process run");
  const std::unique_ptr<Communicator>& comm = ranks_.axes->at(axis);
  MT_CHECK(comm != nullptr, std::string("no communicator for mesh axis ") + mesh_axis_name(axis));
  return *comm;
}

// A collective op of the plan. Strided shards (outer > 1) go through the planned staging buffer: shards
// travel as contiguous blocks [rank][outer][block], the full buffer is [outer][rank][block].
void Engine::run_collective(const PlanOp& op, const OpContext& context, UpdateState* update) {
  const CollectiveDecl& c = op.op->collective;
  const bool kv_replicas = c.axis == MeshAxis::tensor && c.group < plan_.mesh.size(MeshAxis::tensor);
  MT_CHECK(!kv_replicas || kv_replica_group_, "a part of the tensor axis other than the kv replicas");
  // A pipeline's tied table: its first and last stage ranks (the whole axis when there are two).
  const bool pipeline_ends =
      c.axis == MeshAxis::stage && c.group > 0 && c.group < plan_.mesh.size(MeshAxis::stage);
  MT_CHECK(!pipeline_ends || pipeline_ends_group_, "a part of the stage axis other than its two ends");
  Communicator& comm = kv_replicas     ? *kv_replica_group_
                       : pipeline_ends ? *pipeline_ends_group_
                                       : communicator(c.axis);
  const std::string& name = op.op->name;
  if (c.inside_next_op) return;  // the next op moves these bytes itself (the plan counts them here)
  if (op.op->role == OpRole::reduce_valid_count) {
    comm.all_reduce(comm_buffer(&update->global_valid_count, 1), ReduceOp::sum, name);
    return;
  }
  if (op.op->role == OpRole::reduce_grad_norm) {
    update->fold_norm_slots();
    comm.all_reduce(comm_buffer(&update->sum_of_squares, 1), ReduceOp::sum, name);
    return;
  }
  if (c.kind == CollectiveKind::send_recv) {  // non-blocking: waited for before its memory is touched again
    const auto view_or_none = [&](BufferId id) { return id == kNoBuffer ? TensorView{} : context.view(id); };
    transfers_.start(comm, c.peer_offset, view_or_none(c.buffer), view_or_none(c.shard), name);
    return;
  }
  const TensorView full = context.view(c.buffer);
  const int64_t n = c.group;
  // Rank r's blocks are a column slice of the [outer, n x block] layout: the backend's copy moves them
  // (device memory on a GPU, which the host may not touch).
  const auto permute = [&](const float* from, float* to, bool to_rank_major) {
    const int64_t block = full.elements() / (c.outer * n);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t rank_major = r * c.outer * block, outer_major = r * block;
      if (to_rank_major) {
        context.kernels->column_slice_forward(to + rank_major, from + outer_major, c.outer, block, 1, block,
                                              n * block);
      } else {
        context.kernels->column_slice_forward(to + outer_major, from + rank_major, c.outer, block, 1,
                                              n * block, block);
      }
    }
  };
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      comm.all_reduce(comm_buffer(full), ReduceOp::sum, name);
      return;
    case CollectiveKind::all_gather: {
      const TensorView shard = context.view(c.shard);
      if (c.outer == 1) {
        comm.all_gather(comm_buffer(shard), comm_buffer(full), name);
        return;
      }
      float* staging = context.f32(c.staging);
      comm.all_gather(comm_buffer(shard), comm_buffer(staging, full.elements()), name);
      permute(staging, full.f32(), false);
      return;
    }
    case CollectiveKind::reduce_scatter: {
      const TensorView shard = context.view(c.shard);
      const bool accumulate =
          std::find(op.op->reads.begin(), op.op->reads.end(), c.shard) != op.op->reads.end();
      float* staging = c.staging == kNoBuffer ? nullptr : context.f32(c.staging);
      CommBuffer source = comm_buffer(full);
      if (c.outer > 1) {
        permute(full.f32(), staging, true);
        source = comm_buffer(staging, full.elements());
      }
      float* result = accumulate ? staging + (c.outer > 1 ? full.elements() : 0) : shard.f32();
      comm.reduce_scatter(source, comm_buffer(result, shard.elements()), ReduceOp::sum, name);
      if (accumulate) context.kernels->residual_add(shard.f32(), result, shard.elements());
      return;
    }
    case CollectiveKind::all_to_all:  // blocks of the full (send) buffer out, the shard's blocks in
      comm.all_to_all(comm_buffer(full), comm_buffer(context.view(c.shard)), name);
      return;
    case CollectiveKind::send_recv:  // started above
      break;
  }
}

TensorView Engine::view(BufferId id) const {
  const PlanBuffer& buffer = plan_.buffers.at(static_cast<size_t>(id));
  // A view inside a persistent buffer (a layer's block of a stacked parameter) has its offset too.
  if (buffer.persistent || (buffer.part_of >= 0 && !buffer.data_rank_slot))
    return {arena_.at(buffer.offset), buffer.dtype, buffer.shape};
  MT_CHECK(last_kernel_ != nullptr, "temporary '" + buffer.name + "' viewed before any kernel ran");
  const std::vector<PlanValue>& values = last_kernel_->values;
  const PlanValue* last = nullptr;
  for (const PlanValue& value : values) {
    if (value.buffer == id && (!last || value.first_op > last->first_op)) last = &value;
  }
  MT_CHECK(last != nullptr, "'" + buffer.name + "' is not used by the last kernel");
  const size_t end = last->offset + buffer.bytes;
  for (const PlanValue& value : values) {
    const size_t other_end = value.offset + plan_.buffers[static_cast<size_t>(value.buffer)].bytes;
    MT_CHECK(value.first_op <= last->last_op || other_end <= last->offset || value.offset >= end,
             "'" + buffer.name + "' was overwritten later in the kernel");
  }
  return {arena_.at(last->offset), buffer.dtype, buffer.shape};
}

PlanBufferId Engine::stored_buffer(BufferId id) const {
  for (size_t p = 0; p < plan_.spec.parameters.size(); ++p) {
    const ParameterDecl& parameter = plan_.spec.parameters[p];
    if (parameter.value == id) return plan_.storage[p].value_store;
    for (size_t i = 0; i < parameter.members.size(); ++i) {
      if (parameter.members[i].value == id) return plan_.storage[p].member_value_stores[i];
    }
  }
  return id;  // moments persist in their own (storage-layout) buffers
}

GlobalIndex Engine::global_index(PlanBufferId stored, BufferId id) const {
  const PlanBuffer& buffer = plan_.buffers[static_cast<size_t>(stored)];
  return GlobalIndex(buffer.shape, buffer.sharding, global_shape(id), plan_.mesh, coordinates_);
}

std::vector<int64_t> Engine::global_shape(BufferId id) const {
  return global_dims(plan_, plan_.spec.buffer(id).shape);
}

Engine::LocalShard Engine::local_shard(BufferId id) const {
  const PlanBufferId stored = stored_buffer(id);
  const PlanBuffer& buffer = plan_.buffers[static_cast<size_t>(stored)];
  const GlobalIndex index = global_index(stored, id);
  LocalShard shard;
  shard.data = reinterpret_cast<float*>(host_address(buffer.offset));
  shard.offsets = index.offsets();
  shard.dims = index.local_dims();
  shard.saving_replica = coordinates_[MeshAxis::tensor] % kv_replicas(plan_, id) == 0;  // replicated kv heads
  for (MeshAxis axis : kMeshAxes) {
    if (axis == MeshAxis::stage) continue;  // each stage holds other layers
    shard.saving_replica = shard.saving_replica && (buffer.split_over(axis) || coordinates_[axis] == 0);
  }
  // Both ends of a pipeline hold a tied table (and its moments): the first stage saves it.
  if (plan_.pipeline.stages > 1 && !plan_.pipeline.first() && tied_table_state(id))
    shard.saving_replica = false;
  return shard;
}

bool Engine::tied_table_state(BufferId id) const {
  const std::vector<ParameterDecl>& parameters = plan_.spec.parameters;
  for (size_t p = 0; p < parameters.size(); ++p) {
    if (parameters[p].value != plan_.spec.embedding_table) continue;
    const std::vector<BufferId>& moments = plan_.optimizer.state(p).moments;
    return id == parameters[p].value || std::find(moments.begin(), moments.end(), id) != moments.end();
  }
  return false;
}

void Engine::update_selection_biases(const std::vector<double>& expert_load, double rate) {
  const std::vector<BufferId>& biases = plan_.spec.moe_selection_biases;
  const auto E = static_cast<size_t>(plan_.spec.moe_experts);
  MT_CHECK(expert_load.size() == biases.size() * E, "expert loads of another model");
  std::vector<float> staged;  // a layer's bias, updated in a host copy (a device arena's is not in reach)
  for (size_t layer = 0; layer < biases.size(); ++layer) {
    if (biases[layer] == kNoBuffer) continue;
    const double* load = expert_load.data() + layer * E;
    const double mean = std::accumulate(load, load + E, 0.0) / static_cast<double>(E);
    const PlanBufferId stored = stored_buffer(biases[layer]);
    const PlanBuffer& buffer = plan_.buffers[static_cast<size_t>(stored)];
    const GlobalIndex index = global_index(stored, biases[layer]);
    const int64_t count = buffer.shape.elements();
    const size_t bytes = static_cast<size_t>(count) * sizeof(float);
    staged.resize(static_cast<size_t>(count));
    backend().memory_copy_out(staged.data(), arena_.at(buffer.offset), bytes);
    for (int64_t i = 0; i < count; ++i) {
      const double gap = mean - load[index(i)];  // under-loaded experts (gap > 0) are chosen more
      staged[static_cast<size_t>(i)] +=
          static_cast<float>(rate * static_cast<double>((gap > 0.0) - (gap < 0.0)));
    }
    backend().memory_copy_in(arena_.at(buffer.offset), staged.data(), bytes);
  }
}

const ModelSpec& Engine::whole_model() const {
  if (plan_.pipeline.stages == 1) return plan_.spec;
  if (!whole_model_) whole_model_.emplace(build_model_spec(plan_.spec.config, plan_.mesh, backend()));
  return *whole_model_;
}

int64_t Engine::global_parameter_count() const {
  const ModelSpec& whole = whole_model();
  int64_t count = 0;
  for (const ParameterDecl& parameter : whole.parameters) {
    int64_t elements = 1;
    for (int64_t size : global_dims(plan_, whole.buffer(parameter.value).shape)) elements *= size;
    count += elements;
  }
  return count;
}

void Engine::scatter_global(BufferId id, const float* global) {
  const PlanBufferId stored = stored_buffer(id);
  const PlanBuffer& buffer = plan_.buffers[static_cast<size_t>(stored)];
  const GlobalIndex index = global_index(stored, id);
  float* local = reinterpret_cast<float*>(host_address(buffer.offset));
  for (int64_t i = 0; i < buffer.shape.elements(); ++i) local[i] = global[index(i)];
}

std::byte* Engine::host_address(size_t offset) const {
  if (backend().memory_on_host()) return arena_.at(offset);
  MT_CHECK(host_persistent_.size() == plan_.persistent_bytes && offset < plan_.persistent_bytes,
           "a host access to a device arena outside persistent_to_host / persistent_to_device");
  return host_persistent_.data() + offset;
}

void Engine::persistent_to_host() const {
  if (backend().memory_on_host()) return;
  host_persistent_.resize(plan_.persistent_bytes);
  backend().memory_copy_out(host_persistent_.data(), arena_.at(0), plan_.persistent_bytes);
}

void Engine::persistent_to_device() {
  if (backend().memory_on_host()) return;
  MT_CHECK(host_persistent_.size() == plan_.persistent_bytes,
           "persistent_to_device before persistent_to_host");
  backend().memory_copy_in(arena_.at(0), host_persistent_.data(), plan_.persistent_bytes);
  release_host_copy();  // the device holds the state again
}

void Engine::release_host_copy() const {
  // Swapped with an empty vector: `= {}` would keep the capacity (the initializer-list assignment).
  std::vector<std::byte>().swap(host_persistent_);
}

void Engine::copy_in(const TensorView& to, const void* from, size_t bytes) {
  MT_CHECK(bytes <= to.bytes(), "a copy larger than its buffer");
  // A batch input in an activation slot whose previous holder (another chunk's micro-batch, laid out
  // otherwise) may still be sending from the same bytes.
  if (!pipeline_transfers_.empty()) pipeline_transfers_.wait_touching(to, trace_);
  backend().memory_copy_in(to.data, from, bytes);
}

std::vector<float> Engine::read(BufferId id) const {
  const TensorView values = view(id);
  MT_CHECK(values.dtype == DType::f32, "read() of a buffer that is not float32");
  std::vector<float> host(static_cast<size_t>(values.elements()));
  backend().memory_copy_out(host.data(), values.data, values.bytes());
  return host;
}

// Each element takes the value of its index in the global tensor, so any mesh starts from the same weights.
void Engine::initialize_parameters() {
  const uint64_t seed = static_cast<uint64_t>(plan_.spec.config.init_weights_seed);
  for (size_t p = 0; p < plan_.spec.parameters.size(); ++p) {
    const ParameterDecl& parameter = plan_.spec.parameters[p];
    const GlobalIndex index = global_index(plan_.storage[p].value_store, parameter.value);
    const int64_t count = parameters_.value(p).elements();
    // A device arena is filled from a host copy, one parameter at a time.
    std::vector<float> staged(backend().memory_on_host() ? 0 : static_cast<size_t>(count));
    float* values = staged.empty() ? parameters_.value(p).f32() : staged.data();
    // A stacked parameter's layers each draw from their own per-layer stream, as in the per-layer layout:
    // element g of the stack is element g % per_layer of layer g / per_layer (the layer axis is outermost).
    std::vector<PhiloxKey> keys;
    for (const ParameterDecl::Member& member : parameter.members)
      keys.push_back(philox_key(seed, member.canonical_name));
    if (keys.empty()) keys.push_back(philox_key(seed, parameter.canonical_name));
    int64_t per_layer = 1;
    for (int64_t size : global_shape(parameter.value)) per_layer *= size;
    per_layer /= static_cast<int64_t>(keys.size());
    const float constant = parameter.init == ParameterInit::ones ? 1.0f
                           : parameter.init == ParameterInit::constant
                               ? static_cast<float>(parameter.init_value)
                               : 0.0f;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      const int64_t global = index(i);
      values[i] = parameter.init == ParameterInit::normal
                      ? static_cast<float>(parameter.init_std *
                                           normal_at(keys[static_cast<size_t>(global / per_layer)],
                                                     static_cast<uint64_t>(global % per_layer)))
                      : constant;
    }
    if (!staged.empty()) copy_in(parameters_.value(p), staged.data(), staged.size() * sizeof(float));
    if (plan_.spec.decoding()) continue;  // no optimizer state
    for (BufferId moment : plan_.optimizer.state(p).moments)
      backend().memory_fill(view(moment).data, 0, view(moment).bytes());
  }
}

void Engine::load_batch(const Batch& batch) {
  const ModelDims& m = plan_.spec.dims;
  check_field(batch.tokens, "tokens", m.N);
  check_field(batch.targets, "targets", m.N);
  check_field(batch.positions, "positions", m.N);
  check_field(batch.segment_ids, "segment_ids", m.N);
  check_field(batch.loss_mask, "loss_mask", m.N);
  // Engram: each layer's hash ids, each below its head's table size. The batch holds every Engram layer's
  // (engram_layers order); a pipeline stage's spec only those of its own layers.
  const std::vector<int64_t>& engram_layers = plan_.spec.config.engram_layers;
  if (batch.engram_hash_ids.size() != engram_layers.size()) {
    fail("batch field 'engram_hash_ids'",
         std::to_string(engram_layers.size()) + " layers of hash ids (one per engram_layers entry)",
         std::to_string(batch.engram_hash_ids.size()),
         "hash the rows with the run's EngramHashing (data/engram_hash.h) before the context cut");
  }
  for (const EngramLayerSpec& engram : plan_.spec.engram) {
    const auto in_batch = static_cast<size_t>(
        std::find(engram_layers.begin(), engram_layers.end(), engram.layer) - engram_layers.begin());
    MT_CHECK(in_batch < engram_layers.size(), "an Engram layer of the spec among engram_layers");
    const auto heads = static_cast<int64_t>(engram.table_sizes.size());
    const std::vector<int32_t>& ids = batch.engram_hash_ids[in_batch];
    if (static_cast<int64_t>(ids.size()) != m.N * heads) {
      fail("batch field 'engram_hash_ids' of layer " + std::to_string(engram.layer),
           std::to_string(m.N * heads) + " values (B x S x heads)", std::to_string(ids.size()));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t rows = engram.table_sizes[i % static_cast<size_t>(heads)];
      if (ids[i] < 0 || ids[i] >= rows) {
        fail("batch Engram hash id " + std::to_string(i) + " of layer " + std::to_string(engram.layer),
             "a row in [0, " + std::to_string(rows) + ")", std::to_string(ids[i]),
             "hash with the tables of this config (engram_vocab_bases, engram_num_heads)");
      }
    }
    copy_in(batch_view(engram.hash_ids), ids.data(), ids.size() * sizeof(int32_t));
  }
  // Kernels index tables with these: check them here, where a bad batch can still be named.
  const int64_t position_limit = m.P > 0 ? m.P : INT32_MAX;
  for (int64_t i = 0; i < m.N; ++i) {
    const size_t at = static_cast<size_t>(i);
    if (batch.tokens[at] < 0 || batch.tokens[at] >= m.V_valid) {
      fail("batch token " + std::to_string(i), "an id in [0, " + std::to_string(m.V_valid) + ")",
           std::to_string(batch.tokens[at]), "the data was tokenized with a different vocabulary");
    }
    if (batch.loss_mask[at] && (batch.targets[at] < 0 || batch.targets[at] >= m.V_valid)) {
      fail("batch target " + std::to_string(i), "an id in [0, " + std::to_string(m.V_valid) + ")",
           std::to_string(batch.targets[at]), "the data was tokenized with a different vocabulary");
    }
    if (batch.positions[at] < 0 || batch.positions[at] >= position_limit) {
      fail("batch position " + std::to_string(i), "a position in [0, " + std::to_string(position_limit) + ")",
           std::to_string(batch.positions[at]));
    }
  }
  copy_in(batch_view(plan_.spec.tokens), batch.tokens.data(), batch.tokens.size() * sizeof(int32_t));
  copy_in(batch_view(plan_.spec.targets), batch.targets.data(), batch.targets.size() * sizeof(int32_t));
  copy_in(batch_view(plan_.spec.positions), batch.positions.data(), batch.positions.size() * sizeof(int32_t));
  copy_in(batch_view(plan_.spec.segment_ids), batch.segment_ids.data(),
          batch.segment_ids.size() * sizeof(int32_t));
  copy_in(batch_view(plan_.spec.loss_mask), batch.loss_mask.data(),
          batch.loss_mask.size() * sizeof(batch.loss_mask.front()));
}

// Where the kernel about to run reads a batch input: a split kernel's activation slot when the stash holds
// it (the backward reads it after other micro-batches' forwards), else its persistent buffer.
TensorView Engine::batch_view(BufferId input) const {
  const ActivationStash::Entry* stashed =
      slot_ == ProgramEntry::kNoSlot ? nullptr : plan_.stash.find(input, chunk_);
  return stashed ? stashed_view(*stashed, slot_) : view(input);
}

// A stash entry's buffer in activation slot `slot`.
TensorView Engine::stashed_view(const ActivationStash::Entry& entry, int64_t slot) const {
  const PlanBuffer& buffer = plan_.buffers[static_cast<size_t>(entry.buffer)];
  return {arena_.at(plan_.stash.slot_offset(slot) + entry.offset), buffer.dtype, buffer.shape};
}

// Starts the ready reductions a bucket at a time (each tensor its own non-blocking call); drives progress of
// those in flight (MPI moves a non-blocking collective only inside MPI calls).
void Engine::start_ready_collectives(KernelName name, size_t op_index, bool kernel_done) {
  const auto ready = plan_.overlap.ready_after.find(name);
  if (ready == plan_.overlap.ready_after.end()) return;
  const KernelPlan& update = plan_.kernel(KernelName::update);
  for (size_t u : ready->second[op_index]) {
    bucket_.push_back(u);
    const PlanBuffer& gradient = plan_.buffers[static_cast<size_t>(update.ops[u].op->collective.buffer)];
    bucket_bytes_ += gradient.bytes;
  }
  if (!bucket_.empty() && (bucket_bytes_ >= plan_.overlap.bucket_capacity || kernel_done)) {
    PlannedOpContext context(*this, nullptr);
    for (size_t u : bucket_) {
      const PlanOp& op = update.ops[u];
      const CollectiveDecl& c = op.op->collective;
      const std::string label = "start " + op.op->name;  // outlives the scope, which keeps a view of it
      const TraceScope scope(trace_, label, "collective");
      context.set_op(&op);
      Communicator& comm = communicator(c.axis);
      in_flight_[u] =
          c.kind == CollectiveKind::all_reduce
              ? comm.all_reduce_start(comm_buffer(context.view(c.buffer)), ReduceOp::sum, op.op->name)
              : comm.reduce_scatter_start(comm_buffer(context.view(c.buffer)),
                                          comm_buffer(context.view(c.shard)), ReduceOp::sum, op.op->name);
    }
    bucket_.clear();
    bucket_bytes_ = 0;
  }
  for (auto& [index, request] : in_flight_) request->test();
}

// Ring attention's passes over the context axis (made per kernel run: the functions hold this engine,
// which may have moved since the last one). Each pass and each wait is a trace event.
std::optional<ContextRing> Engine::context_ring() {
  if (plan_.mesh.size(MeshAxis::context) == 1) return std::nullopt;
  Communicator* context = &communicator(MeshAxis::context);
  const int next = (context->rank() + 1) % context->size();
  const int previous = (context->rank() + context->size() - 1) % context->size();
  return ContextRing{coordinates_[MeshAxis::context],
                     plan_.mesh.size(MeshAxis::context),
                     [this, context, next, previous](const TensorView& send, const TensorView& receive,
                                                     const std::string& name) {
                       const TraceScope scope(trace_, name, "collective");
                       ring_passes_.push_back(context->send_start(comm_buffer(send), next, name));
                       ring_passes_.push_back(context->recv_start(comm_buffer(receive), previous, name));
                     },
                     [this](const std::string& name) {
                       const TraceScope scope(trace_, name, "collective");
                       for (const std::unique_ptr<CollectiveRequest>& pass : ring_passes_) pass->wait();
                       ring_passes_.clear();
                     },
                     [this] {
                       for (const std::unique_ptr<CollectiveRequest>& pass : ring_passes_) pass->test();
                     },
                     [this, context, next, previous](const TensorView& send, const TensorView& receive,
                                                     const std::string& name) {
                       const TraceScope scope(trace_, name, "collective");
                       ring_passes_.push_back(context->send_start(comm_buffer(send), previous, name));
                       ring_passes_.push_back(context->recv_start(comm_buffer(receive), next, name));
                     }};
}

LossSums Engine::run(KernelName name, UpdateState* update) {
  const KernelPlan& kernel = plan_.kernel(name, chunk_);
  // The split kernels' temporaries lie above the activation slots; every other kernel's overlap them, so it
  // runs only while no micro-batch is in flight.
  const bool split = runs_over_a_slot(name);
  MT_CHECK(split || std::all_of(slot_holders_.begin(), slot_holders_.end(),
                                [](const SlotHolder& holder) { return holder.state == SlotState::free; }),
           std::string(kernel_name(name)) + " while a micro-batch's activations wait in their slot");
  if (poison_temporaries_) {  // all-ones bytes: every float32 a NaN
    // A stage plan's eval binds slot 0 too (its received activation is there).
    const bool above_slots = split || (plan_.pipeline.stages > 1 && name == KernelName::eval);
    const size_t temporaries = above_slots ? plan_.stash.end() : plan_.persistent_bytes;
    backend().memory_fill(arena_.at(temporaries), 0xff, plan_.arena_bytes - temporaries);
  }
  LossSums sums;
  const size_t moe_layers = plan_.spec.moe_layers.size();
  sums.routing.expert_load.assign(moe_layers * static_cast<size_t>(plan_.spec.moe_experts), 0.0);
  sums.routing.dropped.assign(moe_layers, 0.0);
  sums.routing.balance_loss.assign(moe_layers, 0.0);
  PlannedOpContext context(*this, nullptr);
  context.kernels = plan_.spec.kernels;  // the backend the plan sized the spec for
  context.loss_sums = &sums;
  context.update = update;
  context.coordinates = coordinates_;
  context.tensor = tensor_group_ ? &*tensor_group_ : nullptr;
  const std::optional<ContextRing> ring = context_ring();
  context.context_ring = ring ? &*ring : nullptr;
  const bool overlapping = overlap_ && name != KernelName::update && name != KernelName::eval;
  for (size_t i = 0; i < kernel.ops.size(); ++i) {
    const PlanOp& op = kernel.ops[i];
    {
      context.set_op(&op);
      // An op touching memory a transfer sends from or receives into waits for that transfer first (its
      // own trace event: the op's time is its work).
      for (Transfers* transfers : {&transfers_, &pipeline_transfers_}) {
        if (transfers->empty()) continue;
        for (const auto& binding : op.buffers) transfers->wait_touching(context.view(binding.first), trace_);
      }
      const TraceScope scope(trace_, op.op->name,
                             op.op->kind == OpKind::collective ? "collective"
                             : op.recompute                    ? "recompute"
                                                               : "op");
      context.share = op.share;
      context.recomputing = op.recompute;
      if (name == KernelName::update && in_flight_.count(i)) {
        in_flight_[i]->wait();  // started during the last micro-batch's backward
        in_flight_.erase(i);
      } else if (op.op->kind == OpKind::collective) {
        run_collective(op, context, update);
      } else {
        MT_CHECK(op.op->run != nullptr, "op '" + op.op->name + "' has nothing to run");
        op.op->run(context);
      }
      // A traced op on a device: its event lasts until its kernels are done, not just queued.
      if (trace_ && trace_->active()) backend().device_synchronize();
    }
    if (i == 0 && nan_gradient_pending_ && overlapping) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      copy_in(view(plan_.storage.front().gradient_store), &nan, sizeof nan);
      nan_gradient_pending_ = false;
    }
    if (overlapping) start_ready_collectives(name, i, i + 1 == kernel.ops.size());
    transfers_.progress();
    pipeline_transfers_.progress();
  }
  transfers_.wait_all(trace_);     // a kernel ends with no send_recv op's transfer in flight (a program's
                                   // pipeline transfers end with its phase)
  backend().device_synchronize();  // a kernel's time (the step's) ends when the device is done
  last_kernel_ = &kernel;
  return sums;
}

ProgramResult Engine::run_program(const std::vector<ProgramEntry>& entries, const ProgramInputs& inputs) {
  ProgramResult result;
  const auto add = [&result](const LossSums& sums) {
    result.sums.loss_sum += sums.loss_sum;
    result.sums.z_loss_sum += sums.z_loss_sum;
    result.sums.valid_count += sums.valid_count;
    result.sums.routing.add(sums.routing);
  };
  // Each micro-batch's Batch, asked for once (a rank with several chunks loads it for each).
  std::map<int64_t, Batch> batches;
  const auto batch = [&](int64_t micro_batch) -> const Batch& {
    auto found = batches.find(micro_batch);
    if (found == batches.end()) found = batches.emplace(micro_batch, inputs.micro_batch(micro_batch)).first;
    return found->second;
  };
  for (const ProgramEntry& entry : entries) {
    if (entry.transfer != ProgramEntry::Transfer::none) {
      start_transfer(entry);
      continue;
    }
    MT_CHECK(!runs_over_a_slot(entry.kernel) || !entry.last_backward,
             "overlapped reductions after a split backward");
    switch (entry.kernel) {
      case KernelName::fwd_bwd:
        add(fwd_bwd(batch(entry.micro_batch), entry.last_backward));
        break;
      case KernelName::fwd_bwd_accum:
        add(fwd_bwd_accum(batch(entry.micro_batch), entry.last_backward));
        break;
      case KernelName::eval:
        add(eval(batch(entry.micro_batch), entry.slot, entry.chunk));
        break;
      case KernelName::update:
        result.update = update(inputs.valid_count, inputs.learning_rate, inputs.step);
        break;
      case KernelName::zero_gradients:
        zero_gradients();
        break;
      case KernelName::forward:
        add(forward(batch(entry.micro_batch), entry.slot, entry.chunk, entry.micro_batch));
        break;
      case KernelName::backward:
        add(backward(entry.slot, entry.chunk, entry.micro_batch));
        break;
      case KernelName::backward_input:
        add(backward_input(entry.slot, entry.chunk, entry.micro_batch));
        break;
      case KernelName::backward_weight:
        add(backward_weight(entry.slot, entry.chunk, entry.micro_batch));
        break;
      case KernelName::decode:
        MT_CHECK(false, "decode in a step's program");
    }
  }
  pipeline_transfers_.wait_all(trace_);  // a phase ends with no transfer in flight
  return result;
}

// A pipeline program's send or receive, started non-blocking on the slot's boundary buffer (after any
// earlier transfer of the same memory: a slot's previous micro-batch may still be sending from it).
void Engine::start_transfer(const ProgramEntry& entry) {
  using Transfer = ProgramEntry::Transfer;
  const bool sending =
      entry.transfer == Transfer::send_activation || entry.transfer == Transfer::send_gradient;
  const PlanBufferId buffer = plan_.pipeline.buffer_of(entry.transfer, entry.chunk);
  MT_CHECK(buffer >= 0, "a transfer of a stage without that neighbour");
  check_slot(entry.slot);
  const ActivationStash::Entry* stashed = plan_.stash.find(buffer, entry.chunk);
  MT_CHECK(stashed != nullptr, "a boundary buffer outside the activation slots");
  const PlanBuffer& planned = plan_.buffers[static_cast<size_t>(buffer)];
  const TensorView memory = stashed_view(*stashed, entry.slot);
  const std::string name = std::string(sending ? "send " : "receive ") + planned.name + " #" +
                           std::to_string(entry.micro_batch) + (sending ? " to stage " : " from stage ") +
                           std::to_string(entry.peer);
  const TraceScope scope(trace_, name, "collective");
  pipeline_transfers_.wait_touching(memory, trace_);
  pipeline_transfers_.start_one(communicator(MeshAxis::stage), static_cast<int>(entry.peer), memory, sending,
                                name);
}

LossSums Engine::fwd_bwd(const Batch& batch, bool last) {
  MT_CHECK(in_flight_.empty(), "a step started while the previous one's reductions were in flight");
  load_batch(batch);
  overlap_ = last;
  return run(KernelName::fwd_bwd);
}

LossSums Engine::fwd_bwd_accum(const Batch& batch, bool last) {
  load_batch(batch);
  overlap_ = last;
  return run(KernelName::fwd_bwd_accum);
}

void Engine::zero_gradients() {
  MT_CHECK(in_flight_.empty(), "a step started while the previous one's reductions were in flight");
  overlap_ = false;
  run(KernelName::zero_gradients);
}

void Engine::check_slot(int64_t slot) const {
  MT_CHECK(slot >= 0 && slot < plan_.stash.slots, "activation slot " + std::to_string(slot) +
                                                      " of a plan with " + std::to_string(plan_.stash.slots));
}

LossSums Engine::forward(const Batch& batch, int64_t slot, int64_t chunk, int64_t micro_batch) {
  check_slot(slot);
  SlotHolder& holder = slot_holders_[static_cast<size_t>(slot)];
  MT_CHECK(holder.state == SlotState::free, "a forward into activation slot " + std::to_string(slot) +
                                                ", whose micro-batch " + std::to_string(holder.micro_batch) +
                                                "'s backward has not run");
  const SlotScope bound(slot_, chunk_, slot, chunk);
  load_batch(batch);
  overlap_ = false;
  const LossSums sums = with_batch_valid_count(run(KernelName::forward), batch);
  holder = {micro_batch, chunk, SlotState::forward_done};
  return sums;
}

// A backward kernel on the micro-batch in `slot`, which must hold `micro_batch` of `chunk` as `expected`,
// leaving it `after`.
LossSums Engine::run_in_slot(KernelName kernel, int64_t slot, int64_t chunk, int64_t micro_batch,
                             SlotState expected, SlotState after) {
  check_slot(slot);
  SlotHolder& holder = slot_holders_[static_cast<size_t>(slot)];
  if (holder.state != expected || holder.micro_batch != micro_batch || holder.chunk != chunk) {
    const std::string held =
        holder.state == SlotState::free
            ? std::string("no forward")
            : "micro-batch " + std::to_string(holder.micro_batch) + " (chunk " +
                  std::to_string(holder.chunk) +
                  (holder.state == SlotState::forward_done ? ") after its forward" : ") after its B_input");
    MT_CHECK(false, std::string("the ") + kernel_name(kernel) + " of micro-batch " +
                        std::to_string(micro_batch) + " (chunk " + std::to_string(chunk) +
                        ") from activation slot " + std::to_string(slot) + ", which holds " + held);
  }
  const SlotScope bound(slot_, chunk_, slot, chunk);
  overlap_ = false;
  const LossSums sums = run(kernel);
  holder.state = after;
  if (after == SlotState::free) holder = {};
  return sums;
}

LossSums Engine::backward(int64_t slot, int64_t chunk, int64_t micro_batch) {
  return run_in_slot(KernelName::backward, slot, chunk, micro_batch, SlotState::forward_done,
                     SlotState::free);
}

LossSums Engine::backward_input(int64_t slot, int64_t chunk, int64_t micro_batch) {
  return run_in_slot(KernelName::backward_input, slot, chunk, micro_batch, SlotState::forward_done,
                     SlotState::input_gradients_done);
}

LossSums Engine::backward_weight(int64_t slot, int64_t chunk, int64_t micro_batch) {
  return run_in_slot(KernelName::backward_weight, slot, chunk, micro_batch, SlotState::input_gradients_done,
                     SlotState::free);
}

LossSums Engine::eval(const Batch& batch, int64_t slot, int64_t chunk) {
  // A stage plan's eval binds its boundary buffers (and any batch input the stash holds) in a slot.
  MT_CHECK((slot != ProgramEntry::kNoSlot) == (plan_.pipeline.stages > 1),
           "eval's slot: a stage plan's only");
  if (slot != ProgramEntry::kNoSlot) check_slot(slot);
  const SlotScope bound(slot_, chunk_, slot, chunk);
  load_batch(batch);
  return with_batch_valid_count(run(KernelName::eval), batch);
}

// A stage rank without the loss counts the micro-batch's valid tokens itself, from its loss mask: each stage
// rank then holds the step's count (update divides by it), and the loss sum only the last.
LossSums Engine::with_batch_valid_count(LossSums sums, const Batch& batch) const {
  if (plan_.spec.with_head() || chunk_ != 0) return sums;  // once per micro-batch: at the rank's first chunk
  sums.valid_count =
      std::count_if(batch.loss_mask.begin(), batch.loss_mask.end(), [](auto valid) { return valid != 0; });
  return sums;
}

TensorView Engine::decode(int32_t token, int32_t position,
                          const std::vector<std::vector<int32_t>>& engram_hash_ids) {
  view(plan_.spec.tokens).i32()[0] = token;
  view(plan_.spec.positions).i32()[0] = position;
  MT_CHECK(engram_hash_ids.size() == plan_.spec.engram.size(), "one row of hash ids per Engram layer");
  for (size_t layer = 0; layer < engram_hash_ids.size(); ++layer) {
    const TensorView ids = view(plan_.spec.engram[layer].hash_ids);
    MT_CHECK(static_cast<int64_t>(engram_hash_ids[layer].size()) == ids.elements(), "hash ids of one token");
    std::copy(engram_hash_ids[layer].begin(), engram_hash_ids[layer].end(), ids.i32());
  }
  run(KernelName::decode);
  return view(plan_.spec.logits);
}

UpdateResult Engine::update(int64_t valid_count, double learning_rate, int64_t step) {
  UpdateState state;
  state.global_valid_count = valid_count;  // the plan's all-reduces make it global
  state.learning_rate = learning_rate;
  state.step = step;
  state.norm_slots.assign(static_cast<size_t>(plan_.spec.norm_slots), 0.0);
  run(KernelName::update, &state);
  return {state.raw_grad_norm, state.grad_norm, state.nonfinite};
}

}  // namespace meshtrain
