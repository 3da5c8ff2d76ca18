// The device layer of device.h: the process's stream, CUDA error reports, device queries and the arena's
// device memory (one cudaMalloc, zeroed).

#include <cstdlib>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/gemm.h"

namespace meshtrain::kernels::cuda {

void fail_call(const char* library, const char* call, const char* file, int line, const std::string& status,
               const char* hint) {
  fail(std::string(library) + " (" + file + ":" + std::to_string(line) + ")",
       std::string(call) + " to succeed", status, hint);
}

void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  fail_call(
      "CUDA", call, file, line, std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status),
      "check the driver with nvidia-smi; an out-of-memory error means the plan does not fit this device "
      "(meshtrain compile --explain shows its buffers)");
}

namespace {

// This process's place among the ranks on its host, as the launcher numbers them (mpirun, srun); 0 alone.
// The communicator checks the same numbers against MPI's (comm/process_placement.h).
int host_rank() {
  for (const char* variable : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* value = std::getenv(variable)) return std::atoi(value);
  }
  return 0;
}

}  // namespace

cudaStream_t stream() {
  static cudaStream_t created = [] {
    cudaStream_t made = nullptr;
    MT_CUDA(cudaSetDevice(host_rank() % std::max(device_count(), 1)));
    MT_CUDA(cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking));
    return made;
  }();
  return created;
}

void synchronize() {
  MT_CUDA(cudaStreamSynchronize(stream()));
}

std::string device_check() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    return std::string("no usable CUDA driver or GPU (cudaGetDeviceCount: ") + cudaGetErrorName(status) +
           ", " + cudaGetErrorString(status) + ")";
  }
  if (count == 0) return "no CUDA GPU is visible to this process (cudaGetDeviceCount: 0)";
  return "";
}

std::string device_description() {
  const std::string why = device_check();
  if (!why.empty()) return "no GPU: " + why;
  size_t free_bytes = 0, total_bytes = 0;
  memory_info(&free_bytes, &total_bytes);  // selects this process's GPU (stream())
  int device = 0;
  MT_CUDA(cudaGetDevice(&device));
  cudaDeviceProp properties{};
  MT_CUDA(cudaGetDeviceProperties(&properties, device));
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return std::string(properties.name) + " (sm_" + std::to_string(properties.major) +
         std::to_string(properties.minor) + ", " + to_text(static_cast<double>(total_bytes) / kGiB) +
         " GiB, " + to_text(static_cast<double>(free_bytes) / kGiB) + " GiB free)";
}

// What a process holds on the device beside its arena and beyond its CUDA context (which is created before
// the free memory is read, so that is already counted as used): cuBLASLt's workspace, and an allowance for
// the kernel modules and cuBLASLt's handle, loaded at the first kernel. The allowance is declared, not
// measured apart from the context: the whole was 567 MiB on an H200 with the context (docs/gpus.md).
constexpr size_t kModuleAllowanceBytes = size_t{256} << 20;

DeviceResources device_resources() {
  cudaDeviceProp properties{};
  MT_CUDA(cudaGetDeviceProperties(&properties, 0));
  size_t free_bytes = 0, total_bytes = 0;
  memory_info(&free_bytes, &total_bytes);
  DeviceResources device;
  device.name = std::string(properties.name) + " (GPU 0, compute capability " +
                std::to_string(properties.major) + "." + std::to_string(properties.minor) + ")";
  device.free_bytes = free_bytes;
  device.overhead_bytes = gemm_workspace_bytes() + kModuleAllowanceBytes;
  device.bf16 = properties.major >= 8;  // bf16 tensor cores: Ampere (8.0) and later
  return device;
}

bool memory_on_host() {
  return false;
}

void* memory_allocate(size_t bytes) {
  stream();  // selects the device
  void* base = nullptr;
  if (cudaMalloc(&base, bytes) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());  // clear the sticky out-of-memory state; the caller reports it
    return nullptr;
  }
  MT_CUDA(cudaMemsetAsync(base, 0, bytes, stream()));
  synchronize();
  return base;
}

void memory_free(void* base) {
  if (base == nullptr) return;
  static_cast<void>(cudaStreamSynchronize(stream()));
  static_cast<void>(cudaFree(base));
}

void memory_copy_in(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return;
  // Synchronous with respect to the host buffer: it may be reused as soon as this returns.
  MT_CUDA(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream()));
  synchronize();
}

void memory_copy_out(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return;
  MT_CUDA(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream()));
  synchronize();
}

void memory_fill(void* device, uint8_t byte, size_t bytes) {
  if (bytes == 0) return;
  MT_CUDA(cudaMemsetAsync(device, byte, bytes, stream()));
}

bool memory_is_device(const void* pointer) {
  cudaPointerAttributes attributes{};
  // A host pointer CUDA has never seen is cudaMemoryTypeUnregistered (not an error since CUDA 11).
  MT_CUDA(cudaPointerGetAttributes(&attributes, pointer));
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

int device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

void memory_info(size_t* free_bytes, size_t* total_bytes) {
  stream();
  MT_CUDA(cudaMemGetInfo(free_bytes, total_bytes));
}

}  // namespace meshtrain::kernels::cuda
