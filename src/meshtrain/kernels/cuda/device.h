// The CUDA device of this process: the one stream every kernel, copy and cuBLASLt call runs on (so ops run
// in the engine's order without further synchronisation), error checks that name the failed call, launch
// sizes, and the memory entries of the kernel table (kernels/backend.h). Included by the .cu files and the
// table only: nothing outside kernels/cuda/ sees a CUDA type.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "meshtrain/kernels/backend.h"

namespace meshtrain::kernels::cuda {

// The stream of this process's device work (created on first use, on the GPU of this process's place among
// the ranks on its host, modulo the GPUs it sees: device 0 for one process, and for every process sharing
// one GPU).
cudaStream_t stream();

// A failed CUDA call as an error naming the call, the file and line, and CUDA's own message.
void check(cudaError_t status, const char* call, const char* file, int line);

// The error of a failed call of the CUDA runtime or of a CUDA library (`library`: "CUDA", "cuBLASLt"): the
// call, the file and line, the library's status in words and what to check.
[[noreturn]] void fail_call(const char* library, const char* call, const char* file, int line,
                            const std::string& status, const char* hint);

// Waits for every queued kernel and copy (the host reads results only after this or a memory_copy_out).
void synchronize();

// Blocks of `threads` covering `count` items (at least one block).
inline unsigned blocks_for(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

// The launch of an elementwise kernel, a grid-stride loop over `count` items: kElementwiseThreads threads a
// block and at most kElementwiseMaxBlocks blocks (about two waves of a full H100 / H200); the loop covers the
// rest.
constexpr int kElementwiseThreads = 256;
constexpr int64_t kElementwiseMaxBlocks = 2048;
inline unsigned elementwise_blocks(int64_t count) {
  return blocks_for(std::min(count, kElementwiseMaxBlocks * kElementwiseThreads), kElementwiseThreads);
}

// Table entries (kernels/backend.h).
std::string device_check();
std::string device_description();
DeviceResources device_resources();
bool memory_on_host();                // false
void* memory_allocate(size_t bytes);  // cudaMalloc, zeroed; nullptr when it does not fit
void memory_free(void* base);
void memory_copy_in(void* device, const void* host, size_t bytes);
void memory_copy_out(void* host, const void* device, size_t bytes);
void memory_fill(void* device, uint8_t byte, size_t bytes);
bool memory_is_device(const void* pointer);  // cudaPointerGetAttributes: device (or managed) memory
int device_count();                          // cudaGetDeviceCount; 0 without a driver

// The device's free and total memory now (cudaMemGetInfo), for the plan check and the peak report.
void memory_info(size_t* free_bytes, size_t* total_bytes);

}  // namespace meshtrain::kernels::cuda

#define MT_CUDA(call) ::meshtrain::kernels::cuda::check((call), #call, __FILE__, __LINE__)
// After a kernel launch: an invalid configuration or a missing kernel image is named with the kernel.
#define MT_CUDA_LAUNCHED(kernel) \
  ::meshtrain::kernels::cuda::check(cudaGetLastError(), kernel, __FILE__, __LINE__)
