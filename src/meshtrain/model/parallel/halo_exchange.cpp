#include "meshtrain/model/parallel/halo_exchange.h"

#include <algorithm>

#include "meshtrain/core/error.h"
#include "meshtrain/model/parallel/context_attention.h"

namespace meshtrain {

OpDecl ShortConvHalos::pass(const SpecBuilder& builder, const std::string& name) const {
  return context_passes(builder, name, send, 1);
}

void ShortConvHalos::exchange_halo(const OpContext& ctx, float* u, float* halo,
                                   const std::string& name) const {
  const kernels::ContextRing& ring = *ctx.context_ring;
  float* out = ctx.f32(send);
  float* in = ctx.f32(receive);
  const auto span = static_cast<size_t>(history * width);
  for (int64_t run = 0; run < stretches; ++run)
    for (int64_t b = 0; b < rows; ++b)
      std::copy_n(tail(u, b, run), span, out + (run * rows + b) * history * width);
  ring.start_pass(pass_view(out), pass_view(in), name);
  if (stretches == 2) ring.start_reverse_pass(pass_view(out + block()), pass_view(in + block()), name);
  ring.wait(name);
  for (int64_t b = 0; b < rows; ++b) {
    float* first = halo + (b * stretches) * history * width;
    if (ring.rank == 0) {
      std::fill_n(first, span, 0.0f);
    } else {
      std::copy_n(in + b * history * width, span, first);
    }
    if (stretches == 2) {
      const float* second_source = ring.rank == ring.size - 1
                                       ? out + b * history * width           // own run 0
                                       : in + (rows + b) * history * width;  // rank r+1
      std::copy_n(second_source, span, first + history * width);
    }
  }
}

void ShortConvHalos::return_halo_gradient(const OpContext& ctx, const float* d_halo, float* d_u,
                                          const std::string& name) const {
  const kernels::ContextRing& ring = *ctx.context_ring;
  float* out = ctx.f32(send);
  float* in = ctx.f32(receive);
  const auto span = static_cast<size_t>(history * width);
  const auto add = [span](float* into, const float* from) {
    for (size_t i = 0; i < span; ++i) into[i] += from[i];
  };
  for (int64_t b = 0; b < rows; ++b) {
    const float* first = d_halo + (b * stretches) * history * width;
    // Rank 0's first halo was zeros, and rank C - 1's second its own: neither goes anywhere.
    if (ring.rank == 0) {
      std::fill_n(out + b * history * width, span, 0.0f);
    } else {
      std::copy_n(first, span, out + b * history * width);
    }
    if (stretches == 2) {
      float* second_out = out + (rows + b) * history * width;
      if (ring.rank == ring.size - 1) {
        add(tail(d_u, b, 0), first + history * width);
        std::fill_n(second_out, span, 0.0f);
      } else {
        std::copy_n(first + history * width, span, second_out);
      }
    }
  }
  ring.start_reverse_pass(pass_view(out), pass_view(in), name);
  if (stretches == 2) ring.start_pass(pass_view(out + block()), pass_view(in + block()), name);
  ring.wait(name);
  for (int64_t run = 0; run < stretches; ++run)
    for (int64_t b = 0; b < rows; ++b) add(tail(d_u, b, run), in + (run * rows + b) * history * width);
}

ShortConvHalos short_conv_halos(SpecBuilder& builder, int64_t history, int64_t width) {
  const ContextOptions& context = builder.spec().options.context;
  const ContextReorder reorder = context.reorder;
  const ModelDims& m = builder.dims();
  ShortConvHalos halos;
  halos.length = m.S;
  halos.history = history;
  halos.rows = m.B;
  halos.width = width;
  const int64_t C = builder.decoding() ? 1 : context_ranks(builder);
  if (C == 1 || history == 0) return halos;
  if (reorder == ContextReorder::striped) {
    fail("config key 'context_parallel_reorder'",
         "dual_chunk_swap (or context_parallel_load_balance=false) under mesh.context > 1 with Engram's "
         "ShortConv: each striped token's history lies on other ranks, so no halo suffices",
         "striped", "use context_parallel_reorder=dual_chunk_swap, or engram_kernel_size=1 (no history)");
  }
  halos.stretches = reorder == ContextReorder::dual_chunk_swap ? 2 : 1;
  halos.length = m.S / halos.stretches;
  if (halos.length < history) {
    fail("config key 'max_target_length'",
         "context chunks of at least the ShortConv's halo, (engram_kernel_size - 1) x engram_max_ngram_size "
         "= " +
             std::to_string(history) + " tokens",
         "chunks of " + std::to_string(halos.length) + " tokens (max_target_length " +
             std::to_string(context.sequence_length) + " over " + std::to_string(C * halos.stretches) +
             " chunks)",
         "raise max_target_length, or lower mesh.context or engram_kernel_size");
  }
  const Shape passes = shape_of({{"halo_passes", halos.stretches * halos.block()}});
  halos.send = builder.scratch("scratch/engram_halo_send", passes);
  halos.receive = builder.scratch("scratch/engram_halo_receive", passes);
  return halos;
}

}  // namespace meshtrain
