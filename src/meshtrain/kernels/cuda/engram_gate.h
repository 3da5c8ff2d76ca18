// Engram's gate on the GPU. Semantics as kernels/cpu/engram_gate.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

EngramGateForward engram_gate_forward;
EngramGateBackward engram_gate_backward;

}  // namespace meshtrain::kernels::cuda
