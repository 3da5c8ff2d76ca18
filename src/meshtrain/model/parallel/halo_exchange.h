// Halo exchange between context ranks: Engram's ShortConv reads, before each run of consecutive tokens a
// context rank holds, the last inputs of the run's natural predecessor on another rank. This block declares
// the passes to the plan and moves the halos through the runtime's context ring (kernels/collectives.h).
// Legend: B batch, G D the conv's width (streams x width), H the halo's history (taps - 1) x dilation.
#pragma once

#include <string>

#include "meshtrain/model/spec_builder.h"

namespace meshtrain {

// Engram's ShortConv under context parallelism (shared/specs/engram.md section 7). A context rank's tokens
// are `stretches` runs of consecutive natural times per row (dual_chunk_swap: chunks r and 2C-1-r; a plain
// split: chunk r), `length` tokens each. The conv runs on each run as a row of its own, whose times before
// the run read its halo: the last `history` inputs of the run's natural predecessor,
//   run 0 (chunk r): chunk r - 1, the first run of rank r - 1 (zeros on rank 0): passed to the next rank;
//   run 1 (chunk 2C-1-r): chunk 2C-2-r, the second run of rank r + 1, or on rank C - 1 its own first run:
//   passed to the previous rank.
// So each rank sends 2 x history x G D values per row under dual_chunk_swap (1 x under a plain split), the
// same whatever S, and the conv is then exactly the natural-order one. The backward returns each halo's
// gradient the same ways reversed. `send` / `receive` are [runs, B, history, G D] (one pass per run); the
// halo is [B runs, history, G D], rows (b, run) as the kernel's.
struct ShortConvHalos {
  int64_t stretches = 1, length = 0, history = 0, rows = 0, width = 0;  // runs, tokens per run, H, B, G D
  BufferId send = kNoBuffer, receive = kNoBuffer;                       // kNoBuffer: no exchange

  bool exchanges() const { return send != kNoBuffer; }
  Shape halo_shape() const {
    return shape_of({{"conv_rows", rows * stretches}, {"conv_history", history}, {"mhc_width", width}});
  }
  int64_t block() const { return rows * history * width; }      // one pass: a run's tails of every row
  float* tail(float* values, int64_t row, int64_t run) const {  // the last `history` times of a run
    return values + ((row * stretches + run) * length + length - history) * width;
  }
  TensorView pass_view(float* values) const { return {values, DType::f32, shape_of({{"halo", block()}})}; }

  // The plan's record of one pass of the halos (or their gradients) over context, before the op that moves
  // them.
  OpDecl pass(const SpecBuilder& builder, const std::string& name) const;
  // Sends the tails of this rank's runs of `u` and fills `halo` with the predecessors' tails.
  void exchange_halo(const OpContext& ctx, float* u, float* halo, const std::string& name) const;
  // Returns each halo's gradient `d_halo` to the rank whose inputs it was, which adds it into `d_u`.
  void return_halo_gradient(const OpContext& ctx, const float* d_halo, float* d_u,
                            const std::string& name) const;
};

// The layout above for this spec, or none (exchanges() false): one context rank, a decode step, or a
// pointwise conv (K = 1 reads no history, and a pointwise op commutes with any reorder).
ShortConvHalos short_conv_halos(SpecBuilder& builder, int64_t history, int64_t width);

}  // namespace meshtrain
