// Engram's table rows on the GPU (engram_table.h; semantics of kernels/cpu/engram_table.h): rows[n, i] =
// ids[n, i] + head_offsets[i].
// Legend: N tokens, H_e heads; ids, rows [N, H_e]; head_offsets [H_e] (host memory).
#include <algorithm>
#include <cstdint>

#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/engram_table.h"

namespace meshtrain::kernels::cuda {
namespace {

// The offsets travel as a kernel argument (no device copy, nothing to free), kHeadsPerLaunch heads at a
// time: a layer with more heads takes one launch per group.
constexpr int64_t kHeadsPerLaunch = 64;
struct HeadOffsets {
  int32_t value[kHeadsPerLaunch];
};

// Flat over the N x `count` ids of heads [first, first + count): rows = ids + that head's offset.
__global__ void rows_kernel(int32_t* rows, const int32_t* ids, HeadOffsets offsets, int64_t N, int64_t heads,
                            int64_t first, int64_t count) {
  const int64_t total = N * count;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t n = i / count, head = i - n * count;
    const int64_t at = n * heads + first + head;
    rows[at] = ids[at] + offsets.value[head];
  }
}

}  // namespace

void engram_table_rows(int32_t* rows, const int32_t* ids, const int32_t* head_offsets, int64_t N,
                       int64_t heads) {
  for (int64_t first = 0; first < heads && N > 0; first += kHeadsPerLaunch) {
    const int64_t count = std::min(kHeadsPerLaunch, heads - first);
    HeadOffsets offsets{};
    std::copy(head_offsets + first, head_offsets + first + count, offsets.value);
    rows_kernel<<<elementwise_blocks(N * count), kElementwiseThreads, 0, stream()>>>(rows, ids, offsets, N,
                                                                                     heads, first, count);
    MT_CUDA_LAUNCHED("engram_table rows_kernel");
  }
}

}  // namespace meshtrain::kernels::cuda
