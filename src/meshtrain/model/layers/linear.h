// Dense projection y = x @ W (+ b) as spec ops, forward and backward side by side. Kernels are stored
// [in, out] (the reference system's layout); Hugging Face's [out, in] is transposed at import.
// Legend: N tokens, I input width, O output width.
#pragma once

#include <string>

#include "meshtrain/model/spec_builder.h"

namespace meshtrain {

struct LinearOptions {
  std::string component;
  bool bias = false;
  double init_std = 0.02;
  BufferId residual_in =
      kNoBuffer;  // when set: out = residual_in + x @ W (+ b), the end of a residual branch
};

struct LinearLayer {
  BufferId out = kNoBuffer;  // [N, O]
  BufferId kernel = kNoBuffer;
  OpDecl backward;  // reads d_out; writes (or adds into) d_x; adds weight gradients
};

LinearLayer add_linear(SpecBuilder& builder, const std::string& prefix, BufferId x, const Shape& kernel_shape,
                       const Shape& out_shape, const LinearOptions& options, BufferId d_out, BufferId d_x,
                       bool accumulate_dx);

}  // namespace meshtrain
