// The choice of kernel backend by device kind: the one place a new backend is named.
#include "meshtrain/kernels/backend.h"

#include <dlfcn.h>

#include <filesystem>
#include <vector>

#include "meshtrain/kernels/cpu/backend.h"

namespace meshtrain::kernels {

namespace {

// An accelerator kind without a backend of its own is planned (and its scratch sized) with the cpu
// kernels, except in what an accelerator backend stores: activations in the compute dtype, and no
// rounded-input scratch (its matmuls take bf16 operands directly). Its ops never run here (engine.cpp
// refuses a backend whose device_check is not empty).
DType compute_dtype_activations(DType compute) {
  return compute;
}
int64_t no_matmul_bf16_scratch(int64_t, int64_t, int64_t, bool) {
  return 0;
}
int64_t no_cross_entropy_bf16_scratch(int64_t, int64_t, int64_t, int64_t) {
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
    planning.matmul_input_dtype = compute_dtype_activations;
    planning.matmul_bf16_scratch_elements = no_matmul_bf16_scratch;
    planning.cross_entropy_bf16_scratch_elements = no_cross_entropy_bf16_scratch;
    return planning;
  }();
  return table;
}

// Why the cuda table cannot run here, when it cannot be loaded at all.
std::string& cuda_unavailable() {
  static std::string why;
  return why;
}
std::string cuda_unavailable_check() {
  return cuda_unavailable();
}

// The cuda kernels' table from libmeshtrain_kernels_cuda.so beside this library, loaded on first use (a cpu
// run never maps the CUDA runtime and cuBLASLt); null with cuda_unavailable() saying why.
const KernelBackend* load_cuda_backend() {
#ifdef MESHTRAIN_WITH_CUDA
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&kernel_backend_for_device), &self) == 0 || self.dli_fname == nullptr) {
    cuda_unavailable() = "the cuda backend's library could not be located (dladdr failed)";
    return nullptr;
  }
  const std::string path =
      (std::filesystem::path(self.dli_fname).parent_path() / "libmeshtrain_kernels_cuda.so").string();
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept loaded for the process's life
  if (library == nullptr) {
    cuda_unavailable() = std::string("the cuda backend could not be loaded (") + dlerror() +
                         "): install the CUDA runtime and cuBLAS it was built with";
    return nullptr;
  }
  using Entry = const KernelBackend* (*)();
  const auto entry = reinterpret_cast<Entry>(dlsym(library, "meshtrain_cuda_backend"));
  if (entry == nullptr) {
    cuda_unavailable() = path + " has no meshtrain_cuda_backend: a library of another build";
    return nullptr;
  }
  return entry();
#else
  cuda_unavailable() =
      "this meshtrain was built without CUDA (CMake found no nvcc, or MESHTRAIN_CUDA=OFF): rebuild where the "
      "CUDA toolkit is installed to train on NVIDIA GPUs";
  return nullptr;
#endif
}

const KernelBackend& nvidia_backend();

// The routing plan on a device arena: the cpu's serial counting sort (cpu/moe_dispatch.h) on host copies of
// its input and outputs. The layer reads the dropped count and the expert loads on the host anyway, so a
// device sort would save one copy of M int32s each way, not the synchronisation.
int64_t staged_moe_route_plan(int32_t* counts, int32_t* offsets, int32_t* sorted, int32_t* position,
                              int32_t* assigned, const int32_t* chosen, int64_t N, int64_t k, int64_t E,
                              int64_t capacity) {
  const KernelBackend& device = nvidia_backend();
  const auto M = static_cast<size_t>(N * k), experts = static_cast<size_t>(E);
  std::vector<int32_t> host_chosen(M), host_counts(experts), host_offsets(experts + 1), host_sorted(M),
      host_position(M), host_assigned(experts);
  device.memory_copy_out(host_chosen.data(), chosen, M * sizeof(int32_t));
  const int64_t dropped = cpu_backend().moe_route_plan(
      host_counts.data(), host_offsets.data(), host_sorted.data(), host_position.data(), host_assigned.data(),
      host_chosen.data(), N, k, E, capacity);
  const auto copy_in = [&](int32_t* target, const std::vector<int32_t>& host) {
    device.memory_copy_in(target, host.data(), host.size() * sizeof(int32_t));
  };
  copy_in(counts, host_counts);
  copy_in(offsets, host_offsets);
  copy_in(sorted, host_sorted);
  copy_in(position, host_position);
  if (assigned != nullptr) copy_in(assigned, host_assigned);
  return dropped;
}

// NVIDIA GPUs: the cuda kernels where built and loadable. The CUDA kernels store activations as the cpu
// kernels do (float32, and under dtype=bfloat16 the matmul-only inputs in bf16, written rounded by the norms,
// SwiGLU and GELU) and take the cpu kernels' scratch, so the dtype and sizing entries are the cpu table's in
// every case and a plan does not depend on the build.
const KernelBackend& nvidia_backend() {
  static const KernelBackend table = [] {
    const KernelBackend& cpu = cpu_backend();
    KernelBackend nvidia = cpu;  // without the cuda kernels: the cpu functions in the slots, for planning
    if (const KernelBackend* cuda = load_cuda_backend()) {
      nvidia = *cuda;
      nvidia.moe_route_plan = staged_moe_route_plan;
    } else {
      nvidia.name = "cuda (not loaded)";
      nvidia.device_check = cuda_unavailable_check;
    }
    nvidia.activation_dtype = cpu.activation_dtype;
    nvidia.matmul_input_dtype = cpu.matmul_input_dtype;
    nvidia.matmul_bf16_scratch_elements = cpu.matmul_bf16_scratch_elements;
    nvidia.cross_entropy_scratch_floats = cpu.cross_entropy_scratch_floats;
    nvidia.cross_entropy_bf16_scratch_elements = cpu.cross_entropy_bf16_scratch_elements;
    nvidia.attention_backward_scratch_floats = cpu.attention_backward_scratch_floats;
    nvidia.context_attention_backward_scratch_floats = cpu.context_attention_backward_scratch_floats;
    nvidia.muon_scratch_floats = cpu.muon_scratch_floats;  // planned; the engine refuses Muon on cuda
    // The cuda table's own bf16 attention (tensor cores) is kept; it has no context attention in either
    // dtype.
    nvidia.context_attention_forward_bf16 = nvidia.context_attention_forward;
    nvidia.context_attention_backward_bf16 = nvidia.context_attention_backward;
    return nvidia;
  }();
  return table;
}

}  // namespace

AttentionKernels attention_kernels(const KernelBackend& backend, DType compute) {
  if (compute == DType::bf16) {
    return {backend.attention_forward_bf16, backend.attention_backward_bf16,
            backend.context_attention_forward_bf16, backend.context_attention_backward_bf16};
  }
  return {backend.attention_forward, backend.attention_backward, backend.context_attention_forward,
          backend.context_attention_backward};
}

bool nvidia_device_kind(const std::string& device_kind) {
  return device_kind == "a100" || device_kind == "h100" || device_kind == "h200" || device_kind == "b200";
}

const KernelBackend& kernel_backend_for_device(const std::string& device_kind) {
  if (device_kind == "cpu") return cpu_backend();
  return nvidia_device_kind(device_kind) ? nvidia_backend() : accelerator_planning_backend();
}

}  // namespace meshtrain::kernels
