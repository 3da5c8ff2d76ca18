// The mixture-of-experts router on the GPU: scores, top-k choice and weights, their backward, and the
// load-balance loss. Semantics (and tie-breaking) as kernels/cpu/moe_router.h. Every pointer is device
// memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

MoeRouterForward moe_router_forward;
MoeRouterBackward moe_router_backward;
// Returns the loss to the host: one synchronisation per call.
MoeBalanceLossForward moe_balance_loss_forward;
MoeBalanceLossBackward moe_balance_loss_backward;

}  // namespace meshtrain::kernels::cuda
