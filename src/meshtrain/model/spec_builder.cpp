#include "meshtrain/model/spec_builder.h"

#include "meshtrain/core/error.h"

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
  return add({name, BufferKind::activation, DType::f32, shape});
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
  return add({name, BufferKind::scratch, DType::f32, shape});
}

BufferId SpecBuilder::parameter(const std::string& name, const Shape& shape,
                                const ParameterOptions& options) {
  ParameterDecl parameter;
  parameter.value = add({name, BufferKind::parameter, DType::f32, shape});
  parameter.gradient = add({"grad/" + name, BufferKind::gradient, DType::f32, shape});
  parameter.adam_m = add({"adam_m/" + name, BufferKind::optimizer_state, DType::f32, shape});
  parameter.adam_v = add({"adam_v/" + name, BufferKind::optimizer_state, DType::f32, shape});
  parameter.canonical_name = name;
  parameter.component = options.component;
  parameter.init = options.init;
  parameter.init_std = options.init_std;
  parameter.weight_decay = options.weight_decay;
  spec_.parameters.push_back(parameter);
  return parameter.value;
}

BufferId SpecBuilder::gradient_of(BufferId parameter_value) const {
  for (const ParameterDecl& parameter : spec_.parameters) {
    if (parameter.value == parameter_value) return parameter.gradient;
  }
  MT_CHECK(false, "not a parameter: " + spec_.buffer(parameter_value).name);
  return kNoBuffer;
}

void SpecBuilder::loss(std::vector<OpDecl> eval_ops, std::vector<OpDecl> train_ops) {
  spec_.loss_forward = std::move(eval_ops);
  spec_.loss_backward = std::move(train_ops);
}

void SpecBuilder::finish() {
  for (auto group = backward_groups_.rbegin(); group != backward_groups_.rend(); ++group) {
    for (OpDecl& op : *group) spec_.loss_backward.push_back(std::move(op));
  }
  backward_groups_.clear();
}

}  // namespace meshtrain
