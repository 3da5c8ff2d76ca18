#include "meshtrain/model/spec_builder.h"

#include <cmath>

#include "meshtrain/core/error.h"
#include "meshtrain/model/scan.h"

namespace meshtrain {

BufferId SpecBuilder::add(BufferDecl buffer) {
  for (const BufferDecl& existing : spec_.buffers) {
    MT_CHECK(existing.name != buffer.name, "buffer declared twice: " + buffer.name);
  }
  spec_.buffers.push_back(std::move(buffer));
  return static_cast<BufferId>(spec_.buffers.size() - 1);
}

BufferId SpecBuilder::input(const std::string& name, DType dtype, const Shape& shape) {
  return add({name, BufferKind::input, dtype, shape});
}

BufferId SpecBuilder::activation(const std::string& name, const Shape& shape) {
  return add({name, BufferKind::activation, storage_dtype(), shape});
}

BufferId SpecBuilder::matmul_input(const std::string& name, const Shape& shape) {
  // A decode spec computes in float32 (no rounded inputs), so its activations keep the storage dtype.
  const DType dtype = decoding() ? storage_dtype() : spec_.kernels->matmul_input_dtype(spec_.config.dtype);
  return add({name, BufferKind::activation, dtype, shape});
}

BufferId SpecBuilder::cache(const std::string& name, const Shape& shape) {
  MT_CHECK(decoding(), "cache '" + name + "' declared in a training spec");
  return add({name, BufferKind::cache, storage_dtype(), shape});
}

BufferId SpecBuilder::find(const std::string& name) const {
  for (size_t i = 0; i < spec_.buffers.size(); ++i) {
    if (spec_.buffers[i].name == name) return static_cast<BufferId>(i);
  }
  return kNoBuffer;
}

BufferId SpecBuilder::scratch(const std::string& name, const Shape& shape) {
  for (size_t i = 0; i < spec_.buffers.size(); ++i) {
    const BufferDecl& existing = spec_.buffers[i];
    if (existing.name == name) {
      MT_CHECK(existing.kind == BufferKind::scratch && existing.shape == shape,
               "scratch '" + name + "' redeclared with another shape");
      return static_cast<BufferId>(i);
    }
  }
  return add({name, BufferKind::scratch, storage_dtype(), shape});
}

BufferId SpecBuilder::bf16_inputs_scratch(const std::string& name, int64_t elements) {
  // None when computing in float32, when the backend needs none, and in a decode spec: one token's
  // matmuls would round all of W per token for a product of one row (decoding computes in float32).
  if (spec_.config.dtype != DType::bf16 || elements == 0 || decoding()) return kNoBuffer;
  MT_CHECK(find(name) == kNoBuffer, "bf16 scratch declared twice: " + name);
  return add({name, BufferKind::scratch, DType::bf16, shape_of({{"bf16_elements", elements}})});
}

DType SpecBuilder::storage_dtype() const {
  return spec_.kernels->activation_dtype(spec_.config.dtype);
}

BufferId SpecBuilder::parameter(const std::string& name, const Shape& shape,
                                const ParameterOptions& options) {
  ParameterDecl parameter;
  const Config& c = spec_.config;
  parameter.value = add({name, BufferKind::parameter, c.weight_dtype, shape});
  // What training adds to a value: nothing a decode spec may allocate. The moments come in finish(), once
  // the layout (stacked or per layer) is known.
  if (!decoding()) parameter.gradient = add({"grad/" + name, BufferKind::gradient, c.grad_dtype, shape});
  parameter.canonical_name = name;
  parameter.component = options.component;
  parameter.init = options.init;
  parameter.init_std = options.init_std;
  parameter.weight_decay = options.weight_decay;
  parameter.init_value = options.init_value;
  parameter.learning_rate_multiplier = options.learning_rate_multiplier;
  parameter.weight_decay_rate = options.weight_decay_rate;
  spec_.parameters.push_back(parameter);
  return parameter.value;
}

void SpecBuilder::declare_moments(ParameterDecl& parameter) {
  const Config& c = spec_.config;
  const std::string name = spec_.buffer(parameter.value).name;  // a copy: add() grows the buffer list
  const Shape shape = spec_.buffer(parameter.value).shape;
  parameter.adam_m = add({"adam_m/" + name, BufferKind::optimizer_state, c.mu_dtype, shape});
  parameter.adam_v = add({"adam_v/" + name, BufferKind::optimizer_state, c.mu_dtype, shape});
  if (c.weight_dtype != c.mu_dtype) {
    parameter.master = add({"master/" + name, BufferKind::optimizer_state, c.mu_dtype, shape});
  }
}

BufferId SpecBuilder::gradient_of(BufferId parameter_value) const {
  for (const ParameterDecl& parameter : spec_.parameters) {
    if (parameter.value == parameter_value) return parameter.gradient;
  }
  MT_CHECK(false, "not a parameter: " + spec_.buffer(parameter_value).name);
  return kNoBuffer;
}

void SpecBuilder::backward_group(std::vector<OpDecl> ops) {
  if (decoding()) return;  // nothing trains through a decode step
  LayerBlock block;
  block.forward_begin = blocks_.empty() ? 0 : blocks_.back().forward_end;
  block.forward_end = spec_.forward.size();
  MT_CHECK(block.forward_end > block.forward_begin, "a layer block without forward ops");
  const std::string& first = spec_.forward[block.forward_begin].name;
  block.name = first.substr(0, first.rfind('/'));
  blocks_.push_back(block);
  backward_groups_.push_back(std::move(ops));
}

void SpecBuilder::loss(std::vector<OpDecl> eval_ops, std::vector<OpDecl> train_ops) {
  MT_CHECK(!decoding(), "loss ops declared in a decode spec");
  spec_.loss_forward = std::move(eval_ops);
  spec_.loss_backward = std::move(train_ops);
}

std::vector<OpDecl> SpecBuilder::collective(const std::string& name, CollectiveKind kind, MeshAxis axis,
                                            BufferId buffer, BufferId shard, int64_t group) const {
  const int64_t ranks = group > 0 ? group : spec_.sharding.mesh().size(axis);
  if (ranks == 1) return {};
  OpDecl op{name, {buffer}, {buffer}, 0.0, nullptr, OpKind::collective, {kind, axis, ranks, buffer, shard}};
  if (kind == CollectiveKind::all_gather) op.reads = {shard};
  if (kind == CollectiveKind::reduce_scatter || kind == CollectiveKind::all_to_all) op.writes = {shard};
  return {op};
}

void SpecBuilder::finish() {
  for (size_t i = backward_groups_.size(); i-- > 0;) {
    blocks_[i].backward_begin = spec_.loss_backward.size();
    for (OpDecl& op : backward_groups_[i]) spec_.loss_backward.push_back(std::move(op));
    blocks_[i].backward_end = spec_.loss_backward.size();
  }
  backward_groups_.clear();
  spec_.blocks = std::move(blocks_);
  stack_scan_groups(spec_);
  if (decoding()) return;
  for (ParameterDecl& parameter : spec_.parameters) declare_moments(parameter);
  declare_update();
}

// The update kernel's ops: the step counter, the global gradient norm, the clip, then AdamW per parameter.
// Gradients hold sums over the global batch until here; one scale applies the 1/valid-count and the clip.
void SpecBuilder::declare_update() {
  const Config& c = spec_.config;
  const BufferId counter =
      add({"optimizer/step", BufferKind::step_counter, DType::i32, shape_of({{"step", 1}})});
  spec_.step_counter = counter;
  spec_.update.push_back({"optimizer/step",
                          {counter},
                          {counter},
                          0.0,
                          [=](const OpContext& context) {
                            const auto step = static_cast<int32_t>(context.update->step + 1);
                            context.kernels->memory_copy_in(context.i32(counter), &step, sizeof step);
                          },
                          OpKind::optimizer});
  spec_.update.back().role = OpRole::step_counter;
  for (size_t k = 0; k < spec_.parameters.size(); ++k) {
    const ParameterDecl& parameter = spec_.parameters[k];
    const BufferId gradient = parameter.gradient;
    const int64_t count = spec_.buffer(gradient).shape.elements();
    // Each layer's squared norm into its own slot (a stacked gradient, and any shard of it, is its layers'
    // blocks one after another). Sizes come from the views: under FSDP or ZeRO-1 the plan binds these ops
    // to shards.
    std::vector<int32_t> slots = {parameter.norm_slot};
    if (parameter.stacked()) {
      slots.clear();
      for (const ParameterDecl::Member& member : parameter.members) slots.push_back(member.norm_slot);
    }
    spec_.update.push_back({"optimizer/grad_norm/" + parameter.canonical_name,
                            {gradient},
                            {},
                            2.0 * static_cast<double>(count),
                            [=](const OpContext& context) {
                              const TensorView view = context.view(gradient);
                              const int64_t block = view.elements() / static_cast<int64_t>(slots.size());
                              for (size_t i = 0; i < slots.size(); ++i) {
                                context.update->norm_slots.at(static_cast<size_t>(slots[i])) +=
                                    context.share * context.kernels->sum_of_squares(
                                                        view.f32() + static_cast<int64_t>(i) * block, block);
                              }
                            },
                            OpKind::optimizer});
    spec_.update.back().role = OpRole::grad_norm;
    spec_.update.back().parameter = static_cast<int32_t>(k);
  }
  const double threshold = c.gradient_clipping_threshold;
  spec_.update.push_back({"optimizer/clip",
                          {},
                          {},
                          0.0,
                          [=](const OpContext& context) {
                            UpdateState& u = *context.update;
                            u.fold_norm_slots();
                            // With no valid target the gradient is zero: the step still decays weights and
                            // advances the moments.
                            const double token_scale = u.global_valid_count > 0
                                                           ? 1.0 / static_cast<double>(u.global_valid_count)
                                                           : 0.0;
                            u.raw_grad_norm = std::sqrt(u.sum_of_squares) * token_scale;
                            // The squared norm is summed over every rank's shard (or the gradients were
                            // reduced before it), so every rank sees a NaN of any rank here.
                            u.nonfinite = !std::isfinite(u.sum_of_squares);
                            double clip = 1.0;
                            if (threshold > 0.0 && u.raw_grad_norm > threshold)
                              clip = threshold / u.raw_grad_norm;
                            u.grad_norm = u.raw_grad_norm * clip;
                            u.gradient_scale = token_scale * clip;
                          },
                          OpKind::optimizer});
  spec_.update.back().role = OpRole::clip;
  const float b1 = static_cast<float>(c.adam_b1), b2 = static_cast<float>(c.adam_b2),
              eps = static_cast<float>(c.adam_eps);
  for (size_t k = 0; k < spec_.parameters.size(); ++k) {
    const ParameterDecl& parameter = spec_.parameters[k];
    const BufferId value = parameter.value, gradient = parameter.gradient, m = parameter.adam_m,
                   v = parameter.adam_v;
    const int64_t count = spec_.buffer(value).shape.elements();
    const bool weight_decay = parameter.weight_decay;
    const auto decay = static_cast<float>(parameter.weight_decay_rate.value_or(c.adam_weight_decay));
    const double learning_rate_multiplier = parameter.learning_rate_multiplier;
    std::vector<BufferId> touched = {value, m, v};
    if (parameter.master != kNoBuffer) touched.push_back(parameter.master);
    std::vector<BufferId> reads = touched;
    reads.push_back(gradient);
    spec_.update.push_back(
        {"optimizer/adamw/" + parameter.canonical_name, reads, touched, 12.0 * static_cast<double>(count),
         [=](const OpContext& context) {
           const UpdateState& u = *context.update;
           if (u.nonfinite) return;  // a NaN or infinity anywhere: the step leaves every parameter as it was
           const kernels::AdamWStep adam{static_cast<float>(u.learning_rate * learning_rate_multiplier),
                                         b1,
                                         b2,
                                         eps,
                                         decay,
                                         u.step + 1,
                                         static_cast<float>(u.gradient_scale)};
           // Sizes come from the views: under FSDP or ZeRO-1 the plan binds this op to shards.
           const TensorView shard = context.view(value);
           context.kernels->adamw_update(shard.f32(), context.f32(gradient), context.f32(m), context.f32(v),
                                         shard.elements(), adam, weight_decay);
         },
         OpKind::optimizer});
    spec_.update.back().role = OpRole::adamw;
    spec_.update.back().parameter = static_cast<int32_t>(k);
  }
}

}  // namespace meshtrain
