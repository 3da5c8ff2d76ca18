#include "meshtrain/core/arena.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "meshtrain/core/error.h"

namespace meshtrain {

Arena::Arena(size_t bytes) : bytes_(align_up(bytes == 0 ? kArenaAlignment : bytes)) {
  void* memory = std::aligned_alloc(kArenaAlignment, bytes_);
  if (memory == nullptr) {
    fail("arena", std::to_string(bytes_) + " bytes of host memory", "the allocation failed",
         "reduce per_device_batch_size or max_target_length, or use a smaller model");
  }
  std::memset(memory, 0, bytes_);
  base_.reset(static_cast<std::byte*>(memory));
}

void Arena::Free::operator()(std::byte* pointer) const {
  std::free(pointer);
}

}  // namespace meshtrain
