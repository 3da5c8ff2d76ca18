#include "meshtrain/model/layers/linear.h"

#include "meshtrain/kernels/cpu/matmul.h"
#include "meshtrain/kernels/cpu/residual.h"

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
  const BufferId kernel = builder.parameter(
      prefix + "/kernel", kernel_shape, {options.component, ParameterInit::normal, options.init_std, true});
  const BufferId d_kernel = builder.gradient_of(kernel);
  BufferId bias = kNoBuffer, d_bias = kNoBuffer;
  if (options.bias) {
    Shape bias_shape = kernel_shape;
    bias_shape.dims.erase(bias_shape.dims.begin(),
                          bias_shape.dims.begin() + static_cast<std::ptrdiff_t>(input_axes));
    bias_shape.axes.erase(bias_shape.axes.begin(),
                          bias_shape.axes.begin() + static_cast<std::ptrdiff_t>(input_axes));
    bias = builder.parameter(prefix + "/bias", bias_shape,
                             {options.component, ParameterInit::zeros, 0.0, false});
    d_bias = builder.gradient_of(bias);
  }
  const BufferId out = builder.activation(prefix + "/out", out_shape);
  const BufferId residual_in = options.residual_in;
  const double flops = 2.0 * static_cast<double>(N * I * O);

  std::vector<BufferId> reads = {x, kernel};
  if (bias != kNoBuffer) reads.push_back(bias);
  if (residual_in != kNoBuffer) reads.push_back(residual_in);
  builder.forward({prefix + "/forward", reads, {out}, flops, [=](const OpContext& c) {
                     kernels::matmul_forward(c.f32(out), c.f32(x), c.f32(kernel),
                                             bias == kNoBuffer ? nullptr : c.f32(bias), N, I, O);
                     if (residual_in != kNoBuffer)
                       kernels::residual_add(c.f32(out), c.f32(residual_in), N * O);
                   }});

  std::vector<BufferId> writes = {d_kernel};
  if (d_x != kNoBuffer) writes.push_back(d_x);
  if (d_bias != kNoBuffer) writes.push_back(d_bias);
  LinearLayer layer{out, kernel, {}};
  layer.backward = {prefix + "/backward", {d_out, x, kernel}, writes, 2.0 * flops, [=](const OpContext& c) {
                      kernels::matmul_backward(d_x == kNoBuffer ? nullptr : c.f32(d_x), c.f32(d_kernel),
                                               d_bias == kNoBuffer ? nullptr : c.f32(d_bias), c.f32(d_out),
                                               c.f32(x), c.f32(kernel), N, I, O, accumulate_dx);
                    }};
  return layer;
}

}  // namespace meshtrain
