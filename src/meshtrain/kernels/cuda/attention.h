// Causal grouped-query attention on the GPU, flash-style: tiles of queries against tiles of keys with an
// online softmax, no [S, S] matrix stored; the backward recomputes scores from q, k and lse. Masking by
// positions and segment ids, semantics as kernels/cpu/attention.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

AttentionForward attention_forward;
AttentionBackward attention_backward;

}  // namespace meshtrain::kernels::cuda
