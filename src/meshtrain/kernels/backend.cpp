// The choice of kernel backend by device kind: the one place a new backend is named.
#include "meshtrain/kernels/backend.h"

#include "meshtrain/kernels/cpu/backend.h"

namespace meshtrain::kernels {

// Every kind runs the cpu kernels until kernels/cuda/ exists (see backend.h).
const KernelBackend& kernel_backend_for_device(const std::string& /*device_kind*/) {
  return cpu_backend();
}

}  // namespace meshtrain::kernels
