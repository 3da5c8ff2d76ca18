// Causal grouped-query attention on the GPU, flash-style: tiles of queries against tiles of keys with an
// online softmax, no [S, S] matrix stored; the backward recomputes scores from q, k and lse. Masking by
// positions and segment ids, semantics as kernels/cpu/attention.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

// float32 on the CUDA cores (attention.cu): any head width 1..256.
AttentionForward attention_forward;
AttentionBackward attention_backward;

// dtype=bfloat16 (attention_bf16.cu): the products on the tensor cores, bf16 operands rounded where the cpu
// bf16 kernels round them, float32 accumulation; same arguments, layouts, masks and scratch as above, and
// deterministic. Head widths up to 128 (and GPUs from sm_80 on); wider heads run the float32 kernels.
AttentionForward attention_forward_bf16;
AttentionBackward attention_backward_bf16;

}  // namespace meshtrain::kernels::cuda
