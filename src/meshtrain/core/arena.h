// One allocation for everything a run holds, sized before the first step. Buffers get offsets from the
// planner; nothing allocates inside layer code.
#pragma once

#include <cstddef>
#include <memory>

namespace meshtrain {

inline constexpr size_t kArenaAlignment = 64;  // cache line; also AVX-512 vector width

inline size_t align_up(size_t bytes, size_t alignment = kArenaAlignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

class Arena {
 public:
  explicit Arena(size_t bytes);  // zero-initialised
  std::byte* at(size_t offset) const { return base_.get() + offset; }
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(std::byte* pointer) const;
  };
  std::unique_ptr<std::byte, Free> base_;
  size_t bytes_;
};

}  // namespace meshtrain
