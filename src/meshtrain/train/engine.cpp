#include "meshtrain/train/engine.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/cpu/adamw.h"
#include "meshtrain/train/trace.h"

namespace meshtrain {
namespace {

// The CPU kernels run float32 on one process so far: other dtypes and meshes can be planned
// (meshtrain compile) but not run here yet.
TrainingPlan require_runnable(TrainingPlan plan) {
  const Config& c = plan.spec.config;
  for (const auto& [key, dtype] :
       {std::pair{"dtype", c.dtype}, std::pair{"weight_dtype", c.weight_dtype},
        std::pair{"grad_dtype", c.grad_dtype}, std::pair{"mu_dtype", c.mu_dtype}}) {
    if (dtype != DType::f32) {
      fail(std::string("config key '") + key + "'", "float32 for a run on the CPU kernels",
           dtype_config_name(dtype),
           std::string("set ") + key + "=float32 (meshtrain compile plans other dtypes)");
    }
  }
  if (plan.mesh.devices() != 1) {
    fail("config key 'mesh'", "one device for a run in one process", plan.mesh.to_string(),
         "multi-process training is not built yet; plan this mesh with meshtrain compile");
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
  if (plan.topology.device_kind != "cpu") {
    fail("config key 'topology'", "a cpu topology for a run on this machine", "'" + plan.topology.name + "'",
         "use topology=cpu to train here; meshtrain compile plans other topologies");
  }
  return plan;
}

TrainingPlan plan_for_one_process(const Config& config) {
  PlanRequest request;
  request.config = config;
  request.devices = 1;
  return plan_training(request);
}

template <class T>
void copy_field(const TensorView& destination, const std::vector<T>& source, const char* field,
                int64_t expected) {
  if (static_cast<int64_t>(source.size()) != expected) {
    fail(std::string("batch field '") + field + "'", std::to_string(expected) + " values (B x S)",
         std::to_string(source.size()));
  }
  std::memcpy(destination.data, source.data(), source.size() * sizeof(T));
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
      return {engine_.arena_.at(op_->offsets[i]), buffer.dtype, buffer.shape};
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

Engine::Engine(TrainingPlan plan) : plan_(require_runnable(std::move(plan))), arena_(plan_.arena_bytes) {
  omp_set_num_threads(static_cast<int>(plan_.threads));
  initialize_parameters();
}

TensorView Engine::view(BufferId id) const {
  const PlanBuffer& buffer = plan_.buffers.at(static_cast<size_t>(id));
  if (buffer.persistent) return {arena_.at(buffer.offset), buffer.dtype, buffer.shape};
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

// Each element takes the value of its index in the global tensor, so any mesh starts from the same weights.
void Engine::initialize_parameters() {
  const uint64_t seed = static_cast<uint64_t>(plan_.spec.config.init_weights_seed);
  for (size_t p = 0; p < plan_.spec.parameters.size(); ++p) {
    const ParameterDecl& parameter = plan_.spec.parameters[p];
    const PlanBuffer& store = plan_.buffers[static_cast<size_t>(plan_.storage[p].value_store)];
    const GlobalIndex global_index(store.shape, store.sharding,
                                   global_dims(plan_, plan_.spec.buffer(parameter.value).shape), plan_.mesh,
                                   coordinates_);
    float* values = view(plan_.storage[p].value_store).f32();
    const int64_t count = store.shape.elements();
    const PhiloxKey key = philox_key(seed, parameter.canonical_name);
    const float constant = parameter.init == ParameterInit::ones ? 1.0f : 0.0f;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      values[i] = parameter.init == ParameterInit::normal
                      ? static_cast<float>(parameter.init_std *
                                           normal_at(key, static_cast<uint64_t>(global_index(i))))
                      : constant;
    }
    std::memset(view(parameter.adam_m).data, 0, view(parameter.adam_m).bytes());
    std::memset(view(parameter.adam_v).data, 0, view(parameter.adam_v).bytes());
  }
}

void Engine::load_batch(const Batch& batch) {
  const ModelDims& m = plan_.spec.dims;
  copy_field(view(plan_.spec.tokens), batch.tokens, "tokens", m.N);
  copy_field(view(plan_.spec.targets), batch.targets, "targets", m.N);
  copy_field(view(plan_.spec.positions), batch.positions, "positions", m.N);
  copy_field(view(plan_.spec.segment_ids), batch.segment_ids, "segment_ids", m.N);
  copy_field(view(plan_.spec.loss_mask), batch.loss_mask, "loss_mask", m.N);
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
}

LossSums Engine::run(KernelName name, UpdateState* update) {
  const KernelPlan& kernel = plan_.kernel(name);
  if (poison_temporaries_) {
    float* temporaries = reinterpret_cast<float*>(arena_.at(plan_.persistent_bytes));
    std::fill(temporaries, temporaries + (plan_.arena_bytes - plan_.persistent_bytes) / sizeof(float),
              std::numeric_limits<float>::quiet_NaN());
  }
  LossSums sums;
  PlannedOpContext context(*this, nullptr);
  context.loss_sums = &sums;
  context.update = update;
  for (const PlanOp& op : kernel.ops) {
    const TraceScope scope(trace_, op.op->name, op.recompute ? "recompute" : "op");
    MT_CHECK(op.op->run != nullptr, "op '" + op.op->name + "' cannot run in one process");
    context.set_op(&op);
    op.op->run(context);
  }
  last_kernel_ = &kernel;
  return sums;
}

LossSums Engine::fwd_bwd(const Batch& batch) {
  load_batch(batch);
  return run(KernelName::fwd_bwd);
}

LossSums Engine::fwd_bwd_accum(const Batch& batch) {
  load_batch(batch);
  return run(KernelName::fwd_bwd_accum);
}

LossSums Engine::eval(const Batch& batch) {
  load_batch(batch);
  return run(KernelName::eval);
}

UpdateResult Engine::update(int64_t global_valid_count, double learning_rate, int64_t step) {
  UpdateState state;
  state.global_valid_count = global_valid_count;
  state.learning_rate = learning_rate;
  state.step = step;
  run(KernelName::update, &state);
  return {state.raw_grad_norm, state.grad_norm};
}

}  // namespace meshtrain
