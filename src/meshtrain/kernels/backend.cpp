// The choice of kernel backend by device kind: the one place a new backend is named.
#include "meshtrain/kernels/backend.h"

#include "meshtrain/kernels/cpu/backend.h"

namespace meshtrain::kernels {

namespace {

// An accelerator kind is planned (and its scratch sized) with the cpu kernels until kernels/cuda/ exists,
// except in what an accelerator backend stores: activations in the compute dtype, and no rounded-input
// scratch (its matmuls take bf16 operands directly). Its ops never run here (engine.cpp refuses non-cpu
// topologies).
DType compute_dtype_activations(DType compute) {
  return compute;
}
int64_t no_matmul_bf16_scratch(int64_t, int64_t, int64_t) {
  return 0;
}
int64_t no_cross_entropy_bf16_scratch(int64_t, int64_t, int64_t) {
  return 0;
}

const KernelBackend& accelerator_planning_backend() {
  static const KernelBackend table = [] {
    KernelBackend planning = cpu_backend();
    planning.name = "cpu (planning an accelerator)";
    planning.activation_dtype = compute_dtype_activations;
    planning.matmul_bf16_scratch_elements = no_matmul_bf16_scratch;
    planning.cross_entropy_bf16_scratch_elements = no_cross_entropy_bf16_scratch;
    return planning;
  }();
  return table;
}

}  // namespace

const KernelBackend& kernel_backend_for_device(const std::string& device_kind) {
  return device_kind == "cpu" ? cpu_backend() : accelerator_planning_backend();
}

}  // namespace meshtrain::kernels
