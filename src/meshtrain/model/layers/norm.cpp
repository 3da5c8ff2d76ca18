#include "meshtrain/model/layers/norm.h"

namespace meshtrain {

NormLayer add_norm(SpecBuilder& builder, const std::string& prefix, NormKind kind, BufferId x,
                   const Shape& out_shape, int64_t rows, int64_t width, BufferId d_out, BufferId d_x,
                   bool accumulate_dx, NormReaders readers) {
  const float epsilon = static_cast<float>(builder.spec().options.norm.epsilon);
  const std::string width_axis = out_shape.axes.back();
  const BufferId scale = builder.parameter(prefix + "/scale", shape_of({{width_axis, width}}),
                                           {"norm", ParameterInit::ones, 0.0, ParameterRole::scale});
  const BufferId d_scale = builder.gradient_of(scale);
  const BufferId out = readers == NormReaders::matmuls_only ? builder.matmul_input(prefix + "/out", out_shape)
                                                            : builder.activation(prefix + "/out", out_shape);
  const bool out_bf16 = builder.spec().buffer(out).dtype == DType::bf16;
  const BufferId rstd = builder.activation(prefix + "/rstd", shape_of({{"rows", rows}}));
  const double flops = 4.0 * static_cast<double>(rows * width);
  NormLayer layer{out, {}};
  // The backward adds into d_x when accumulating: then it reads it too.
  const auto backward_reads = [&](std::vector<BufferId> reads) {
    if (accumulate_dx) reads.push_back(d_x);
    return reads;
  };

  if (kind == NormKind::rms) {
    builder.forward({prefix + "/forward", {x, scale}, {out, rstd}, flops, [=](const OpContext& c) {
                       if (out_bf16) {
                         c.kernels->rmsnorm_forward_bf16(c.bf16(out), c.f32(rstd), c.f32(x), c.f32(scale),
                                                         rows, width, epsilon);
                       } else {
                         c.kernels->rmsnorm_forward(c.f32(out), c.f32(rstd), c.f32(x), c.f32(scale), rows,
                                                    width, epsilon);
                       }
                     }});
    layer.backward = {prefix + "/backward",
                      backward_reads({d_out, x, scale, rstd}),
                      {d_x, d_scale},
                      2.0 * flops,
                      [=](const OpContext& c) {
                        c.kernels->rmsnorm_backward(c.f32(d_x), c.f32(d_scale), c.f32(d_out), c.f32(x),
                                                    c.f32(scale), c.f32(rstd), rows, width, accumulate_dx);
                      }};
    return layer;
  }
  const BufferId bias = builder.parameter(prefix + "/bias", shape_of({{width_axis, width}}),
                                          {"norm", ParameterInit::zeros, 0.0, ParameterRole::bias});
  const BufferId d_bias = builder.gradient_of(bias);
  const BufferId mean = builder.activation(prefix + "/mean", shape_of({{"rows", rows}}));
  builder.forward({prefix + "/forward", {x, scale, bias}, {out, mean, rstd}, flops, [=](const OpContext& c) {
                     if (out_bf16) {
                       c.kernels->layernorm_forward_bf16(c.bf16(out), c.f32(mean), c.f32(rstd), c.f32(x),
                                                         c.f32(scale), c.f32(bias), rows, width, epsilon);
                     } else {
                       c.kernels->layernorm_forward(c.f32(out), c.f32(mean), c.f32(rstd), c.f32(x),
                                                    c.f32(scale), c.f32(bias), rows, width, epsilon);
                     }
                   }});
  layer.backward = {prefix + "/backward",
                    backward_reads({d_out, x, scale, mean, rstd}),
                    {d_x, d_scale, d_bias},
                    2.0 * flops,
                    [=](const OpContext& c) {
                      c.kernels->layernorm_backward(c.f32(d_x), c.f32(d_scale), c.f32(d_bias), c.f32(d_out),
                                                    c.f32(x), c.f32(scale), c.f32(mean), c.f32(rstd), rows,
                                                    width, accumulate_dx);
                    }};
  return layer;
}

NormLayer add_stream_norm(SpecBuilder& builder, const std::string& prefix, BufferId x, const Shape& out_shape,
                          int64_t tokens, int64_t streams, int64_t width, BufferId d_out, BufferId d_x,
                          bool accumulate_dx) {
  const float epsilon = static_cast<float>(builder.spec().options.norm.epsilon);
  const int64_t N = tokens, G = streams, D = width;
  const BufferId scale =
      builder.parameter(prefix + "/scale", shape_of({{"streams", G}, {out_shape.axes.back(), D}}),
                        {"norm", ParameterInit::ones, 0.0, ParameterRole::scale});
  const BufferId d_scale = builder.gradient_of(scale);
  const BufferId out = builder.activation(prefix + "/out", out_shape);
  const BufferId rstd = builder.activation(prefix + "/rstd", shape_of({{"rows", N * G}}));
  const double flops = 4.0 * static_cast<double>(N * G * D);
  builder.forward({prefix + "/forward", {x, scale}, {out, rstd}, flops, [=](const OpContext& c) {
                     c.kernels->rmsnorm_streams_forward(c.f32(out), c.f32(rstd), c.f32(x), c.f32(scale), N, G,
                                                        D, epsilon);
                   }});
  std::vector<BufferId> reads = {d_out, x, scale, rstd};
  if (accumulate_dx) reads.push_back(d_x);
  return {out, {prefix + "/backward", reads, {d_x, d_scale}, 2.0 * flops, [=](const OpContext& c) {
                  c.kernels->rmsnorm_streams_backward(c.f32(d_x), c.f32(d_scale), c.f32(d_out), c.f32(x),
                                                      c.f32(scale), c.f32(rstd), N, G, D, accumulate_dx);
                }}};
}

}  // namespace meshtrain
