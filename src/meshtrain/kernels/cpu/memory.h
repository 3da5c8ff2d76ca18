// Host memory for the cpu backend's arena: the memory entries of the kernel table (kernels/backend.h). The
// arena is ordinary host memory, so the engine and ops also read and write it in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "meshtrain/kernels/backend.h"

namespace meshtrain::kernels {

std::string host_device_check();           // "": the cpu kernels run everywhere
std::string host_device_description();     // "host memory"
DeviceResources host_device_resources();   // nothing to check: free_bytes 0, bf16 (the engine checks the CPU)
bool host_memory_on_host();                // true
void* host_memory_allocate(size_t bytes);  // zeroed, 64-byte aligned; nullptr when the allocation fails
void host_memory_free(void* base);
void host_memory_copy_in(void* device, const void* host, size_t bytes);
void host_memory_copy_out(void* host, const void* device, size_t bytes);
void host_memory_fill(void* device, uint8_t byte, size_t bytes);
bool host_memory_is_device(const void* pointer);  // false: all of it is host memory
int host_device_count();                          // 0: no GPU
void host_device_synchronize();                   // nothing to wait for: the cpu kernels return when done

}  // namespace meshtrain::kernels
