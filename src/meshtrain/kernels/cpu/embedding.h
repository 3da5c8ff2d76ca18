// Table lookup out[n] = table[ids[n]] for token (and GPT-2 learned position) embeddings, optionally
// vocab-parallel (Megatron-style tensor parallelism): the table is one rank's contiguous slice of rows.
// Legend: N tokens, R table rows held here (vocab or positions), D width, vocab_offset the global row of
// local row 0, global_rows the rows of the whole (padded) table over all ranks.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// out[n, :] = table[ids[n] - vocab_offset, :], or += when accumulate (GPT-2 adds learned positions onto the
// token embedding). Every id must lie in [0, global_rows); global_rows < 0 means vocab_offset + R (the
// whole table is here: with vocab_offset 0 and global_rows -1, every id must lie in [0, R)).
// Vocab-parallel: an id outside [vocab_offset, vocab_offset + R) gives a zero row (written mode) or leaves
// out[n] unchanged (accumulate), so summing the written outputs of all ranks gives the full lookup. Rank
// r of t passes vocab_offset = r * R and global_rows = t * R (also rank 0: otherwise ids >= R are errors).
EmbeddingForward embedding_forward;

// dtable[ids[n] - vocab_offset, :] += dout[n, :] (scatter-add) for the ids this rank holds; other ids add
// nothing. Parallel over columns with tokens in order, so repeated ids sum in the same order on every run.
// Ids are checked as in embedding_forward.
EmbeddingBackward embedding_backward;

// References: same semantics, no id checks.
template <class T>
void embedding_reference_forward(T* out, const int32_t* ids, const T* table, int64_t N, int64_t R, int64_t D,
                                 bool accumulate, int64_t vocab_offset = 0) {
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row = ids[n] - vocab_offset;
    const bool here = row >= 0 && row < R;
    for (int64_t j = 0; j < D; ++j) {
      const T value = here ? table[row * D + j] : T(0);
      out[n * D + j] = accumulate ? out[n * D + j] + value : value;
    }
  }
}

template <class T>
void embedding_reference_backward(T* dtable, const int32_t* ids, const T* dout, int64_t N, int64_t R,
                                  int64_t D, int64_t vocab_offset = 0) {
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row = ids[n] - vocab_offset;
    if (row < 0 || row >= R) continue;
    for (int64_t j = 0; j < D; ++j) dtable[row * D + j] += dout[n * D + j];
  }
}

}  // namespace meshtrain::kernels
