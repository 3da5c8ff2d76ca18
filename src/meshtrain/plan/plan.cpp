#include "meshtrain/plan/plan.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "meshtrain/core/arena.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

using json = nlohmann::ordered_json;

// The config keys a plan depends on (plan files record them, so train and compile with the same model,
// mesh, topology and micro-batch give identical plans whatever else the run config says).
const std::vector<std::string>& plan_keys() {
  static const std::vector<std::string> keys = {"decoder_block",
                                                "base_emb_dim",
                                                "base_num_query_heads",
                                                "base_num_kv_heads",
                                                "head_dim",
                                                "base_mlp_dim",
                                                "base_num_decoder_layers",
                                                "vocab_size",
                                                "max_position_embeddings",
                                                "logits_via_embedding",
                                                "max_target_length",
                                                "dtype",
                                                "weight_dtype",
                                                "grad_dtype",
                                                "mu_dtype",
                                                "remat_policy",
                                                "per_device_batch_size",
                                                "gradient_accumulation_steps",
                                                "shard_optimizer_over_data",
                                                "logical_axis_rules.batch",
                                                "logical_axis_rules.length",
                                                "logical_axis_rules.embed",
                                                "logical_axis_rules.heads",
                                                "logical_axis_rules.kv_heads",
                                                "logical_axis_rules.head_dim",
                                                "logical_axis_rules.mlp",
                                                "logical_axis_rules.vocab",
                                                "logical_axis_rules.positions"};
  return keys;
}

std::string fnv1a_hex(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char byte : text) {
    hash ^= byte;
    hash *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(hash));
  return out;
}

PlanIdentity plan_identity(const Config& config, const Mesh& mesh, const Topology& topology,
                           int64_t threads) {
  PlanIdentity identity;
  for (const std::string& key : plan_keys()) {
    const auto found = std::find_if(config.resolved.begin(), config.resolved.end(),
                                    [&](const auto& entry) { return entry.first == key; });
    // Configs built in code (tests) have no resolved text: those keys are recorded empty.
    identity.keys.emplace_back(key, found == config.resolved.end() ? "" : found->second);
  }
  identity.keys.emplace_back("topology", topology.name);
  for (MeshAxis axis : kMeshAxes)
    identity.keys.emplace_back(std::string("mesh.") + mesh_axis_name(axis), std::to_string(mesh.size(axis)));
  identity.keys.emplace_back("threads", std::to_string(threads));
  std::string text;
  for (const auto& [key, value] : identity.keys) text += key + "=" + value + "\n";
  identity.hash = fnv1a_hex(text);
  return identity;
}

