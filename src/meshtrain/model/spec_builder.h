// Declares buffers and ops into a ModelSpec. Layer files call it in forward order; each layer hands back
// its backward ops as one group, and the groups run in reverse order after the loss. Building a decode spec
// (ModelDims::T > 0), the same calls declare parameter values only and drop the backward and loss.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/model/spec.h"

namespace meshtrain {

struct ParameterOptions {
  std::string component;  // "embedding", "attention", "mlp", "norm", "unembedding"
  ParameterInit init = ParameterInit::normal;
  double init_std = 0.02;
  ParameterRole role = ParameterRole::matrix;  // what the optimizer's groups and decay mask see
  double init_value = 0.0;                     // ParameterInit::constant
  int32_t input_axes = 1;                      // ParameterDecl::input_axes
};

class SpecBuilder {
 public:
  // spec.kernels: the backend whose scratch-size queries the layers use.
  explicit SpecBuilder(ModelSpec& spec) : spec_(spec) {}

  BufferId input(const std::string& name, DType dtype, const Shape& shape);
  // Saved for the backward pass: one buffer per layer.
  BufferId activation(const std::string& name, const Shape& shape);
  // An activation that only dense matmuls (add_linear) read: stored in the backend's matmul_input_dtype,
  // so under dtype=bfloat16 on the cpu its producer writes it rounded to bf16 once and the matmuls take it
  // as their bf16 input (the producer checks the buffer's dtype to pick its kernel).
  BufferId matmul_input(const std::string& name, const Shape& shape);
  // An int32 buffer in place of the float one `id` declared (indices, positions, counts).
  BufferId as_int32(BufferId id) {
    spec_.buffers.at(static_cast<size_t>(id)).dtype = DType::i32;
    return id;
  }
  // Temporary: shared by every layer that declares the same name (the backward reuses one set).
  BufferId scratch(const std::string& name, const Shape& shape);
  // dtype=bfloat16: a kernel's scratch for its inputs rounded to bf16 (`elements` of them, 2 bytes each),
  // written by every op that uses it; kNoBuffer in float32, for 0 elements, and in a decode spec.
  BufferId bf16_inputs_scratch(const std::string& name, int64_t elements);
  // What activations, caches and scratch are stored in: the backend's choice for the compute dtype.
  DType storage_dtype() const;
  // A backward temporary (an activation's gradient, a backward kernel's scratch): a scratch, or kNoBuffer in
  // a decode spec, which has no backward to use it.
  BufferId gradient_scratch(const std::string& name, const Shape& shape) {
    return decoding() ? kNoBuffer : scratch(name, shape);
  }
  // The buffer declared under `name`, or kNoBuffer (a buffer the first of several layers declares).
  BufferId find(const std::string& name) const;
  // Decode: kept across steps (a layer's key / value rows).
  BufferId cache(const std::string& name, const Shape& shape);
  // A trainable tensor with its gradient (decode: the value only); returns the value's id.
  BufferId parameter(const std::string& name, const Shape& shape, const ParameterOptions& options);
  // kNoBuffer in a decode spec.
  BufferId gradient_of(BufferId parameter_value) const;
  bool decoding() const { return spec_.decoding(); }

  void forward(OpDecl op) { spec_.forward.push_back(std::move(op)); }
  // Ends a layer block: the forward ops declared since the previous block, and `ops`, its backward.
  void backward_group(std::vector<OpDecl> ops);
  // Loss ops: `eval_ops` compute the loss only; `train_ops` compute it with its gradient.
  void loss(std::vector<OpDecl> eval_ops, std::vector<OpDecl> train_ops);
  // Around the declarations of the spec's chunk `k` (ModelSpec::chunks, each in turn): where its ops lie is
  // recorded, and chunk() is it meanwhile.
  void begin_chunk(size_t k);
  void end_chunk();
  ChunkSection& chunk() { return spec_.chunks.at(chunk_); }
  size_t chunk_index() const { return chunk_; }
  // `name` for a buffer every layer of a chunk shares that the chunk's first layer makes (the first chunk's
  // keeps its name, a later one's is "chunk_<k>/name"): each chunk runs as kernels of its own.
  std::string chunk_shared(const std::string& name) const {
    return chunk_ == 0 ? name : "chunk_" + std::to_string(chunk_) + "/" + name;
  }
  // Appends the layer groups in reverse order after the loss's backward (so the chunks' backward ranges are
  // known) and stacks the scan groups (scan_layers, model/scan.h).
  void finish();

  ModelSpec& spec() { return spec_; }
  const ModelSpec& spec() const { return spec_; }
  const kernels::KernelBackend& kernels() const { return *spec_.kernels; }
  const ModelDims& dims() const { return spec_.dims; }

 private:
  BufferId add(BufferDecl buffer);
  ModelSpec& spec_;
  std::vector<std::vector<OpDecl>> backward_groups_;
  std::vector<LayerBlock> blocks_;  // backward ranges filled in by finish()
  size_t chunk_ = 0;
  std::vector<std::pair<size_t, size_t>> chunk_groups_;  // per chunk: its backward groups [first, end)
};

// The [N, X] view of a buffer shaped with batch and length axes: most kernels see tokens as rows.
inline Shape token_shape(const ModelDims& dims,
                         std::initializer_list<std::pair<std::string, int64_t>> inner) {
  Shape shape = shape_of({{"batch", dims.B}, {"length", dims.S}});
  for (const auto& [axis, size] : inner) {
    shape.axes.push_back(axis);
    shape.dims.push_back(size);
  }
  return shape;
}

}  // namespace meshtrain
