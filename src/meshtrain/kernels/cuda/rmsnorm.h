// RMSNorm forward (out in float32, or in bf16 for the matmuls: _bf16) and backward on the GPU, plain and per
// stream (Engram, mHC). Semantics as
// kernels/cpu/rmsnorm.h. Every pointer is device memory (the arena); kernels run on the stream of device.h,
// in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

RmsnormForward rmsnorm_forward;
RmsnormForwardBf16 rmsnorm_forward_bf16;
RmsnormBackward rmsnorm_backward;
RmsnormStreamsForward rmsnorm_streams_forward;
RmsnormStreamsBackward rmsnorm_streams_backward;

}  // namespace meshtrain::kernels::cuda
