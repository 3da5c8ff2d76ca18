// Fused unembedding + softmax cross-entropy on the GPU, a chunk of tokens at a time (the chunk's logits
// in scratch, never all [N, V]), and plain logits. Semantics as kernels/cpu/cross_entropy.h, without the
// z-loss (z_loss_multiplier must be 0: not run on a GPU yet, so the run refuses it on NVIDIA topologies).
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/arguments.h"
#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

UnembedCrossEntropy unembed_cross_entropy;
UnembedLogits unembed_logits;

}  // namespace meshtrain::kernels::cuda
