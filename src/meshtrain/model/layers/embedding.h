// Token embedding (and GPT-2's learned positions) feeding the residual stream, and the final norm with the
// fused unembedding + cross-entropy loss that ends it.
// Legend: B batch, S sequence, D width, V vocab (padded), P learned positions.
#pragma once

#include "meshtrain/model/layers/norm.h"

namespace meshtrain {

struct EmbeddingLayer {
  BufferId residual = kNoBuffer;  // [B, S, D]: the residual stream entering layer 0
  BufferId table = kNoBuffer;     // [V, D]: also the unembedding when tied
};

EmbeddingLayer add_embedding(SpecBuilder& builder, bool learned_positions, BufferId d_residual);
// The token embedding table [V, D] as a parameter: add_embedding's, and a tied head's in a chunk without
// the embedding (shared/specs/pipeline.md: the first and last chunks each hold it).
BufferId add_embedding_table(SpecBuilder& builder);

// Final norm, then loss = sum of cross-entropy over masked targets (the step divides by the global count),
// and beside it the z-loss sum (options.loss: z_loss_multiplier x logsumexp^2 per counted target).
// The unembedding is the embedding table when `tied_table` is set, else its own [D, V] kernel. A decode spec
// ends with the next token's logits instead (ModelSpec::logits).
void add_final_norm_and_loss(SpecBuilder& builder, NormKind norm, BufferId residual, BufferId tied_table,
                             BufferId d_residual);

}  // namespace meshtrain
