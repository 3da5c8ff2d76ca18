// Engram's ShortConv (the causal depthwise convolution with its halo) and the block's output on the GPU.
// Semantics as kernels/cpu/short_conv.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

ShortConvForward short_conv_forward;
ShortConvBackward short_conv_backward;
ShortConvOutputForward short_conv_output_forward;
ShortConvOutputBackward short_conv_output_backward;

}  // namespace meshtrain::kernels::cuda
