// Fused unembedding + softmax cross-entropy on the GPU, a chunk of tokens at a time (the chunk's logits
// in scratch, never all [N, V]), and plain logits. Semantics as kernels/cpu/cross_entropy.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/arguments.h"

namespace meshtrain::kernels::cuda {

CrossEntropySums unembed_cross_entropy(float* dh,       // [N, D] or nullptr
                                       float* dw,       // layout of w, or nullptr
                                       const float* h,  // [N, D]
                                       const float* w,  // [D, V] kernel_DV or [V, D] table_VD
                                       UnembedLayout layout,
                                       const int32_t* targets,    // [N]
                                       const uint8_t* loss_mask,  // [N] or nullptr
                                       int64_t N, int64_t D, int64_t V, int64_t vocab_valid,
                                       int64_t chunk_tokens,  // C
                                       float* scratch,        // [cross_entropy_scratch_floats(C, V)]
                                       const VocabParallel* vocab_parallel,  // nullptr: one rank
                                       uint16_t* bf16_inputs);
void unembed_logits(float* out,      // [N, V]
                    const float* h,  // [N, D]
                    const float* w,  // [D, V] kernel_DV or [V, D] table_VD
                    UnembedLayout layout, int64_t N, int64_t D, int64_t V, int64_t vocab_valid);

}  // namespace meshtrain::kernels::cuda