bool contains(const std::vector<BufferId>& ids, BufferId id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

size_t buffer_bytes(const Shape& shape, DType dtype) {
  return static_cast<size_t>(shape.elements()) * dtype_bytes(dtype);
}

std::string layer_of(const std::string& name) {
  // "adam_m/decoder/layers_3/mlp/wo/kernel" -> "decoder/layers_3"; "token_embedder/out" -> "token_embedder"
  const size_t layers = name.find("layers_");
  if (layers != std::string::npos) return "decoder/" + name.substr(layers, name.find('/', layers) - layers);
  for (const char* top : {"token_embedder", "position_embedder", "decoder/decoder_norm",
                          "decoder/logits_dense", "loss", "optimizer", "batch", "scratch"}) {
    if (name.find(top) != std::string::npos) return top;
  }
  return "other";
}

// Builds the plan of one model on one mesh.
class Planner {
 public:
  explicit Planner(TrainingPlan& plan) : plan_(plan), spec_(plan.spec) {}

  void declare_buffers();
  KernelPlan plan_kernel(KernelName kernel);
  void finish();

 private:
  struct Step {  // an op in kernel order, before binding
    const OpDecl* op;
    bool recompute;
    std::vector<std::pair<BufferId, PlanBufferId>> buffers;
  };
  PlanBufferId add_buffer(PlanBuffer buffer) {
    buffer.bytes = buffer_bytes(buffer.shape, buffer.dtype);
    if (buffer.layer.empty()) buffer.layer = layer_of(buffer.name);
    plan_.buffers.push_back(std::move(buffer));
    return static_cast<PlanBufferId>(plan_.buffers.size() - 1);
  }
  const OpDecl* own_op(OpDecl op) {
    plan_.plan_ops.push_back(std::move(op));
    return &plan_.plan_ops.back();
  }
  // A collective op. `outer` > 1: the shards are strided in the full buffer; `accumulate`: a reduce-scatter
  // adds into its (persistent) shard. Either needs a staging buffer, planned like any temporary.
  // `group`: ranks in the group (0: the whole axis).
  const OpDecl* collective_op(const std::string& name, CollectiveKind kind, MeshAxis axis, BufferId buffer,
                              BufferId shard, int64_t outer = 1, bool accumulate = false, int64_t group = 0) {
    OpDecl op{name,
              {},
              {},
              0.0,
              nullptr,
              OpKind::collective,
              {kind, axis, group > 0 ? group : plan_.mesh.size(axis), buffer, shard}};
    op.collective.outer = outer;
    op.reads = {kind == CollectiveKind::all_gather ? shard : buffer};
    op.writes = {kind == CollectiveKind::reduce_scatter ? shard : buffer};
    if (accumulate) op.reads.push_back(shard);
    const PlanBuffer& full = plan_.buffers[static_cast<size_t>(buffer)];
    size_t staging_elements = outer > 1 ? static_cast<size_t>(full.shape.elements()) : 0;
    if (accumulate)
      staging_elements += static_cast<size_t>(plan_.buffers[static_cast<size_t>(shard)].shape.elements());
    if (staging_elements > 0) {
      const std::string staging_name = "staging/" + name;
      op.collective.staging =
          add_buffer(PlanBuffer{staging_name,
                                BufferKind::communication,
                                full.dtype,
                                shape_of({{"elements", static_cast<int64_t>(staging_elements)}}),
                                {DimSharding{}}});
      op.writes.push_back(op.collective.staging);
    }
    return own_op(std::move(op));
  }
  // ZeRO-1 with a strided shard: copies this data rank's blocks of the parameter into the shard buffer.
  const OpDecl* slice_op(const ParameterStorage& store, const std::string& name) {
    const BufferId full = store.value_store, shard = store.value_data_shard;
    const int64_t outer = store.data_outer, ranks = plan_.mesh.data;
    return own_op({"zero1/slice/" + name,
                   {full},
                   {shard},
                   0.0,
                   [=](const OpContext& context) {
                     const TensorView shard_view = context.view(shard);
                     const float* from = context.f32(full);
                     float* to = shard_view.f32();
                     const int64_t block = shard_view.elements() / outer;
                     for (int64_t o = 0; o < outer; ++o) {
                       std::memcpy(to + o * block, from + (o * ranks + context.coordinates.data) * block,
                                   static_cast<size_t>(block) * sizeof(float));
                     }
                   },
                   OpKind::memory});
  }
  // Elements before the dim of `store` that `axis` splits (beyond the compute layout): 1 when shards are
  // contiguous blocks of the full buffer.
  int64_t shard_outer(const PlanBuffer& store, MeshAxis axis, const Shape& full) const {
    int64_t outer = 1;
    for (size_t i = 0; i < store.sharding.size(); ++i) {
      const std::vector<MeshAxis>& axes = store.sharding[i].axes;
      if (std::find(axes.begin(), axes.end(), axis) != axes.end()) return outer;
      outer *= full.dims[i];
    }
    return 1;
  }
  Step step_of(const OpDecl* op, bool recompute = false) const {
    Step step{op, recompute, {}};
    std::set<BufferId> seen;
    for (const std::vector<BufferId>* ids : {&op->reads, &op->writes}) {
      for (BufferId id : *ids) {
        if (seen.insert(id).second) step.buffers.emplace_back(id, id);
      }
    }
    return step;
  }
  std::vector<Step> backward_with_recompute() const;
  std::vector<Step> insert_fsdp(const std::vector<std::vector<const OpDecl*>>& phases,
                                const std::vector<std::vector<bool>>& recompute, bool with_gradients);
  std::vector<Step> update_steps();
  bool saved(BufferId id, const LayerBlock& block, const std::set<BufferId>& outside) const;
  // The mesh axes over which gradient shards differ, so their squared norms are summed over them.
  std::vector<MeshAxis> norm_axes() const {
    std::vector<MeshAxis> axes;
    if (spec_.config.shard_optimizer_over_data && plan_.mesh.data > 1) axes.push_back(MeshAxis::data);
    if (plan_.mesh.fsdp > 1) axes.push_back(MeshAxis::fsdp);
    if (plan_.mesh.tensor > 1) axes.push_back(MeshAxis::tensor);
    return axes;
  }

  TrainingPlan& plan_;
  const ModelSpec& spec_;
  std::vector<ParameterStorage>& storage_ = plan_.storage;
  const OpDecl* zero_gradients_ = nullptr;
};

void Planner::declare_buffers() {
  const Mesh& mesh = plan_.mesh;
  const ShardingLayout& sharding = spec_.sharding;
  for (const BufferDecl& decl : spec_.buffers) {
    PlanBuffer buffer{decl.name, decl.kind, decl.dtype, decl.shape, sharding.compute_layout(decl.shape).dims};
    buffer.persistent = decl.kind == BufferKind::parameter || decl.kind == BufferKind::gradient ||
                        decl.kind == BufferKind::optimizer_state || decl.kind == BufferKind::step_counter ||
                        decl.kind == BufferKind::cache || decl.kind == BufferKind::input;
    if (decl.kind == BufferKind::optimizer_state) {
      const TensorSharding layout =
          sharding.storage_layout(decl.shape, spec_.config.shard_optimizer_over_data);
      buffer.shape = layout.local;
      buffer.sharding = layout.dims;
    }
    add_buffer(std::move(buffer));
  }
  for (const ParameterDecl& parameter : spec_.parameters) {
    ParameterStorage store{parameter.value, parameter.gradient, false, -1, -1, 1};
    const BufferDecl& value = spec_.buffer(parameter.value);
    const TensorSharding fsdp = sharding.storage_layout(value.shape, false);
    if (fsdp.local.elements() != value.shape.elements()) {
      // FSDP: the shard persists; the full (tensor-local) value and gradient exist only around their uses.
      store.gathered = true;
      for (PlanBufferId id : {parameter.value, parameter.gradient}) {
        PlanBuffer& full = plan_.buffers[static_cast<size_t>(id)];
        PlanBuffer shard{"fsdp_shard/" + full.name, full.kind, full.dtype, fsdp.local, fsdp.dims};
        shard.persistent = true;
        full.kind = BufferKind::communication;
        full.persistent = false;
        const PlanBufferId shard_id = add_buffer(std::move(shard));
        (id == parameter.value ? store.value_store : store.gradient_store) = shard_id;
      }
    }
    if (spec_.config.shard_optimizer_over_data && mesh.data > 1) {
      const TensorSharding zero1 = sharding.storage_layout(value.shape, true);
      if (zero1.local.elements() * mesh.data == fsdp.local.elements()) {
        const PlanBuffer value_store = plan_.buffers[static_cast<size_t>(store.value_store)];
        const PlanBuffer gradient_store = plan_.buffers[static_cast<size_t>(store.gradient_store)];
        store.data_outer =
            shard_outer(PlanBuffer{"", BufferKind::parameter, value_store.dtype, zero1.local, zero1.dims},
                        MeshAxis::data, fsdp.local);
        // A contiguous shard is this rank's slot of the parameter; a strided one (a dim after a tensor-split
        // dim) is copied out into a temporary before AdamW.
        PlanBuffer value_shard{"data_shard/" + value_store.name,
                               store.data_outer == 1 ? BufferKind::parameter : BufferKind::communication,
                               value_store.dtype, zero1.local, zero1.dims};
        if (store.data_outer == 1) value_shard.part_of = store.value_store;
        store.value_data_shard = add_buffer(std::move(value_shard));
        // A contiguous gradient shard persists, so its reduce-scatter can start during the last micro-batch's
        // backward; a strided one goes through a staging buffer in update.
        PlanBuffer gradient_shard{"data_shard/" + gradient_store.name, BufferKind::communication,
                                  gradient_store.dtype, zero1.local, zero1.dims};
        gradient_shard.persistent = store.data_outer == 1;
        store.gradient_data_shard = add_buffer(std::move(gradient_shard));
      }
    }
    storage_.push_back(store);
  }
  // Persistent region: parameters, gradients, optimizer state, step counter (decode: caches), then the batch.
  size_t offset = 0;
  for (BufferKind kind :
       {BufferKind::parameter, BufferKind::gradient, BufferKind::optimizer_state, BufferKind::step_counter,
        BufferKind::cache, BufferKind::input, BufferKind::communication}) {
    for (PlanBuffer& buffer : plan_.buffers) {
      if (!buffer.persistent || buffer.kind != kind) continue;
      buffer.offset = offset;
      offset += align_up(buffer.bytes);
    }
  }
  plan_.persistent_bytes = offset;
  for (PlanBuffer& buffer : plan_.buffers) {
    if (buffer.part_of >= 0) buffer.offset = plan_.buffers[static_cast<size_t>(buffer.part_of)].offset;
  }

  if (spec_.decoding()) return;  // no gradients to zero
  std::vector<BufferId> gradient_stores;
  for (const ParameterStorage& store : storage_) gradient_stores.push_back(store.gradient_store);
  OpDecl zero{"optimizer/zero_gradients", gradient_stores, gradient_stores, 0.0, nullptr, OpKind::memory};
  zero.run = [gradient_stores](const OpContext& context) {
    for (BufferId id : gradient_stores) {
      const TensorView gradient = context.view(id);
      std::memset(gradient.data, 0, gradient.bytes());
    }
  };
  zero_gradients_ = own_op(std::move(zero));
}

// Under `full`, a block keeps only what other blocks read (its input and output on the residual stream);
// `minimal` also keeps what matmuls and attention wrote. Everything else its backward reads is recomputed.
bool Planner::saved(BufferId id, const LayerBlock& block, const std::set<BufferId>& outside) const {
  const std::string& policy = spec_.config.remat_policy;
  if (policy == "none" || spec_.buffer(id).kind != BufferKind::activation || outside.count(id)) return true;
  if (policy == "minimal") {
    for (size_t i = block.forward_begin; i < block.forward_end; ++i) {
      const OpDecl& op = spec_.forward[i];
      if ((op.kind == OpKind::matmul || op.kind == OpKind::attention) && contains(op.writes, id)) return true;
    }
  }
  return false;
}

std::vector<Planner::Step> Planner::backward_with_recompute() const {
  std::vector<Step> steps;
  std::vector<const LayerBlock*> starting(spec_.loss_backward.size() + 1, nullptr);
  if (spec_.config.remat_policy != "none") {
    for (const LayerBlock& block : spec_.blocks) starting[block.backward_begin] = &block;
  }
  // How many ops touch each buffer; a block's own ops are subtracted to find what others touch.
  std::vector<int32_t> touches(spec_.buffers.size(), 0);
  const auto count = [&](const OpDecl& op, int32_t delta) {
    std::set<BufferId> unique(op.reads.begin(), op.reads.end());
    unique.insert(op.writes.begin(), op.writes.end());
    for (BufferId id : unique) touches[static_cast<size_t>(id)] += delta;
  };
  for (const std::vector<OpDecl>* ops : {&spec_.forward, &spec_.loss_backward, &spec_.loss_forward}) {
    for (const OpDecl& op : *ops) count(op, 1);
  }
  for (size_t i = 0; i < spec_.loss_backward.size(); ++i) {
    if (const LayerBlock* block = starting[i]) {
      // Buffers some op outside this block touches.
      for (size_t f = block->forward_begin; f < block->forward_end; ++f) count(spec_.forward[f], -1);
      for (size_t b = block->backward_begin; b < block->backward_end; ++b) count(spec_.loss_backward[b], -1);
      std::set<BufferId> outside;
      for (size_t id = 0; id < touches.size(); ++id) {
        if (touches[id] > 0) outside.insert(static_cast<BufferId>(id));
      }
      for (size_t f = block->forward_begin; f < block->forward_end; ++f) count(spec_.forward[f], 1);
      for (size_t b = block->backward_begin; b < block->backward_end; ++b) count(spec_.loss_backward[b], 1);
      // Recompute every forward op of the block that writes a needed buffer, closing over their inputs.
      std::set<BufferId> needed;
      for (size_t b = block->backward_begin; b < block->backward_end; ++b) {
        for (BufferId id : spec_.loss_backward[b].reads) {
          if (!saved(id, *block, outside)) needed.insert(id);
        }
      }
      std::vector<bool> chosen(block->forward_end - block->forward_begin, false);
      for (bool grew = true; grew;) {
        grew = false;
        for (size_t f = block->forward_begin; f < block->forward_end; ++f) {
          const OpDecl& op = spec_.forward[f];
          if (chosen[f - block->forward_begin]) continue;
          if (std::none_of(op.writes.begin(), op.writes.end(), [&](BufferId id) { return needed.count(id); }))
            continue;
          chosen[f - block->forward_begin] = grew = true;
          for (BufferId id : op.reads) {
            if (!saved(id, *block, outside)) needed.insert(id);
          }
        }
      }
      for (size_t f = block->forward_begin; f < block->forward_end; ++f) {
        if (chosen[f - block->forward_begin]) steps.push_back(step_of(&spec_.forward[f], true));
      }
    }
    steps.push_back(step_of(&spec_.loss_backward[i]));
  }
  return steps;
}

// FSDP: gathers each sharded parameter before its first use in each phase (forward, then backward: the full
// copy is freed in between), zeroes its full gradient before the backward's first write, and reduce-scatters
// it into the persistent shard after the last.
std::vector<Planner::Step> Planner::insert_fsdp(const std::vector<std::vector<const OpDecl*>>& phases,
                                                const std::vector<std::vector<bool>>& recompute,
                                                bool with_gradients) {
  std::vector<Step> steps;
  for (size_t p = 0; p < phases.size(); ++p) {
    const std::vector<const OpDecl*>& ops = phases[p];
    std::map<size_t, std::vector<const OpDecl*>> before, after;
    for (size_t k = 0; k < spec_.parameters.size(); ++k) {
      const ParameterDecl& parameter = spec_.parameters[k];
      const ParameterStorage& store = storage_[k];
      if (!store.gathered) continue;
      const std::string& name = parameter.canonical_name;
      size_t first_read = ops.size(), first_write = ops.size(), last_write = 0;
      for (size_t i = 0; i < ops.size(); ++i) {
        if (first_read == ops.size() && contains(ops[i]->reads, parameter.value)) first_read = i;
        if (contains(ops[i]->writes, parameter.gradient)) {
          first_write = std::min(first_write, i);
          last_write = i;
        }
      }
      const int64_t outer = shard_outer(plan_.buffers[static_cast<size_t>(store.value_store)], MeshAxis::fsdp,
                                        spec_.buffer(parameter.value).shape);
      if (first_read < ops.size()) {
        before[first_read].push_back(collective_op("fsdp/gather/" + name + (p == 0 ? "" : "#backward"),
                                                   CollectiveKind::all_gather, MeshAxis::fsdp,
                                                   parameter.value, store.value_store, outer));
      }
      if (with_gradients && first_write < ops.size()) {
        const BufferId full = parameter.gradient;
        before[first_write].push_back(own_op({"fsdp/zero/" + name,
                                              {},
                                              {full},
                                              0.0,
                                              [full](const OpContext& context) {
                                                const TensorView view = context.view(full);
                                                std::memset(view.data, 0, view.bytes());
                                              },
                                              OpKind::memory}));
        after[last_write].push_back(collective_op("fsdp/reduce_scatter/" + name,
                                                  CollectiveKind::reduce_scatter, MeshAxis::fsdp, full,
                                                  store.gradient_store, outer, true));
      }
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      for (const OpDecl* op : before[i]) steps.push_back(step_of(op));
      steps.push_back(step_of(ops[i], recompute[p][i]));
      for (const OpDecl* op : after[i]) steps.push_back(step_of(op));
    }
  }
  return steps;
}

// The update kernel: data-parallel reduction of the gradients (all-reduce, or ZeRO-1's reduce-scatter), the
// global norm (partial sums all-reduced over every axis gradients are split on), the clip, AdamW on the
// local shard, and ZeRO-1's parameter all-gather (which belongs to update, aot-plan.md).
std::vector<Planner::Step> Planner::update_steps() {
  const Mesh& mesh = plan_.mesh;
  std::vector<Step> steps;
  const auto bind = [&](Step step, BufferId spec_id, PlanBufferId plan_id) {
    for (auto& binding : step.buffers) {
      if (binding.first == spec_id) binding.second = plan_id;
    }
    return step;
  };
  const auto stored = [&](Step step, size_t k) {
    step = bind(step, spec_.parameters[k].value, storage_[k].value_store);
    return bind(step, spec_.parameters[k].gradient, storage_[k].gradient_store);
  };
  if (mesh.data * mesh.fsdp * mesh.context > 1) {
    const BufferId count = add_buffer(PlanBuffer{"optimizer/valid_count",
                                                 BufferKind::communication,
                                                 DType::i32,
                                                 shape_of({{"count", 2}}),
                                                 {DimSharding{}}});
    for (MeshAxis axis : {MeshAxis::data, MeshAxis::fsdp, MeshAxis::context}) {
      if (mesh.size(axis) > 1) {
        steps.push_back(
            step_of(collective_op(std::string("optimizer/reduce_valid_count/") + mesh_axis_name(axis),
                                  CollectiveKind::all_reduce, axis, count, kNoBuffer)));
      }
    }
  }
  for (const OpDecl& op : spec_.update) {
    const auto parameter = std::find_if(spec_.parameters.begin(), spec_.parameters.end(), [&](const auto& p) {
      return op.name.ends_with("/" + p.canonical_name) && contains(op.reads, p.gradient);
    });
    if (parameter == spec_.parameters.end()) {
      if (op.name == "optimizer/clip" && !norm_axes().empty()) {
        // 8 bytes: the engine sends the squared norm as one double.
        const BufferId partial = add_buffer(PlanBuffer{"optimizer/norm_partial",
                                                       BufferKind::communication,
                                                       DType::f32,
                                                       shape_of({{"sum", 2}}),
                                                       {DimSharding{}}});
        for (MeshAxis axis : norm_axes()) {
          steps.push_back(
              step_of(collective_op(std::string("optimizer/reduce_grad_norm/") + mesh_axis_name(axis),
                                    CollectiveKind::all_reduce, axis, partial, kNoBuffer)));
        }
      }
      steps.push_back(step_of(&op));
      continue;
    }
    const size_t k = static_cast<size_t>(parameter - spec_.parameters.begin());
    const ParameterStorage& store = storage_[k];
    const bool is_norm = op.name.starts_with("optimizer/grad_norm/");
    if (is_norm && parameter->gradient_partial_over_tensor && mesh.tensor > 1) {
      steps.push_back(
          step_of(collective_op("tensor/all_reduce/" + parameter->canonical_name, CollectiveKind::all_reduce,
                                MeshAxis::tensor, store.gradient_store, kNoBuffer)));
    }
    // A kv head replicated on several tensor ranks: each holds the part of its gradient that its own query
    // heads produced; the replicas sum them.
    const int64_t replicas = kv_replicas(plan_, parameter->value);
    if (is_norm && replicas > 1) {
      steps.push_back(step_of(collective_op("tensor/kv_replicas_all_reduce/" + parameter->canonical_name,
                                            CollectiveKind::all_reduce, MeshAxis::tensor,
                                            store.gradient_store, kNoBuffer, 1, false, replicas)));
    }
    if (store.gradient_data_shard >= 0) {
      const std::string& name = parameter->canonical_name;
      if (is_norm) {
        steps.push_back(step_of(collective_op("zero1/reduce_scatter/" + name, CollectiveKind::reduce_scatter,
                                              MeshAxis::data, store.gradient_store, store.gradient_data_shard,
                                              store.data_outer)));
      }
      if (!is_norm && store.data_outer > 1) steps.push_back(step_of(slice_op(store, name)));
      Step step = bind(bind(step_of(&op), parameter->gradient, store.gradient_data_shard), parameter->value,
                       store.value_data_shard);
      steps.push_back(step);
      if (!is_norm) {
        steps.push_back(
            step_of(collective_op("zero1/gather/" + name, CollectiveKind::all_gather, MeshAxis::data,
                                  store.value_store, store.value_data_shard, store.data_outer)));
      }
      continue;
    }
    if (is_norm && mesh.data > 1) {
      steps.push_back(
          step_of(collective_op("data/all_reduce/" + parameter->canonical_name, CollectiveKind::all_reduce,
                                MeshAxis::data, store.gradient_store, kNoBuffer)));
    }
    steps.push_back(stored(step_of(&op), k));
  }
  return steps;
}

KernelPlan Planner::plan_kernel(KernelName kernel) {
  KernelPlan result;
  result.kernel = kernel;
  std::vector<Step> steps;
  if (kernel == KernelName::update) {
    steps = update_steps();
  } else {
    std::vector<std::vector<const OpDecl*>> phases(2);
    std::vector<std::vector<bool>> recompute(2);
    for (const OpDecl& op : spec_.forward) {
      phases[0].push_back(&op);
      recompute[0].push_back(false);
    }
    // A decode spec's forward ends with its logits: decode is its forward alone (no loss ops exist).
    if (kernel == KernelName::eval || kernel == KernelName::decode) {
      for (const OpDecl& op : spec_.loss_forward) {
        phases[1].push_back(&op);
        recompute[1].push_back(false);
      }
    } else {
      for (const Step& step : backward_with_recompute()) {
        phases[1].push_back(step.op);
        recompute[1].push_back(step.recompute);
      }
    }
    if (kernel == KernelName::fwd_bwd) steps.push_back(step_of(zero_gradients_));
    for (Step& step :
         insert_fsdp(phases, recompute, kernel == KernelName::fwd_bwd || kernel == KernelName::fwd_bwd_accum))
      steps.push_back(std::move(step));
  }
  // Live ranges of temporaries: a write that does not read starts a new value (the old one is dead).
  const int32_t op_count = static_cast<int32_t>(steps.size());
  std::map<PlanBufferId, size_t> current;  // buffer -> index in result.values
  std::vector<std::vector<size_t>> value_of(steps.size());
  for (int32_t i = 0; i < op_count; ++i) {
    const Step& step = steps[static_cast<size_t>(i)];
    for (const auto& [spec_id, plan_id] : step.buffers) {
      const PlanBuffer& buffer = plan_.buffers[static_cast<size_t>(plan_id)];
      if (buffer.persistent || buffer.part_of >= 0) {
        value_of[static_cast<size_t>(i)].push_back(SIZE_MAX);
        continue;
      }
      // Gradients are accumulated into (only the zeroing ops overwrite them).
      const bool declared_gradient = spec_id < static_cast<BufferId>(spec_.buffers.size()) &&
                                     spec_.buffer(spec_id).kind == BufferKind::gradient;
      const bool reads =
          contains(step.op->reads, spec_id) || (declared_gradient && step.op->kind != OpKind::memory);
      const auto found = current.find(plan_id);
      if (!reads || found == current.end()) {
        MT_CHECK(!reads || step.op->kind == OpKind::collective, "op '" + step.op->name + "' reads '" +
                                                                    buffer.name + "' before any op of " +
                                                                    kernel_name(kernel) + " writes it");
        result.values.push_back({plan_id, i, i, 0});
        current[plan_id] = result.values.size() - 1;
      } else {
        result.values[found->second].last_op = i;
      }
      value_of[static_cast<size_t>(i)].push_back(current[plan_id]);
    }
  }

  // Offsets: largest values first, each at the lowest address free over its whole live range.
  std::vector<size_t> order(result.values.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto bytes_of = [&](size_t v) {
    return align_up(plan_.buffers[static_cast<size_t>(result.values[v].buffer)].bytes);
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (bytes_of(a) != bytes_of(b)) return bytes_of(a) > bytes_of(b);
    return result.values[a].first_op < result.values[b].first_op;
  });
  std::vector<size_t> placed;
  size_t temp_extent = 0;
  for (size_t v : order) {
    PlanValue& value = result.values[v];
    std::vector<std::pair<size_t, size_t>> taken;  // [begin, end) of values alive at the same time
    for (size_t other_index : placed) {
      const PlanValue& other = result.values[other_index];
      if (other.last_op < value.first_op || other.first_op > value.last_op) continue;
      const size_t begin = other.offset - plan_.persistent_bytes;  // relative to the temporary region
      taken.emplace_back(begin, begin + bytes_of(other_index));
    }
    std::sort(taken.begin(), taken.end());
    size_t offset = 0;
    for (const auto& [begin, end] : taken) {
      if (begin >= offset + bytes_of(v)) break;
      offset = std::max(offset, end);
    }
    value.offset = plan_.persistent_bytes + offset;
    temp_extent = std::max(temp_extent, offset + bytes_of(v));
    placed.push_back(v);
  }

  // Ops with bindings and costs. Ranks sharing a cpu host share its peaks too.
  const Topology& topology = plan_.topology;
  const double host_share = topology.host_memory_shared ? static_cast<double>(plan_.mesh.devices()) : 1.0;
  std::set<PlanBufferId> arguments;
  for (int32_t i = 0; i < op_count; ++i) {
    const Step& step = steps[static_cast<size_t>(i)];
    PlanOp op{step.op, step.recompute, step.op->flops, 0.0, 0.0, 0.0, 1.0, step.buffers, {}};
    double spec_elements = 0.0, bound_elements = 0.0;
    for (size_t b = 0; b < step.buffers.size(); ++b) {
      const auto [spec_id, plan_id] = step.buffers[b];
      const PlanBuffer& buffer = plan_.buffers[static_cast<size_t>(plan_id)];
      const size_t value_index = value_of[static_cast<size_t>(i)][b];
      op.offsets.push_back(value_index == SIZE_MAX ? buffer.offset : result.values[value_index].offset);
      if (buffer.persistent || buffer.part_of >= 0)
        arguments.insert(buffer.part_of >= 0 ? buffer.part_of : plan_id);
      const double touched =
          (contains(step.op->reads, spec_id) ? 1.0 : 0.0) + (contains(step.op->writes, spec_id) ? 1.0 : 0.0);
      op.bytes_accessed += touched * static_cast<double>(buffer.bytes);
      if (spec_id == plan_id) continue;
      spec_elements += static_cast<double>(spec_.buffer(spec_id).shape.elements());
      bound_elements += static_cast<double>(buffer.shape.elements());
    }
    // An op bound to shards does the shard's share of its work.
    if (spec_elements > 0.0) op.flops *= bound_elements / spec_elements;
    // A gradient replicated over an axis its norm is reduced on counts once over the replicas.
    if (step.op->name.starts_with("optimizer/grad_norm/")) {
      const PlanBuffer& gradient = plan_.buffers[static_cast<size_t>(step.buffers.front().second)];
      for (MeshAxis axis : norm_axes()) {
        if (!gradient.split_over(axis)) op.share /= static_cast<double>(plan_.mesh.size(axis));
      }
      // Replicated kv heads count once over their replicas.
      const BufferId spec_gradient = step.buffers.front().first;
      for (const ParameterDecl& parameter : spec_.parameters) {
        if (parameter.gradient == spec_gradient)
          op.share /= static_cast<double>(kv_replicas(plan_, parameter.value));
      }
    }
    if (step.op->kind == OpKind::collective) {
      const CollectiveDecl& c = step.op->collective;
      const double n = static_cast<double>(c.group);
      const double full = static_cast<double>(plan_.buffers[static_cast<size_t>(c.buffer)].bytes);
      switch (c.kind) {
        case CollectiveKind::all_reduce:
          op.collective_bytes = 2.0 * full * (n - 1.0) / n;
          break;
        case CollectiveKind::all_gather:
        case CollectiveKind::reduce_scatter:
          op.collective_bytes = full * (n - 1.0) / n;
          break;
        case CollectiveKind::send_recv:  // bytes sent
          op.collective_bytes = full;
          break;
        case CollectiveKind::all_to_all:  // bytes leaving the rank: all blocks but its own
          op.collective_bytes = full * (n - 1.0) / n;
          break;
      }
      op.seconds = op.collective_bytes / topology.link_bandwidth(c.group, plan_.mesh.stride(c.axis));
      result.collective_bytes[mesh_axis_name(c.axis)] += op.collective_bytes;
    } else {
      op.seconds = std::max(op.flops / (topology.peak_flops(spec_.config.dtype) / host_share),
                            op.bytes_accessed / (topology.memory_bandwidth / host_share));
    }
    result.flops += op.flops;
    result.bytes_accessed += op.bytes_accessed;
    result.seconds += op.seconds;
    result.ops.push_back(std::move(op));
  }

  // Memory (aot-plan.md): outputs are the arguments a kernel updates (aliases) plus its scalar results.
  MemoryFigures& memory = result.memory;
  for (PlanBufferId id : arguments) {
    const PlanBuffer& buffer = plan_.buffers[static_cast<size_t>(id)];
    memory.arguments += align_up(buffer.bytes);
    const bool updated =
        kernel == KernelName::update ? buffer.kind != BufferKind::input && buffer.kind != BufferKind::gradient
        : kernel == KernelName::decode ? buffer.kind == BufferKind::cache
                                       : kernel != KernelName::eval && buffer.kind == BufferKind::gradient;
    if (updated) memory.aliases += align_up(buffer.bytes);
  }
  const size_t scalar_results = 16;  // loss sum and valid count, or the two norms
  memory.outputs = memory.aliases + scalar_results;
  memory.temps = temp_extent;
  memory.peak = memory.arguments + memory.outputs + memory.temps - memory.aliases;
  return result;
}

void Planner::finish() {
  size_t largest_temps = 0;
  for (const KernelPlan& kernel : plan_.kernels) largest_temps = std::max(largest_temps, kernel.memory.temps);
  plan_.arena_bytes = plan_.persistent_bytes + largest_temps;
}

json shape_json(const PlanBuffer& buffer) {
  json dims = json::array();
  for (size_t i = 0; i < buffer.shape.dims.size(); ++i) {
    json axes = json::array();
    if (i < buffer.sharding.size()) {
      for (MeshAxis axis : buffer.sharding[i].axes) axes.push_back(mesh_axis_name(axis));
    }
    dims.push_back({{"axis", buffer.shape.axes[i]}, {"size", buffer.shape.dims[i]}, {"mesh", axes}});
  }
  return dims;
}

}  // namespace

