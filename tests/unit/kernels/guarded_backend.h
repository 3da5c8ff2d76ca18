// A device arena, simulated, for tests of what a GPU run does with its memory: the cpu table over an arena
// the host cannot touch (PROT_NONE) except inside a kernel entry or a memory copy of the table
// (tests/unit/kernels/test_backend.cpp, tests/mpi/test_staged_communicator.cpp). The dense decoders' entries
// are guarded (what the cuda backend runs).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/backend.h"
#include "meshtrain/kernels/cpu/backend.h"

namespace meshtrain::testing {

using kernels::KernelBackend;

// A device arena, simulated: the cpu kernels over memory the host cannot touch (PROT_NONE) except inside
// a kernel entry or a memory copy of the table. Any other host access (the engine or an op reading or
// writing arena memory directly) is a segmentation fault here, as it is on a GPU.
struct GuardedArena {
  void* base = nullptr;
  size_t bytes = 0;
};
inline GuardedArena& guarded_arena() {
  static GuardedArena arena;
  return arena;
}
// Opens the arena to the host for the scope of one table entry. Scopes nest (a collective an entry calls
// copies through the table too): the arena closes when the outermost ends.
class ArenaOpen {
 public:
  ArenaOpen() {
    if (depth()++ == 0) protect(PROT_READ | PROT_WRITE);
  }
  ~ArenaOpen() {
    if (--depth() == 0) protect(PROT_NONE);
  }
  ArenaOpen(const ArenaOpen&) = delete;
  ArenaOpen& operator=(const ArenaOpen&) = delete;

 private:
  static int& depth() {
    static int open_scopes = 0;
    return open_scopes;
  }
  static void protect(int mode) {
    if (guarded_arena().base != nullptr) ::mprotect(guarded_arena().base, guarded_arena().bytes, mode);
  }
};

inline const KernelBackend& guarded_backend() {
  static const KernelBackend table = [] {
    KernelBackend guarded = kernels::cpu_backend();
    guarded.name = "guarded";
    guarded.memory_on_host = [] { return false; };
    guarded.memory_is_device = [](const void* pointer) {
      const auto* byte = static_cast<const uint8_t*>(pointer);
      const auto* base = static_cast<const uint8_t*>(guarded_arena().base);
      return base != nullptr && byte >= base && byte < base + guarded_arena().bytes;
    };
    guarded.memory_allocate = [](size_t bytes) -> void* {
      MT_CHECK(guarded_arena().base == nullptr, "one guarded arena at a time");
      const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
      const size_t rounded = (bytes + page - 1) / page * page;
      void* base = ::mmap(nullptr, rounded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);  // zeroed
      if (base == MAP_FAILED) return nullptr;
      guarded_arena() = {base, rounded};
      return base;
    };
    guarded.memory_free = [](void* base) {
      ::munmap(base, guarded_arena().bytes);
      guarded_arena() = {};
    };
#define MT_GUARDED(entry)                              \
  guarded.entry = [](auto... arguments) {              \
    const ArenaOpen open;                              \
    return kernels::cpu_backend().entry(arguments...); \
  }
    MT_GUARDED(memory_copy_in);
    MT_GUARDED(memory_copy_out);
    MT_GUARDED(memory_fill);
    MT_GUARDED(matmul_forward);
    MT_GUARDED(matmul_backward);
    MT_GUARDED(residual_add);
    MT_GUARDED(embedding_forward);
    MT_GUARDED(embedding_backward);
    MT_GUARDED(unembed_cross_entropy);
    MT_GUARDED(unembed_logits);
    MT_GUARDED(rmsnorm_forward);
    MT_GUARDED(rmsnorm_backward);
    MT_GUARDED(layernorm_forward);
    MT_GUARDED(layernorm_backward);
    MT_GUARDED(swiglu_forward);
    MT_GUARDED(swiglu_backward);
    MT_GUARDED(gelu_forward);
    MT_GUARDED(gelu_backward);
    MT_GUARDED(rope_forward);
    MT_GUARDED(rope_backward);
    MT_GUARDED(column_slice_forward);
    MT_GUARDED(column_slice_backward);
    MT_GUARDED(attention_forward);
    MT_GUARDED(attention_backward);
    MT_GUARDED(adamw_update);
    MT_GUARDED(sum_of_squares);
#undef MT_GUARDED
    return guarded;
  }();
  return table;
}

}  // namespace meshtrain::testing
