#include "meshtrain/train/engine.h"

#include <cmath>
#include <cstring>

#include "meshtrain/core/error.h"
#include "meshtrain/core/rng.h"
#include "meshtrain/kernels/cpu/adamw.h"
#include "meshtrain/train/trace.h"

namespace meshtrain {
namespace {

class ArenaContext : public OpContext {
 public:
  explicit ArenaContext(const Engine& engine) : engine_(engine) {}
  TensorView view(BufferId id) const override { return engine_.view(id); }

 private:
  const Engine& engine_;
};

// The CPU kernels run float32 only; bf16 configs can be planned but not run here yet.
const ModelSpec& require_runnable(const ModelSpec& spec) {
  const Config& c = spec.config;
  if (c.dtype != DType::f32 || c.weight_dtype != DType::f32) {
    fail("config keys 'dtype' / 'weight_dtype'", "float32 for a run on the CPU kernels",
         dtype_config_name(c.dtype) + " / " + dtype_config_name(c.weight_dtype),
         "set dtype=float32 weight_dtype=float32");
  }
  if (c.remat_policy != "none") {
    fail("config key 'remat_policy'", "none (the only policy the engine runs so far)",
         "'" + c.remat_policy + "'");
  }
  return spec;
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

Engine::Engine(ModelSpec spec)
    : spec_(std::move(require_runnable(spec))), plan_(plan_arena(spec_)), arena_(plan_.total_bytes) {
  initialize_parameters();
}

TensorView Engine::view(BufferId id) const {
  const BufferDecl& buffer = spec_.buffer(id);
  return {arena_.at(plan_.offsets.at(static_cast<size_t>(id))), buffer.dtype, buffer.shape};
}

void Engine::initialize_parameters() {
  const uint64_t seed = static_cast<uint64_t>(spec_.config.init_weights_seed);
  for (const ParameterDecl& parameter : spec_.parameters) {
    float* values = view(parameter.value).f32();
    const int64_t count = spec_.buffer(parameter.value).shape.elements();
    const PhiloxKey key = philox_key(seed, parameter.canonical_name);
    const float constant = parameter.init == ParameterInit::ones ? 1.0f : 0.0f;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      values[i] = parameter.init == ParameterInit::normal
                      ? static_cast<float>(parameter.init_std * normal_at(key, static_cast<uint64_t>(i)))
                      : constant;
    }
    std::memset(view(parameter.adam_m).data, 0, view(parameter.adam_m).bytes());
    std::memset(view(parameter.adam_v).data, 0, view(parameter.adam_v).bytes());
  }
}

void Engine::load_batch(const Batch& batch) {
  const ModelDims& m = spec_.dims;
  copy_field(view(spec_.tokens), batch.tokens, "tokens", m.N);
  copy_field(view(spec_.targets), batch.targets, "targets", m.N);
  copy_field(view(spec_.positions), batch.positions, "positions", m.N);
  copy_field(view(spec_.segment_ids), batch.segment_ids, "segment_ids", m.N);
  copy_field(view(spec_.loss_mask), batch.loss_mask, "loss_mask", m.N);
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

LossSums Engine::run(const std::vector<const std::vector<OpDecl>*>& op_lists) {
  LossSums sums;
  ArenaContext context(*this);
  context.loss_sums = &sums;
  for (const std::vector<OpDecl>* ops : op_lists) {
    for (const OpDecl& op : *ops) {
      const TraceScope scope(trace_, op.name, "op");
      op.run(context);
    }
  }
  return sums;
}

void Engine::zero_gradients() {
  for (const ParameterDecl& parameter : spec_.parameters) {
    const TensorView gradient = view(parameter.gradient);
    std::memset(gradient.data, 0, gradient.bytes());
  }
}

LossSums Engine::fwd_bwd(const Batch& batch) {
  zero_gradients();
  return fwd_bwd_accum(batch);
}

LossSums Engine::fwd_bwd_accum(const Batch& batch) {
  load_batch(batch);
  return run({&spec_.forward, &spec_.loss_backward});
}

LossSums Engine::eval(const Batch& batch) {
  load_batch(batch);
  return run({&spec_.forward, &spec_.loss_forward});
}

UpdateResult Engine::update(int64_t global_valid_count, double learning_rate, int64_t step) {
  const Config& c = spec_.config;
  double sum_of_squares = 0.0;
  for (const ParameterDecl& parameter : spec_.parameters) {
    const TensorView gradient = view(parameter.gradient);
    sum_of_squares += kernels::sum_of_squares(gradient.f32(), gradient.elements());
  }
  UpdateResult result;
  // With no valid target the gradient is zero: the step still decays weights and advances the moments.
  const double token_scale = global_valid_count > 0 ? 1.0 / static_cast<double>(global_valid_count) : 0.0;
  result.raw_grad_norm = std::sqrt(sum_of_squares) * token_scale;
  double clip = 1.0;
  if (c.gradient_clipping_threshold > 0.0 && result.raw_grad_norm > c.gradient_clipping_threshold) {
    clip = c.gradient_clipping_threshold / result.raw_grad_norm;
  }
  result.grad_norm = result.raw_grad_norm * clip;
  const kernels::AdamWStep adam{static_cast<float>(learning_rate),       static_cast<float>(c.adam_b1),
                                static_cast<float>(c.adam_b2),           static_cast<float>(c.adam_eps),
                                static_cast<float>(c.adam_weight_decay), step + 1,
                                static_cast<float>(token_scale * clip)};
  for (const ParameterDecl& parameter : spec_.parameters) {
    const TensorView value = view(parameter.value);
    kernels::adamw_update(value.f32(), view(parameter.gradient).f32(), view(parameter.adam_m).f32(),
                          view(parameter.adam_v).f32(), value.elements(), adam, parameter.weight_decay);
  }
  return result;
}

}  // namespace meshtrain
