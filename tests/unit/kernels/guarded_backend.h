// A device arena, simulated, for tests of what a GPU run does with its memory: the cpu table over an arena
// the host cannot touch (PROT_NONE) except inside a kernel entry or a memory copy of the table
// (tests/unit/kernels/test_backend.cpp, tests/mpi/test_staged_communicator.cpp). The entries the cuda
// backend runs are guarded (the lists below).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/backend.h"
#include "meshtrain/kernels/cpu/backend.h"

namespace meshtrain::testing {

// The entries a dense decoder (Qwen3, GPT-2) trains, evaluates and checkpoints through, in float32 and
// bfloat16 (the _bf16 producers and _bf16_x matmuls, the attention of attention_kernels): what the cuda
// table must fill (test_backend.cpp's CudaTableCoversTheDenseDecoders) and all the guarded backend lets touch
// its arena (DenseTrainingTouchesADeviceArenaOnlyThroughTheTable), so the two lists cannot drift apart.
// clang-format off
#define MT_DENSE_DECODER_ENTRIES(X) \
  X(memory_copy_in) \
  X(memory_copy_out) \
  X(memory_fill) \
  X(matmul_forward) \
  X(matmul_forward_bf16_x) \
  X(matmul_backward) \
  X(matmul_backward_bf16_x) \
  X(residual_add) \
  X(embedding_forward) \
  X(embedding_backward) \
  X(unembed_cross_entropy) \
  X(unembed_logits) \
  X(rmsnorm_forward) \
  X(rmsnorm_forward_bf16) \
  X(rmsnorm_backward) \
  X(layernorm_forward) \
  X(layernorm_forward_bf16) \
  X(layernorm_backward) \
  X(swiglu_forward) \
  X(swiglu_forward_bf16) \
  X(swiglu_backward) \
  X(gelu_forward) \
  X(gelu_forward_bf16) \
  X(gelu_backward) \
  X(rope_forward) \
  X(rope_backward) \
  X(column_slice_forward) \
  X(column_slice_backward) \
  X(attention_forward) \
  X(attention_backward) \
  X(attention_forward_bf16) \
  X(attention_backward_bf16) \
  X(adamw_update) \
  X(sum_of_squares)
// Engram's and mHC's entries (in float32; their producers write no bf16 matmul inputs): the cuda table fills
// them too, and the guarded backend lets them touch its arena.
#define MT_ENGRAM_MHC_ENTRIES(X) \
  X(rmsnorm_streams_forward) \
  X(rmsnorm_streams_backward) \
  X(engram_table_rows) \
  X(engram_gate_forward) \
  X(engram_gate_backward) \
  X(short_conv_forward) \
  X(short_conv_backward) \
  X(short_conv_output_forward) \
  X(short_conv_output_backward) \
  X(mhc_coefficients_forward) \
  X(mhc_coefficients_backward) \
  X(sinkhorn_forward) \
  X(sinkhorn_backward) \
  X(mhc_collapse_forward) \
  X(mhc_collapse_backward) \
  X(mhc_expand_forward) \
  X(mhc_expand_backward) \
  X(mhc_streams_repeat) \
  X(mhc_streams_sum)
// The mixture of experts' entries on one device (expert parallelism's block plans are not among them): the
// cuda table fills them (the routing plan as the cpu kernel on host copies), and the guarded backend lets
// them touch its arena.
#define MT_MOE_ENTRIES(X) \
  X(moe_router_forward) \
  X(moe_router_backward) \
  X(moe_balance_loss_forward) \
  X(moe_balance_loss_backward) \
  X(moe_route_plan) \
  X(moe_gather_forward) \
  X(moe_gather_backward) \
  X(moe_combine_forward) \
  X(moe_combine_backward) \
  X(grouped_matmul_forward) \
  X(grouped_matmul_backward)
// clang-format on

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
  };
    MT_DENSE_DECODER_ENTRIES(MT_GUARDED)
    MT_ENGRAM_MHC_ENTRIES(MT_GUARDED)
    MT_MOE_ENTRIES(MT_GUARDED)
#undef MT_GUARDED
    return guarded;
  }();
  return table;
}

}  // namespace meshtrain::testing