const char* kernel_name(KernelName kernel) {
  switch (kernel) {
    case KernelName::fwd_bwd:
      return "fwd_bwd";
    case KernelName::fwd_bwd_accum:
      return "fwd_bwd_accum";
    case KernelName::update:
      return "update";
    case KernelName::eval:
      return "eval";
    case KernelName::decode:
      return "decode";
  }
  return "?";
}

KernelName parse_kernel_name(const std::string& name, const std::string& where) {
  for (KernelName kernel : kKernelNames) {
    if (name == kernel_name(kernel)) return kernel;
  }
  fail(where, "kernel names among fwd_bwd, fwd_bwd_accum, update, eval", "'" + name + "'",
       "did you mean '" + closest_name(name, {"fwd_bwd", "fwd_bwd_accum", "update", "eval"}) + "'?");
}

const KernelPlan* TrainingPlan::find(KernelName name) const {
  for (const KernelPlan& plan : kernels) {
    if (plan.kernel == name) return &plan;
  }
  return nullptr;
}

const KernelPlan& TrainingPlan::kernel(KernelName name) const {
  const KernelPlan* found = find(name);
  if (!found)
    fail("config key 'kernels'", std::string("a plan that includes ") + kernel_name(name), "not planned");
  return *found;
}

int64_t kv_replicas(const TrainingPlan& plan, BufferId id) {
  const Shape& shape = plan.spec.buffer(id).shape;
  const int64_t kv_heads = plan.spec.config.base_num_kv_heads;
  for (const std::string& axis : shape.axes) {
    if (axis == "kv_heads" && plan.mesh.tensor > kv_heads) return plan.mesh.tensor / kv_heads;
  }
  return 1;
}

