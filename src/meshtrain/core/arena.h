// One allocation for everything a run holds, sized before the first step. Buffers get offsets from the
// planner; nothing allocates inside layer code. The memory comes from the kernel backend's allocator: host
// memory (cpu), or a device's (the arena then holds device addresses the host must not touch).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace meshtrain {

inline constexpr size_t kArenaAlignment = 64;  // cache line; also AVX-512 vector width

inline size_t align_up(size_t bytes, size_t alignment = kArenaAlignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

// Where an arena's memory comes from.
struct ArenaMemory {
  // Aligned to kArenaAlignment and zeroed; nullptr when it does not fit.
  void* (*allocate)(size_t bytes) = nullptr;
  void (*release)(void* base) = nullptr;
  std::string where;  // the memory in words, for the error when the allocation fails
};

class Arena {
 public:
  Arena(size_t bytes, const ArenaMemory& memory);  // zero-initialised
  std::byte* at(size_t offset) const { return base_.get() + offset; }
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void (*release)(void*);
    void operator()(std::byte* pointer) const;
  };
  std::unique_ptr<std::byte, Free> base_;
  size_t bytes_;
};

}  // namespace meshtrain
