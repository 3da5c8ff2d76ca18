// AdamW's step op (see adamw.h).
#include "meshtrain/optim/adamw.h"

#include <algorithm>
#include <functional>

namespace meshtrain {

std::vector<std::string> adamw_moment_names() {
  return {"adam_m", "adam_v"};
}

OpDecl adamw_step_op(const ModelSpec& spec, const Config& config, size_t parameter,
                     const ParameterState& state, const ParameterGroup& group) {
  const ParameterDecl& decl = spec.parameters[parameter];
  const BufferId value = decl.value, gradient = decl.gradient, m = state.moments.at(0),
                 v = state.moments.at(1);
  const int64_t count = spec.buffer(value).shape.elements();
  const float b1 = static_cast<float>(config.adam_b1), b2 = static_cast<float>(config.adam_b2),
              eps = static_cast<float>(config.adam_eps);
  const std::vector<bool> weight_decay = state.weight_decay;
  const auto decay = static_cast<float>(group.weight_decay_rate);
  const double learning_rate_multiplier = group.learning_rate_multiplier;
  // Beside Muon, AdamW is optax.contrib.muon's: Nesterov's first moment (its default, nesterov=True).
  const bool nesterov = config.opt_type == OptimizerType::muon;
  std::vector<BufferId> touched = {value, m, v};
  if (state.master != kNoBuffer) touched.push_back(state.master);
  std::vector<BufferId> reads = touched;
  reads.push_back(gradient);
  OpDecl op{"optimizer/adamw/" + decl.canonical_name,
            reads,
            touched,
            12.0 * static_cast<double>(count),
            [=](const OpContext& context) {
              const UpdateState& u = *context.update;
              if (u.nonfinite)
                return;  // a NaN or infinity anywhere: the step leaves every parameter as it was
              const kernels::AdamWStep adam{static_cast<float>(u.learning_rate * learning_rate_multiplier),
                                            b1,
                                            b2,
                                            eps,
                                            decay,
                                            u.step + 1,
                                            static_cast<float>(u.gradient_scale),
                                            nesterov};
              // Sizes come from the views: under FSDP or ZeRO-1 the plan binds this op to shards. A stacked
              // parameter's shard is its layers' blocks one after another, each with its layer's decay.
              const TensorView shard = context.view(value);
              const bool uniform = std::adjacent_find(weight_decay.begin(), weight_decay.end(),
                                                      std::not_equal_to<>()) == weight_decay.end();
              const size_t blocks = uniform ? 1 : weight_decay.size();
              const int64_t block = shard.elements() / static_cast<int64_t>(blocks);
              for (size_t i = 0; i < blocks; ++i) {
                const int64_t offset = static_cast<int64_t>(i) * block;
                context.kernels->adamw_update(shard.f32() + offset, context.f32(gradient) + offset,
                                              context.f32(m) + offset, context.f32(v) + offset, block, adam,
                                              weight_decay[i]);
              }
            },
            OpKind::optimizer};
  op.role = OpRole::adamw;
  op.parameter = static_cast<int32_t>(parameter);
  return op;
}

}  // namespace meshtrain