std::vector<int64_t> global_dims(const TrainingPlan& plan, const Shape& local) {
  std::vector<int64_t> dims;
  for (size_t i = 0; i < local.dims.size(); ++i) {
    const std::string& axis = local.axes[i];
    if (axis == "kv_heads") {
      dims.push_back(plan.spec.config.base_num_kv_heads);
    } else if (axis == "vocab") {
      dims.push_back(plan.spec.dims.V_padded);
    } else {
      dims.push_back(local.dims[i] * plan.spec.sharding.compute(axis).degree);
    }
  }
  return dims;
}

DeviceCount resolve_devices(const Config& config, const Topology& topology, int64_t live_ranks) {
  if (live_ranks > 0)
    return {live_ranks, std::to_string(live_ranks) + " process" + (live_ranks > 1 ? "es" : "")};
  if (topology.num_devices > 0) return {topology.num_devices, "topology " + topology.name};
  DeviceCount devices{1, "topology " + topology.name + " with as many ranks as the mesh asks for"};
  for (MeshAxis axis : kMeshAxes) {
    const int64_t size = axis_member(config.mesh, axis);
    if (size < 1) {
      fail("config key 'mesh." + std::string(mesh_axis_name(axis)) + "'",
           "fixed axis sizes on topology '" + topology.name + "' (they give its rank count)",
           std::to_string(size),
           "give every mesh.* axis, or choose a topology with a device count such as h100x8");
    }
    devices.count *= size;
  }
  return devices;
}

