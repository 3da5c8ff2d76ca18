// Dispatch and combine of a mixture-of-experts layer on the GPU: the gather of token rows into the experts'
// sorted rows, the weighted combine back into tokens, and their backward. Semantics as
// kernels/cpu/moe_dispatch.h. The routing plan (moe_route_plan) is not here: it is the cpu's serial counting
// sort run on host copies (kernels/backend.cpp), since its dropped count goes to the host anyway. Every
// pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

MoeGatherForward moe_gather_forward;
MoeGatherBackward moe_gather_backward;
MoeCombineForward moe_combine_forward;
MoeCombineBackward moe_combine_backward;

}  // namespace meshtrain::kernels::cuda
