#include "meshtrain/model/parallel/linear.h"

#include "meshtrain/model/parallel/collective_ops.h"

namespace meshtrain {

LinearLayer add_linear(SpecBuilder& builder, const std::string& prefix, BufferId x, const Shape& kernel_shape,
                       const Shape& out_shape, const LinearOptions& options, BufferId d_out, BufferId d_x,
                       bool accumulate_dx) {
  const int64_t N = builder.dims().N;
  // The kernel's leading axes are x's feature axes ([D] or [H, d]); the rest are the output's.
  const int64_t I = builder.spec().buffer(x).shape.elements() / N;
  const int64_t O = kernel_shape.elements() / I;
  size_t input_axes = 0;
  for (int64_t product = 1; product != I; ++input_axes) product *= kernel_shape.dims.at(input_axes);
  const BufferId kernel = builder.parameter(prefix + "/kernel", kernel_shape,
                                            {options.component, ParameterInit::normal, options.init_std,
                                             options.role, 0.0, static_cast<int32_t>(input_axes)});
  const BufferId d_kernel = builder.gradient_of(kernel);
  BufferId bias = kNoBuffer, d_bias = kNoBuffer;
  if (options.bias) {
    Shape bias_shape = kernel_shape;
    bias_shape.dims.erase(bias_shape.dims.begin(),
                          bias_shape.dims.begin() + static_cast<std::ptrdiff_t>(input_axes));
    bias_shape.axes.erase(bias_shape.axes.begin(),
                          bias_shape.axes.begin() + static_cast<std::ptrdiff_t>(input_axes));
    bias = builder.parameter(prefix + "/bias", bias_shape,
                             {options.component, ParameterInit::zeros, 0.0, ParameterRole::bias});
    d_bias = builder.gradient_of(bias);
  }
  const BufferId out = builder.activation(prefix + "/out", out_shape);
  // dtype=bfloat16: x, W (and in the backward dout) rounded to bf16 for the GEMMs; written by each op, so
  // it lives only while its op runs. An x its producer stored in bf16 (SpecBuilder::matmul_input) is read
  // as it is, and only W and dout are rounded.
  const bool x_is_bf16 = builder.spec().buffer(x).dtype == DType::bf16;
  const BufferId bf16_inputs = builder.bf16_inputs_scratch(
      prefix + "/bf16_inputs", builder.kernels().matmul_bf16_scratch_elements(N, I, O, x_is_bf16));
  const BufferId residual_in = options.residual_in;
  const double flops = 2.0 * static_cast<double>(N * I * O);
  // Row-parallel (input features split over tensor, as o and down projections): each rank holds a partial
  // sum, so the bias and the residual join after the all-reduce.
  bool row_parallel = false;
  for (size_t axis = 0; axis < input_axes; ++axis) {
    row_parallel = row_parallel || builder.spec().sharding.compute(kernel_shape.axes[axis]).degree > 1;
  }

  std::vector<BufferId> reads = {x, kernel};
  if (!row_parallel && bias != kNoBuffer) reads.push_back(bias);
  if (!row_parallel && residual_in != kNoBuffer) reads.push_back(residual_in);
  std::vector<BufferId> forward_writes = {out};
  if (bf16_inputs != kNoBuffer) forward_writes.push_back(bf16_inputs);
  OpDecl forward{prefix + "/forward", reads, forward_writes, flops, [=](const OpContext& c) {
                   const float* add_bias = bias == kNoBuffer || row_parallel ? nullptr : c.f32(bias);
                   if (x_is_bf16) {
                     c.kernels->matmul_forward_bf16_x(c.f32(out), c.bf16(x), c.f32(kernel), add_bias, N, I, O,
                                                      c.bf16(bf16_inputs));
                   } else {
                     c.kernels->matmul_forward(c.f32(out), c.f32(x), c.f32(kernel), add_bias, N, I, O,
                                               c.bf16(bf16_inputs));
                   }
                   if (residual_in != kNoBuffer && !row_parallel)
                     c.kernels->residual_add(c.f32(out), c.f32(residual_in), N * O);
                 }};
  forward.kind = OpKind::matmul;
  builder.forward(std::move(forward));
  if (row_parallel) {
    for (OpDecl& op : collective_ops(builder, prefix + "/reduce_partial_sums", CollectiveKind::all_reduce,
                                     MeshAxis::tensor, out))
      builder.forward(std::move(op));
    if (bias != kNoBuffer || residual_in != kNoBuffer) {
      std::vector<BufferId> join_reads = {out};
      if (bias != kNoBuffer) join_reads.push_back(bias);
      if (residual_in != kNoBuffer) join_reads.push_back(residual_in);
      builder.forward({prefix + "/bias_residual",
                       join_reads,
                       {out},
                       static_cast<double>(2 * N * O),
                       [=](const OpContext& c) {
                         float* rows = c.f32(out);
                         if (bias != kNoBuffer) {
                           for (int64_t n = 0; n < N; ++n)
                             c.kernels->residual_add(rows + n * O, c.f32(bias), O);
                         }
                         if (residual_in != kNoBuffer)
                           c.kernels->residual_add(rows, c.f32(residual_in), N * O);
                       }});
    }
  }

  // The backward as two ops (zero_bubble runs the second later, shared/specs/pipeline.md): the input
  // gradient, which the layers below wait for, then the weight and bias gradients, which nothing in the
  // backward reads. The kernel computes each gradient on its own (each op rounds what it reads into the
  // scratch again), so the two ops back to back give bitwise the gradients of one call computing both.
  LinearLayer layer{out, kernel, {}};
  if (d_x != kNoBuffer) {
    std::vector<BufferId> input_reads = {d_out, kernel};
    if (accumulate_dx) input_reads.push_back(d_x);
    std::vector<BufferId> input_writes = {d_x};
    if (bf16_inputs != kNoBuffer) input_writes.push_back(bf16_inputs);
    OpDecl input{prefix + "/backward_input", input_reads, input_writes, flops, [=](const OpContext& c) {
                   if (x_is_bf16) {
                     c.kernels->matmul_backward_bf16_x(c.f32(d_x), nullptr, nullptr, c.f32(d_out), nullptr,
                                                       c.f32(kernel), N, I, O, accumulate_dx,
                                                       c.bf16(bf16_inputs));
                   } else {
                     c.kernels->matmul_backward(c.f32(d_x), nullptr, nullptr, c.f32(d_out), nullptr,
                                                c.f32(kernel), N, I, O, accumulate_dx, c.bf16(bf16_inputs));
                   }
                 }};
    input.kind = OpKind::matmul;
    layer.backward.push_back(std::move(input));
  }
  std::vector<BufferId> weight_writes = {d_kernel};
  if (d_bias != kNoBuffer) weight_writes.push_back(d_bias);
  if (bf16_inputs != kNoBuffer) weight_writes.push_back(bf16_inputs);
  OpDecl weight{prefix + "/backward_weight", {d_out, x}, weight_writes, flops, [=](const OpContext& c) {
                  float* dbias = d_bias == kNoBuffer ? nullptr : c.f32(d_bias);
                  if (x_is_bf16) {
                    c.kernels->matmul_backward_bf16_x(nullptr, c.f32(d_kernel), dbias, c.f32(d_out),
                                                      c.bf16(x), nullptr, N, I, O, false,
                                                      c.bf16(bf16_inputs));
                  } else {
                    c.kernels->matmul_backward(nullptr, c.f32(d_kernel), dbias, c.f32(d_out), c.f32(x),
                                               nullptr, N, I, O, false, c.bf16(bf16_inputs));
                  }
                }};
  weight.kind = OpKind::matmul;
  weight.weight_gradients_only = true;
  layer.backward.push_back(std::move(weight));
  return layer;
}

void append_ops(std::vector<OpDecl>& group, const std::vector<OpDecl>& ops) {
  group.insert(group.end(), ops.begin(), ops.end());
}

std::vector<OpDecl> column_parallel_input_gradient(const SpecBuilder& builder, const std::string& name,
                                                   BufferId d_x) {
  return collective_ops(builder, name, CollectiveKind::all_reduce, MeshAxis::tensor, d_x);
}

void mark_gradient_partial_over_heads(SpecBuilder& builder, const std::string& canonical_name) {
  const bool heads_split = builder.spec().sharding.compute("heads").degree > 1;
  for (ParameterDecl& parameter : builder.spec().parameters) {
    if (parameter.canonical_name == canonical_name) parameter.gradient_partial_over_tensor = heads_split;
  }
}

}  // namespace meshtrain