int64_t resolve_threads(const Config& config, const Topology& topology, int64_t devices) {
  if (config.num_threads > 0) return config.num_threads;
  if (topology.device_kind != "cpu") return 1;
  const int64_t ranks_on_host = topology.host_memory_shared ? std::max<int64_t>(devices, 1) : 1;
  return std::max<int64_t>(1, omp_get_num_procs() / ranks_on_host);
}

TrainingPlan plan_training(const PlanRequest& request) {
  TrainingPlan plan;
  Config config = request.config;
  const std::string topology_name = request.topology.empty() ? config.topology : request.topology;
  plan.topology = load_topology(topology_name, config.topologies_path);
  const DeviceCount devices = resolve_devices(config, plan.topology, request.devices);
  plan.mesh = resolve_mesh(config.mesh, devices.count, devices.source);
  plan.threads = resolve_threads(config, plan.topology, devices.count);
  config.num_threads = plan.threads;  // the attention backward's scratch is per thread
  plan.identity = plan_identity(config, plan.mesh, plan.topology, plan.threads);
  plan.device_memory_bytes = plan.topology.device_memory_bytes(devices.count);
  if (config.remat_policy != "none" && config.remat_policy != "full" && config.remat_policy != "minimal") {
    fail("config key 'remat_policy'", "none, full or minimal", "'" + config.remat_policy + "'",
         "did you mean '" + closest_name(config.remat_policy, {"none", "full", "minimal"}) + "'?");
  }
  const bool decoding = request.decode_cache_length > 0;
  plan.spec = decoding ? build_decode_spec(config, plan.mesh, request.decode_cache_length)
                       : build_model_spec(config, plan.mesh);
  Planner planner(plan);
  planner.declare_buffers();
  if (decoding) {
    plan.kernels.push_back(planner.plan_kernel(KernelName::decode));
  } else {
    for (KernelName kernel : kKernelNames) {
      if (std::find(request.kernels.begin(), request.kernels.end(), kernel) != request.kernels.end()) {
        plan.kernels.push_back(planner.plan_kernel(kernel));
      }
    }
  }
  planner.finish();
  return plan;
}

