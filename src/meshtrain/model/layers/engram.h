// Engram n-gram memory (shared/specs/engram.md) as spec ops, forward and backward side by side. At the start
// of an Engram layer, before attention, every residual stream gets the block's output for it:
//   h      = RMSNorm_engram(x)                     per stream, one [D] scale
//   e      = concat_i table[hash_ids_i + offset_i] the memory read, [N, D_en]
//   key_g  = e Wk[:, g] + bk[g];  q_g = RMSNorm_q[g](h_g);  k_g = RMSNorm_k[g](key_g)
//   v      = e Wv + bv;           gated_g = sigmoid(signed sqrt(<q_g, k_g> / sqrt(D))) v
//   u      = RMSNorm_c[g](gated); y = ShortConv(u) (dilation N, K taps, causal, zeros before the row)
//   x_out  = x + gated + silu(y)
// The hash ids are inputs: the data path hashes natural-order rows before any context-parallel reorder
// (data/engram_hash.h), so array neighbours never stand in for time neighbours here. The table's rows are
// split like the vocabulary (logical axis `engram_rows`): each rank reads the rows it holds (zeros
// elsewhere) and an all-reduce sums the lookup, as the vocab-parallel embedding does.
// Legend: B batch, S sequence, N tokens (B S), G residual streams, D width, H_e hash heads per order,
// n the max n-gram size, Dh table row width, D_en = H_e (n - 1) Dh, K conv taps, R table rows held here.
#pragma once

#include <string>

#include "meshtrain/model/layers/norm.h"

namespace meshtrain {

// Returns the streams after the block [B, S, G, D] (G = 1: [B, S, D]); `engram_index` is the layer's place
// in engram_layers. The backward group reads d_streams (dL/d out) and leaves dL/d streams_in in it.
BufferId add_engram_block(SpecBuilder& builder, const std::string& prefix, size_t engram_index,
                          BufferId streams_in, BufferId d_streams);

// What `info` and `compile` report of a spec's Engram layers (per device, as the spec's sizes are).
struct EngramCounts {
  int64_t layers = 0, tables = 0;  // tables: H_e (n - 1) per layer
  int64_t rows = 0;                // every table's rows (primes), all layers, before padding
  int64_t rows_per_token = 0;      // table rows one token reads in each layer: H_e (n - 1)
  int64_t table_parameters = 0;    // allocated here (rows padded, split over engram_rows' mesh axes)
  // shared/specs/engram.md section 8, forward, one micro-batch: key 2 N D_en G D, value 2 N D_en D,
  // conv 2 N K G D, gate dot 2 N G D per layer (a training step: x 3).
  double forward_flops = 0.0;
};
EngramCounts engram_counts(const ModelSpec& spec);
// Whether a parameter is an Engram table (its own optimizer group); by name, also the plan's buffers that
// hold it (its gradient, moments and shards: "grad/...", "fsdp_shard/...", ...).
bool is_engram_table(const std::string& name);
bool is_engram_table(const ParameterDecl& parameter);

// The shape of the residual streams: [B, S, G, D], or [B, S, D] without mHC.
Shape stream_shape(const ModelDims& m);

}  // namespace meshtrain
