#include "meshtrain/core/arena.h"

#include "meshtrain/core/error.h"

namespace meshtrain {

Arena::Arena(size_t bytes, const ArenaMemory& memory)
    : base_(nullptr, Free{memory.release}), bytes_(align_up(bytes == 0 ? kArenaAlignment : bytes)) {
  MT_CHECK(memory.allocate != nullptr && memory.release != nullptr, "an arena without an allocator");
  void* pointer = memory.allocate(bytes_);
  if (pointer == nullptr) {
    fail("arena", std::to_string(bytes_) + " bytes of " + memory.where, "the allocation failed",
         "reduce per_device_batch_size or max_target_length, or use a smaller model");
  }
  base_.reset(static_cast<std::byte*>(pointer));
}

void Arena::Free::operator()(std::byte* pointer) const {
  release(pointer);
}

}  // namespace meshtrain