std::string serialize_kernel_plan(const TrainingPlan& plan, KernelName name) {
  const KernelPlan& kernel = plan.kernel(name);
  json out;
  out["format"] = "meshtrain-plan";
  out["version"] = 1;
  out["kernel"] = kernel_name(name);
  json keys = json::object();
  for (const auto& [key, value] : plan.identity.keys) keys[key] = value;
  out["identity"] = {{"hash", plan.identity.hash}, {"keys", keys}};
  const Topology& t = plan.topology;
  out["topology"] = {{"name", t.name},
                     {"device_kind", t.device_kind},
                     {"devices", plan.mesh.devices()},
                     {"device_memory_bytes", plan.device_memory_bytes},
                     {"peak_flops", plan.topology.peak_flops(plan.spec.config.dtype)},
                     {"memory_bandwidth", t.memory_bandwidth},
                     {"intra_host_bandwidth", t.intra_host_bandwidth},
                     {"inter_host_bandwidth", t.inter_host_bandwidth}};
  const MemoryFigures& m = kernel.memory;
  out["memory"] = {{"arguments", m.arguments},
                   {"outputs", m.outputs},
                   {"aliases", m.aliases},
                   {"temps", m.temps},
                   {"peak", m.peak},
                   {"persistent", plan.persistent_bytes},
                   {"process_arena", plan.arena_bytes}};
  json collective = json::object();
  for (const auto& [axis, bytes] : kernel.collective_bytes) collective[axis] = bytes;
  out["cost"] = {{"flops", kernel.flops},
                 {"bytes_accessed", kernel.bytes_accessed},
                 {"collective_bytes", collective},
                 {"predicted_seconds", kernel.seconds}};
  std::set<PlanBufferId> touched;
  for (const PlanOp& op : kernel.ops) {
    for (const auto& binding : op.buffers) touched.insert(binding.second);
  }
  json buffers = json::array();
  for (PlanBufferId id : touched) {
    const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(id)];
    json entry = {{"name", buffer.name},
                  {"kind", buffer_kind_name(buffer.kind)},
                  {"dtype", dtype_config_name(buffer.dtype)},
                  {"shape", shape_json(buffer)},
                  {"bytes", buffer.bytes}};
    if (buffer.persistent || buffer.part_of >= 0) {
      entry["offset"] = buffer.offset;
    } else {
      json ranges = json::array();
      for (const PlanValue& value : kernel.values) {
        if (value.buffer == id) ranges.push_back({value.first_op, value.last_op, value.offset});
      }
      entry["live"] = ranges;  // [first op, last op, offset]
    }
    buffers.push_back(entry);
  }
  out["buffers"] = buffers;
  json ops = json::array();
  for (const PlanOp& op : kernel.ops) {
    json entry = {{"name", op.op->name + (op.recompute ? " (recompute)" : "")},
                  {"kind", op_kind_name(op.op->kind)},
                  {"flops", op.flops},
                  {"bytes", op.bytes_accessed},
                  {"seconds", op.seconds}};
    if (op.op->kind == OpKind::collective) {
      const CollectiveDecl& c = op.op->collective;
      entry["collective"] = {{"kind", collective_kind_name(c.kind)},
                             {"axis", mesh_axis_name(c.axis)},
                             {"group", c.group},
                             {"bytes", op.collective_bytes}};
    }
    ops.push_back(entry);
  }
  out["ops"] = ops;
  return out.dump(1) + "\n";
}

