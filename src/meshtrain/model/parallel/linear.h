// Dense projection y = x @ W (+ b) as spec ops, forward and backward side by side, column- or row-parallel
// over mesh.tensor as the sharding of its kernel's axes says: the tensor-parallel collectives of a layer's
// projections live here. Kernels are stored [in, out] (the reference system's layout); Hugging Face's
// [out, in] is transposed at import.
// Legend: N tokens, I input width, O output width.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/model/spec_builder.h"

namespace meshtrain {

struct LinearOptions {
  std::string component;
  bool bias = false;
  double init_std = 0.02;
  BufferId residual_in =
      kNoBuffer;  // when set: out = residual_in + x @ W (+ b), the end of a residual branch
  ParameterRole role = ParameterRole::matrix;  // the kernel's (spec.h): router and mixing maps say so
};

struct LinearLayer {
  BufferId out = kNoBuffer;  // [N, O]
  BufferId kernel = kNoBuffer;
  // In backward order: the input gradient (reads d_out, writes or adds into d_x; none without d_x), then the
  // weight gradients (reads d_out and x, adds into dW and db; OpDecl::weight_gradients_only).
  std::vector<OpDecl> backward;
};

// Appends `ops` to a backward group, in their order.
void append_ops(std::vector<OpDecl>& group, const std::vector<OpDecl>& ops);

// Row-parallel (the kernel's input axes split over tensor, as o and down projections): the forward
// all-reduces the partial sums, then adds the bias and the residual.
LinearLayer add_linear(SpecBuilder& builder, const std::string& prefix, BufferId x, const Shape& kernel_shape,
                       const Shape& out_shape, const LinearOptions& options, BufferId d_out, BufferId d_x,
                       bool accumulate_dx);

// Column-parallel projections (output axes split over tensor) of a replicated input: each tensor rank's
// backward leaves a partial sum in the input gradient `d_x`, all-reduced by these ops (none on one tensor
// rank) once every projection reading that input has added its part.
std::vector<OpDecl> column_parallel_input_gradient(const SpecBuilder& builder, const std::string& name,
                                                   BufferId d_x);

// A parameter replicated over tensor but computed from head-split activations (QK-norm scales see only this
// rank's heads): under heads split over tensor its gradient is a partial sum, all-reduced in update.
void mark_gradient_partial_over_heads(SpecBuilder& builder, const std::string& canonical_name);

}  // namespace meshtrain
