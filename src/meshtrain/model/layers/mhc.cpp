#include "meshtrain/model/layers/mhc.h"

#include <cmath>

#include "meshtrain/model/layers/norm.h"
#include "meshtrain/model/parallel/linear.h"

namespace meshtrain {

BufferId add_mhc_site(SpecBuilder& builder, const std::string& prefix, BufferId streams_in,
                      BufferId d_streams, const MhcSublayer& sublayer) {
  const ModelDims& m = builder.dims();
  const int64_t N = m.N, G = m.G, D = m.D, GD = G * D, C = 2 * G + G * G;
  const int64_t iterations = builder.spec().options.mhc.sinkhorn_iterations;
  const Shape streams = token_shape(m, {{"streams", G}, {"embed", D}});
  const Shape flat = token_shape(m, {{"mhc_width", GD}});
  const Shape coefficients = token_shape(m, {{"mhc_coefficients", C}});
  const Shape per_stream = token_shape(m, {{"streams", G}});
  const Shape mixing_shape = token_shape(m, {{"streams", G}, {"streams_out", G}});
  const Shape width = token_shape(m, {{"embed", D}});

  // Backward temporaries, shared by every site.
  const BufferId d_normed = builder.gradient_scratch("scratch/d_mhc_normed", flat);
  const BufferId d_h = builder.gradient_scratch("scratch/d_mhc_coefficients", coefficients);
  const BufferId d_pre = builder.gradient_scratch("scratch/d_mhc_pre", per_stream);
  const BufferId d_post = builder.gradient_scratch("scratch/d_mhc_post", per_stream);
  const BufferId d_mixing = builder.gradient_scratch("scratch/d_mhc_mixing", mixing_shape);
  const BufferId d_logits = builder.gradient_scratch("scratch/d_mhc_logits", mixing_shape);
  const BufferId d_mixed = builder.gradient_scratch("scratch/d_mhc_streams", streams);
  const BufferId d_io = builder.gradient_scratch("scratch/d_mhc_sublayer", width);

  // The coefficients: h = RMSNorm(x) @ alpha ([pre | post | res] columns, fan-in init), then the mappings.
  const NormLayer norm = add_norm(builder, prefix + "/mhc_norm", NormKind::rms, streams_in, flat, N, GD,
                                  d_normed, d_streams, true);
  const LinearLayer projection =
      add_linear(builder, prefix + "/alpha", norm.out, shape_of({{"mhc_width", GD}, {"mhc_coefficients", C}}),
                 coefficients,
                 {"mhc", false, 1.0 / std::sqrt(static_cast<double>(GD)), kNoBuffer, ParameterRole::mixing},
                 d_h, d_normed, false);
  // {a_pre, a_post, a_res}, each 0.01 at init; the betas start at zero. Scales and biases: the optimizer's
  // mask (optim/groups.h) decays neither.
  const BufferId scales =
      builder.parameter(prefix + "/alpha_scales", shape_of({{"mhc_scales", 3}}),
                        {"mhc", ParameterInit::constant, 0.0, ParameterRole::scale, 0.01});
  const BufferId pre_beta = builder.parameter(prefix + "/pre_beta", shape_of({{"streams", G}}),
                                              {"mhc", ParameterInit::zeros, 0.0, ParameterRole::bias});
  const BufferId post_beta = builder.parameter(prefix + "/post_beta", shape_of({{"streams", G}}),
                                               {"mhc", ParameterInit::zeros, 0.0, ParameterRole::bias});
  const BufferId res_beta =
      builder.parameter(prefix + "/res_beta", shape_of({{"streams", G}, {"streams_out", G}}),
                        {"mhc", ParameterInit::zeros, 0.0, ParameterRole::bias});
  const BufferId d_scales = builder.gradient_of(scales), d_pre_beta = builder.gradient_of(pre_beta),
                 d_post_beta = builder.gradient_of(post_beta), d_res_beta = builder.gradient_of(res_beta);
  const BufferId h = projection.out;
  const BufferId pre = builder.activation(prefix + "/pre", per_stream);
  const BufferId post = builder.activation(prefix + "/post", per_stream);
  const BufferId logits = builder.activation(prefix + "/mixing_logits", mixing_shape);
  const BufferId mixing = builder.activation(prefix + "/mixing", mixing_shape);
  builder.forward({prefix + "/coefficients_forward",
                   {h, scales, pre_beta, post_beta, res_beta},
                   {pre, post, logits},
                   4.0 * static_cast<double>(N * C),
                   [=](const OpContext& ctx) {
                     ctx.kernels->mhc_coefficients_forward(ctx.f32(pre), ctx.f32(post), ctx.f32(logits),
                                                           ctx.f32(h), ctx.f32(scales), ctx.f32(pre_beta),
                                                           ctx.f32(post_beta), ctx.f32(res_beta), N, G);
                   }});
  const double sinkhorn_flops = 2.0 * static_cast<double>(iterations) * 2.0 * static_cast<double>(N * G * G);
  builder.forward(
      {prefix + "/sinkhorn_forward", {logits}, {mixing}, sinkhorn_flops, [=](const OpContext& ctx) {
         ctx.kernels->sinkhorn_forward(ctx.f32(mixing), ctx.f32(logits), N, G, iterations);
       }});
  // The sublayer's input: the streams weighted by pre.
  const BufferId xin = builder.activation(prefix + "/sublayer_in", width);
  builder.forward({prefix + "/collapse_forward",
                   {streams_in, pre},
                   {xin},
                   2.0 * static_cast<double>(N * GD),
                   [=](const OpContext& ctx) {
                     ctx.kernels->mhc_collapse_forward(ctx.f32(xin), ctx.f32(streams_in), ctx.f32(pre), N, G,
                                                       D);
                   }});
  // Runs last in the backward: the collapse adds pre_g d_xin into d_streams (the expand's d_x is already
  // there), then the coefficients' chain ends in the norm, which adds its part.
  std::vector<OpDecl> coefficients_backward = {
      {prefix + "/collapse_backward",
       {d_io, streams_in, pre, d_streams},
       {d_streams, d_pre},
       4.0 * static_cast<double>(N * GD),
       [=](const OpContext& ctx) {
         ctx.kernels->mhc_collapse_backward(ctx.f32(d_streams), ctx.f32(d_pre), ctx.f32(d_io),
                                            ctx.f32(streams_in), ctx.f32(pre), N, G, D);
       }},
      {prefix + "/sinkhorn_backward",
       {d_mixing, logits},
       {d_logits},
       2.0 * sinkhorn_flops,
       [=](const OpContext& ctx) {
         ctx.kernels->sinkhorn_backward(ctx.f32(d_logits), ctx.f32(d_mixing), ctx.f32(logits), N, G,
                                        iterations);
       }},
      {prefix + "/coefficients_backward",
       {d_pre, d_post, d_logits, h, scales, pre_beta, post_beta, d_scales, d_pre_beta, d_post_beta,
        d_res_beta},
       {d_h, d_scales, d_pre_beta, d_post_beta, d_res_beta},
       8.0 * static_cast<double>(N * C),
       [=](const OpContext& ctx) {
         ctx.kernels->mhc_coefficients_backward(ctx.f32(d_h), ctx.f32(d_scales), ctx.f32(d_pre_beta),
                                                ctx.f32(d_post_beta), ctx.f32(d_res_beta), ctx.f32(d_pre),
                                                ctx.f32(d_post), ctx.f32(d_logits), ctx.f32(h),
                                                ctx.f32(scales), ctx.f32(pre_beta), ctx.f32(post_beta), N, G);
       }}};
  append_ops(coefficients_backward, projection.backward);
  coefficients_backward.push_back(norm.backward);
  builder.backward_group(std::move(coefficients_backward));

  const BufferId o = sublayer(xin, d_io);

  // out_m = sum_k M[k, m] x_k + post_m o.
  const BufferId out = builder.activation(prefix + "/out", streams);
  builder.forward({prefix + "/expand_forward",
                   {streams_in, mixing, post, o},
                   {out},
                   2.0 * static_cast<double>(N * G * (G + 1) * D),
                   [=](const OpContext& ctx) {
                     ctx.kernels->mhc_expand_forward(ctx.f32(out), ctx.f32(streams_in), ctx.f32(mixing),
                                                     ctx.f32(post), ctx.f32(o), N, G, D);
                   }});
  // Runs first in the backward: dL/d x through the mixing (into d_mixed, then d_streams), M, post and o.
  builder.backward_group(
      {{prefix + "/expand_backward",
        {d_streams, streams_in, mixing, post, o},
        {d_mixed, d_mixing, d_post, d_io},
        4.0 * static_cast<double>(N * G * (G + 1) * D),
        [=](const OpContext& ctx) {
          ctx.kernels->mhc_expand_backward(ctx.f32(d_mixed), ctx.f32(d_mixing), ctx.f32(d_post),
                                           ctx.f32(d_io), ctx.f32(d_streams), ctx.f32(streams_in),
                                           ctx.f32(mixing), ctx.f32(post), ctx.f32(o), N, G, D);
        }},
       {prefix + "/streams_gradient", {d_mixed}, {d_streams}, 0.0, [=](const OpContext& ctx) {
          // A copy in the arena's memory (host or device): every column of the N rows, repeated once.
          ctx.kernels->column_slice_forward(ctx.f32(d_streams), ctx.f32(d_mixed), N, GD, 1, GD, GD);
        }}});
  return out;
}

BufferId add_mhc_entry(SpecBuilder& builder, BufferId residual, BufferId d_residual, BufferId d_streams) {
  const ModelDims& m = builder.dims();
  const int64_t N = m.N, G = m.G, D = m.D;
  const BufferId streams =
      builder.activation("decoder/mhc_entry/streams", token_shape(m, {{"streams", G}, {"embed", D}}));
  builder.forward({"decoder/mhc_entry/forward", {residual}, {streams}, 0.0, [=](const OpContext& ctx) {
                     ctx.kernels->mhc_streams_repeat(ctx.f32(streams), ctx.f32(residual), N, G, D);
                   }});
  builder.backward_group({{"decoder/mhc_entry/backward",
                           {d_streams},
                           {d_residual},
                           static_cast<double>(N * G * D),
                           [=](const OpContext& ctx) {
                             ctx.kernels->mhc_streams_sum(ctx.f32(d_residual), ctx.f32(d_streams), N, G, D,
                                                          false);
                           }}});
  return streams;
}

BufferId add_mhc_exit(SpecBuilder& builder, BufferId streams, BufferId d_streams, BufferId d_residual) {
  const ModelDims& m = builder.dims();
  const int64_t N = m.N, G = m.G, D = m.D;
  const BufferId residual = builder.activation("decoder/mhc_exit/out", token_shape(m, {{"embed", D}}));
  builder.forward({"decoder/mhc_exit/forward",
                   {streams},
                   {residual},
                   static_cast<double>(N * G * D),
                   [=](const OpContext& ctx) {
                     ctx.kernels->mhc_streams_sum(ctx.f32(residual), ctx.f32(streams), N, G, D, false);
                   }});
  builder.backward_group(
      {{"decoder/mhc_exit/backward", {d_residual}, {d_streams}, 0.0, [=](const OpContext& ctx) {
          ctx.kernels->mhc_streams_repeat(ctx.f32(d_streams), ctx.f32(d_residual), N, G, D);
        }}});
  return residual;
}

}  // namespace meshtrain
