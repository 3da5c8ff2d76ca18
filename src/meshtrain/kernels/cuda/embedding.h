// Embedding lookup and its gradient on the GPU. Semantics as kernels/cpu/embedding.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

EmbeddingForward embedding_forward;
EmbeddingBackward embedding_backward;

}  // namespace meshtrain::kernels::cuda
