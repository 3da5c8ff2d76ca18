#include "meshtrain/kernels/cpu/memory.h"

#include <cstdlib>
#include <cstring>

#include "meshtrain/core/arena.h"

namespace meshtrain::kernels {

std::string host_device_check() {
  return "";
}

std::string host_device_description() {
  return "host memory";
}

bool host_memory_on_host() {
  return true;
}

void* host_memory_allocate(size_t bytes) {
  void* memory = std::aligned_alloc(kArenaAlignment, align_up(bytes == 0 ? kArenaAlignment : bytes));
  if (memory != nullptr) std::memset(memory, 0, bytes);
  return memory;
}

void host_memory_free(void* base) {
  std::free(base);
}

void host_memory_copy_in(void* device, const void* host, size_t bytes) {
  if (bytes > 0) std::memcpy(device, host, bytes);
}

void host_memory_copy_out(void* host, const void* device, size_t bytes) {
  if (bytes > 0) std::memcpy(host, device, bytes);
}

void host_memory_fill(void* device, uint8_t byte, size_t bytes) {
  if (bytes > 0) std::memset(device, byte, bytes);
}

void host_device_synchronize() {}

}  // namespace meshtrain::kernels
