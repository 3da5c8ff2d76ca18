// Causal grouped-query attention on the GPU, flash-style: tiles of queries against tiles of keys with an
// online softmax, no [S, S] matrix stored; the backward recomputes scores from q, k and lse. Masking by
// positions and segment ids, semantics as kernels/cpu/attention.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

namespace meshtrain::kernels::cuda {

void attention_forward(float* out,                  // [B, S, H, d]
                       float* lse,                  // [B, H, S]
                       const float* q,              // [B, S, H, d]
                       const float* k,              // [B, S, K, d]
                       const float* v,              // [B, S, K, d]
                       const int32_t* positions,    // [B, S]
                       const int32_t* segment_ids,  // [B, S] or nullptr
                       int64_t B, int64_t S, int64_t H, int64_t K, int64_t d);
void attention_backward(float* dq,                   // [B, S, H, d]
                        float* dk,                   // [B, S, K, d]
                        float* dv,                   // [B, S, K, d]
                        const float* dout,           // [B, S, H, d]
                        const float* out,            // [B, S, H, d]
                        const float* lse,            // [B, H, S]
                        const float* q,              // [B, S, H, d]
                        const float* k,              // [B, S, K, d]
                        const float* v,              // [B, S, K, d]
                        const int32_t* positions,    // [B, S]
                        const int32_t* segment_ids,  // [B, S] or nullptr
                        int64_t B, int64_t S, int64_t H, int64_t K, int64_t d, float* scratch);

}  // namespace meshtrain::kernels::cuda
