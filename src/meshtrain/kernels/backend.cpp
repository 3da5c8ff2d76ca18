// The choice of kernel backend by device kind: the one place a new backend is named.
#include "meshtrain/kernels/backend.h"

#include "meshtrain/kernels/cpu/backend.h"
#ifdef MESHTRAIN_WITH_CUDA
#include "meshtrain/kernels/cuda/backend.h"
#endif

namespace meshtrain::kernels {

namespace {

// An accelerator kind without a backend of its own is planned (and its scratch sized) with the cpu
// kernels, except in what an accelerator backend stores: activations in the compute dtype, and no
// rounded-input scratch (its matmuls take bf16 operands directly). Its ops never run here (engine.cpp
// refuses a backend whose device_check is not empty).
DType compute_dtype_activations(DType compute) {
  return compute;
}
int64_t no_matmul_bf16_scratch(int64_t, int64_t, int64_t) {
  return 0;
}
int64_t no_cross_entropy_bf16_scratch(int64_t, int64_t, int64_t) {
  return 0;
}
std::string planning_only() {
  return "no kernel backend for this device kind is built: it is planned only (meshtrain compile)";
}

const KernelBackend& accelerator_planning_backend() {
  static const KernelBackend table = [] {
    KernelBackend planning = cpu_backend();
    planning.name = "cpu (planning an accelerator)";
    planning.device_check = planning_only;
    planning.activation_dtype = compute_dtype_activations;
    planning.matmul_bf16_scratch_elements = no_matmul_bf16_scratch;
    planning.cross_entropy_bf16_scratch_elements = no_cross_entropy_bf16_scratch;
    return planning;
  }();
  return table;
}

#ifndef MESHTRAIN_WITH_CUDA
std::string cuda_not_built() {
  return "this meshtrain was built without CUDA (CMake found no nvcc, or MESHTRAIN_CUDA=OFF): rebuild where "
         "the CUDA toolkit is installed to train on NVIDIA GPUs";
}
#endif

// NVIDIA GPUs: the cuda kernels where built. The CUDA kernels store float32 activations and take the cpu
// kernels' scratch (dtype=bfloat16 rounds every dense matmul's inputs into the same planned scratch), so
// the sizing entries are the cpu table's in both builds and a plan does not depend on the build.
const KernelBackend& nvidia_backend() {
  static const KernelBackend table = [] {
    const KernelBackend& cpu = cpu_backend();
#ifdef MESHTRAIN_WITH_CUDA
    KernelBackend nvidia = cuda::cuda_backend();
#else
    KernelBackend nvidia = cpu;  // slots filled for planning; device_check refuses a run
    nvidia.name = "cuda (not built)";
    nvidia.device_check = cuda_not_built;
#endif
    nvidia.activation_dtype = cpu.activation_dtype;
    nvidia.matmul_bf16_scratch_elements = cpu.matmul_bf16_scratch_elements;
    nvidia.cross_entropy_scratch_floats = cpu.cross_entropy_scratch_floats;
    nvidia.cross_entropy_bf16_scratch_elements = cpu.cross_entropy_bf16_scratch_elements;
    nvidia.attention_backward_scratch_floats = cpu.attention_backward_scratch_floats;
    nvidia.context_attention_backward_scratch_floats = cpu.context_attention_backward_scratch_floats;
    return nvidia;
  }();
  return table;
}

}  // namespace

bool nvidia_device_kind(const std::string& device_kind) {
  return device_kind == "a100" || device_kind == "h100" || device_kind == "h200" || device_kind == "b200";
}

const KernelBackend& kernel_backend_for_device(const std::string& device_kind) {
  if (device_kind == "cpu") return cpu_backend();
  return nvidia_device_kind(device_kind) ? nvidia_backend() : accelerator_planning_backend();
}

}  // namespace meshtrain::kernels
