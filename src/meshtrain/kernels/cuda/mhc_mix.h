// mHC's stream mixes on the GPU: a site's coefficients, the collapse into a sublayer's input and the expand
// of its output, the streams' entry and exit. Semantics as kernels/cpu/mhc_mix.h.
// Every pointer is device memory (the arena); kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

MhcCoefficientsForward mhc_coefficients_forward;
MhcCoefficientsBackward mhc_coefficients_backward;
MhcCollapseForward mhc_collapse_forward;
MhcCollapseBackward mhc_collapse_backward;
MhcExpandForward mhc_expand_forward;
MhcExpandBackward mhc_expand_backward;
MhcStreamsRepeat mhc_streams_repeat;
MhcStreamsSum mhc_streams_sum;

}  // namespace meshtrain::kernels::cuda
