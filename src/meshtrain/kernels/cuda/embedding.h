// Embedding lookup and its gradient on the GPU. Semantics as kernels/cpu/embedding.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

namespace meshtrain::kernels::cuda {

void embedding_forward(float* out,          // [N, D]
                       const int32_t* ids,  // [N]
                       const float* table,  // [R, D]
                       int64_t N, int64_t R, int64_t D, bool accumulate, int64_t vocab_offset,
                       int64_t global_rows);
void embedding_backward(float* dtable,       // [R, D]
                        const int32_t* ids,  // [N]
                        const float* dout,   // [N, D]
                        int64_t N, int64_t R, int64_t D, int64_t vocab_offset, int64_t global_rows);

}  // namespace meshtrain::kernels::cuda
