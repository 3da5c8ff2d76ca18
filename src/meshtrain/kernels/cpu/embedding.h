// Table lookup out[n] = table[ids[n]] for token (and GPT-2 learned position) embeddings.
// Legend: N tokens, R table rows (vocab or positions), D width.
#pragma once

#include <cstdint>

namespace meshtrain::kernels {

// out[n, :] = table[ids[n], :], or += when accumulate (GPT-2 adds learned positions onto the token
// embedding). Every id must lie in [0, R).
void embedding_forward(float* out,          // [N, D]
                       const int32_t* ids,  // [N]
                       const float* table,  // [R, D]
                       int64_t N, int64_t R, int64_t D, bool accumulate);

// dtable[ids[n], :] += dout[n, :] (scatter-add). Parallel over columns with tokens in order, so repeated ids
// sum in the same order on every run.
void embedding_backward(float* dtable,       // [R, D]
                        const int32_t* ids,  // [N]
                        const float* dout,   // [N, D]
                        int64_t N, int64_t R, int64_t D);

template <class T>
void embedding_reference_forward(T* out,              // [N, D]
                                 const int32_t* ids,  // [N]
                                 const T* table,      // [R, D]
                                 int64_t N, int64_t R, int64_t D, bool accumulate) {
  (void)R;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < D; ++j) {
      const T value = table[ids[n] * D + j];
      out[n * D + j] = accumulate ? out[n * D + j] + value : value;
    }
  }
}

template <class T>
void embedding_reference_backward(T* dtable,           // [R, D]
                                  const int32_t* ids,  // [N]
                                  const T* dout,       // [N, D]
                                  int64_t N, int64_t R, int64_t D) {
  (void)R;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < D; ++j) dtable[ids[n] * D + j] += dout[n * D + j];
  }
}

}  // namespace meshtrain::kernels
