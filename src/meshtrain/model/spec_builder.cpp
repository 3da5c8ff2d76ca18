#include "meshtrain/model/spec_builder.h"

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
  // What training adds to a value: nothing a decode spec may allocate. The optimizer's state comes with
  // its pass (optim/optimizer.h), once the layout (stacked or per layer) is known.
  if (!decoding()) parameter.gradient = add({"grad/" + name, BufferKind::gradient, c.grad_dtype, shape});
  parameter.canonical_name = name;
  parameter.component = options.component;
  parameter.init = options.init;
  parameter.init_std = options.init_std;
  parameter.role = options.role;
  parameter.init_value = options.init_value;
  parameter.input_axes = options.input_axes;
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

void SpecBuilder::begin_chunk(size_t k) {
  MT_CHECK(k < spec_.chunks.size() && k == chunk_groups_.size(), "the spec's chunks declared in order");
  chunk_ = k;
  chunk().forward_begin = spec_.forward.size();
  chunk_groups_.emplace_back(backward_groups_.size(), backward_groups_.size());
}

void SpecBuilder::end_chunk() {
  chunk().forward_end = spec_.forward.size();
  chunk_groups_.back().second = backward_groups_.size();
}

void SpecBuilder::finish() {
  MT_CHECK(chunk_groups_.size() == spec_.chunks.size(), "every chunk of the spec declared");
  const size_t loss_ops = spec_.loss_backward.size();
  for (size_t i = backward_groups_.size(); i-- > 0;) {
    blocks_[i].backward_begin = spec_.loss_backward.size();
    for (OpDecl& op : backward_groups_[i]) spec_.loss_backward.push_back(std::move(op));
    blocks_[i].backward_end = spec_.loss_backward.size();
  }
  // A chunk's groups run last first: its backward spans from its last group's to its first's (the head's
  // chunk from the loss on).
  for (size_t k = 0; k < spec_.chunks.size(); ++k) {
    ChunkSection& chunk = spec_.chunks[k];
    const auto [first, end] = chunk_groups_[k];
    if (end > first) {
      chunk.backward_begin = blocks_[end - 1].backward_begin;
      chunk.backward_end = blocks_[first].backward_end;
    }
    if (chunk.layers.with_head) chunk.backward_begin = 0;
    if (chunk.layers.with_head && end == first) chunk.backward_end = loss_ops;
  }
  backward_groups_.clear();
  spec_.blocks = std::move(blocks_);
  stack_scan_groups(spec_);
}

}  // namespace meshtrain