std::string plan_file_path(const std::string& stem, KernelName kernel) {
  return stem + "_" + kernel_name(kernel) + ".json";
}

void verify_plan_file(const TrainingPlan& plan, KernelName kernel, const std::string& stem) {
  const std::string path = plan_file_path(stem, kernel);
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    fail(path, std::string("the ") + kernel_name(kernel) + " plan written by meshtrain compile",
         "no such file",
         "run: meshtrain compile <config> plan_out=" + stem + " (with kernels including " +
             kernel_name(kernel) + ")");
  }
  std::stringstream text;
  text << file.rdbuf();
  const std::string expected = serialize_kernel_plan(plan, kernel);
  if (text.str() == expected) return;
  json found;
  try {
    found = json::parse(text.str());
  } catch (const json::exception& error) {
    fail(path, "a plan file (JSON)", error.what(),
         "write it again with meshtrain compile ... plan_out=" + stem);
  }
  if (!found.is_object()) {
    fail(path, "a plan file (a JSON object)", "another JSON value", "write it again with meshtrain compile");
  }
  const json wanted = json::parse(expected);
  const json found_keys = found.value("/identity/keys"_json_pointer, json::object());
  for (const auto& [key, value] : wanted["identity"]["keys"].items()) {
    const bool present = found_keys.is_object() && found_keys.contains(key) && found_keys[key].is_string();
    const std::string have = present ? found_keys[key].get<std::string>() : "(absent)";
    if (have != value.get<std::string>()) {
      fail(path, "a plan for this run (" + key + "=" + value.get<std::string>() + ")",
           "a plan made with " + key + "=" + have,
           "re-run meshtrain compile with this run's settings, or drop plan_in to plan afresh");
    }
  }
  std::string field = "contents";
  for (const char* section : {"topology", "memory", "cost", "buffers", "ops"}) {
    if (found.value(section, json()) != wanted[section]) {
      field = section;
      break;
    }
  }
  fail(path, "the plan this build makes for the same inputs", "a different '" + field + "' section",
       "the file was written by another meshtrain version or machine; write it again with meshtrain compile");
}

}  // namespace meshtrain
