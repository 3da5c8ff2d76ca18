#include "meshtrain/model/layers/mlp.h"

#include "meshtrain/model/parallel/linear.h"

namespace meshtrain {

GatedActivation add_swiglu(SpecBuilder& builder, const std::string& name, BufferId gate_out, BufferId up_out,
                           const Shape& hidden_shape, BufferId d_activated, BufferId d_gate, BufferId d_up) {
  const BufferId activated = builder.matmul_input(name + "/activated", hidden_shape);
  const bool activated_bf16 = builder.spec().buffer(activated).dtype == DType::bf16;
  const int64_t count = hidden_shape.elements();
  builder.forward({name + "/swiglu_forward",
                   {gate_out, up_out},
                   {activated},
                   4.0 * static_cast<double>(count),
                   [=](const OpContext& c) {
                     if (activated_bf16) {
                       c.kernels->swiglu_forward_bf16(c.bf16(activated), c.f32(gate_out), c.f32(up_out),
                                                      count);
                     } else {
                       c.kernels->swiglu_forward(c.f32(activated), c.f32(gate_out), c.f32(up_out), count);
                     }
                   }});
  return {activated,
          {name + "/swiglu_backward",
           {d_activated, gate_out, up_out},
           {d_gate, d_up},
           8.0 * static_cast<double>(count),
           [=](const OpContext& c) {
             c.kernels->swiglu_backward(c.f32(d_gate), c.f32(d_up), c.f32(d_activated), c.f32(gate_out),
                                        c.f32(up_out), count);
           }}};
}

BufferId add_mlp_block(SpecBuilder& builder, const std::string& prefix, BufferId residual_in,
                       BufferId d_residual, const MlpBlockOptions& options) {
  const ModelDims& m = builder.dims();
  const Shape width_shape = token_shape(m, {{"embed", m.D}});
  const Shape hidden_shape = token_shape(m, {{"mlp", m.F}});
  const Shape in_kernel = shape_of({{"embed", m.D}, {"mlp", m.F}});
  const Shape out_kernel = shape_of({{"mlp", m.F}, {"embed", m.D}});
  const int64_t count = m.N * m.F;

  const BufferId d_normed = builder.gradient_scratch("scratch/d_normed", width_shape);
  const BufferId d_activated = builder.gradient_scratch("scratch/d_mlp_activated", hidden_shape);
  const NormLayer pre_norm =
      add_norm(builder, prefix + "/post_self_attention_layer_norm", options.norm, residual_in, width_shape,
               m.N, m.D, d_normed, d_residual, options.adds_residual, NormReaders::matmuls_only);
  const std::string mlp = prefix + "/mlp";
  const LinearOptions in_projection{"mlp", options.bias, 0.02, kNoBuffer};
  std::vector<OpDecl> group;
  BufferId activated = kNoBuffer;
  std::vector<OpDecl> input_backward;

  if (options.kind == MlpKind::swiglu) {
    const BufferId d_gate = builder.gradient_scratch("scratch/d_mlp_gate", hidden_shape);
    const BufferId d_up = builder.gradient_scratch("scratch/d_mlp_up", hidden_shape);
    const LinearLayer gate = add_linear(builder, mlp + "/wi_0", pre_norm.out, in_kernel, hidden_shape,
                                        in_projection, d_gate, d_normed, false);
    const LinearLayer up = add_linear(builder, mlp + "/wi_1", pre_norm.out, in_kernel, hidden_shape,
                                      in_projection, d_up, d_normed, true);
    GatedActivation swiglu =
        add_swiglu(builder, mlp, gate.out, up.out, hidden_shape, d_activated, d_gate, d_up);
    activated = swiglu.out;
    input_backward = {std::move(swiglu.backward)};
    append_ops(input_backward, gate.backward);
    append_ops(input_backward, up.backward);
  } else {
    const BufferId d_hidden = builder.gradient_scratch("scratch/d_mlp_hidden", hidden_shape);
    const LinearLayer hidden = add_linear(builder, mlp + "/wi", pre_norm.out, in_kernel, hidden_shape,
                                          in_projection, d_hidden, d_normed, false);
    // The down projection is the only reader of the activated values (the backward reads hidden_out).
    activated = builder.matmul_input(mlp + "/activated", hidden_shape);
    const bool activated_bf16 = builder.spec().buffer(activated).dtype == DType::bf16;
    const BufferId hidden_out = hidden.out;
    builder.forward({mlp + "/gelu_forward",
                     {hidden_out},
                     {activated},
                     8.0 * static_cast<double>(count),
                     [=](const OpContext& c) {
                       if (activated_bf16) {
                         c.kernels->gelu_forward_bf16(c.bf16(activated), c.f32(hidden_out), count);
                       } else {
                         c.kernels->gelu_forward(c.f32(activated), c.f32(hidden_out), count);
                       }
                     }});
    input_backward = {{mlp + "/gelu_backward",
                       {d_activated, hidden_out},
                       {d_hidden},
                       16.0 * static_cast<double>(count),
                       [=](const OpContext& c) {
                         c.kernels->gelu_backward(c.f32(d_hidden), c.f32(d_activated), c.f32(hidden_out),
                                                  count);
                       }}};
    append_ops(input_backward, hidden.backward);
  }
  const LinearLayer out =
      add_linear(builder, mlp + "/wo", activated, out_kernel, width_shape,
                 {"mlp", options.bias, options.out_init_std, options.adds_residual ? residual_in : kNoBuffer},
                 d_residual, d_activated, false);
  append_ops(group, out.backward);
  for (OpDecl& op : input_backward) group.push_back(std::move(op));
  // Column-parallel input projections.
  for (OpDecl& op : column_parallel_input_gradient(builder, mlp + "/reduce_input_gradient", d_normed))
    group.push_back(std::move(op));
  group.push_back(pre_norm.backward);
  builder.backward_group(std::move(group));
  return out.out;
}

}  // namespace meshtrain
