// What the float32 (attention.cu) and the bf16 tensor-core (attention_bf16.cu) attention kernels share: the
// tile skip test from positions and segment ids, rowsum(dout * out) of the backward, the shape checks and
// the shared-memory opt-in.
// Legend and masking as attention.cu's. Each .cu file gets its own copy (anonymous namespace).
#pragma once

#include <climits>
#include <cstdint>
#include <string>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cuda/device.h"

namespace meshtrain::kernels::cuda {
namespace {

constexpr int kMaxAttentionWidth = 256;  // largest d
constexpr int kRowDotThreads = 256;

// Bounds of the positions and segment ids of one tile's tokens (segments 0 when there are none).
struct Bounds {
  int min_position, max_position, min_segment, max_segment;
};

// Bounds over rows [begin, begin + count) of one sequence, read from global memory and reduced within each
// warp: every warp computes the same value, so a decision taken from it is uniform over the block.
__device__ Bounds tile_bounds(const int32_t* __restrict__ positions,  // [S] of this sequence
                              const int32_t* __restrict__ segments,   // [S] of this sequence, or nullptr
                              int begin, int count) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  Bounds bounds{INT_MAX, INT_MIN, INT_MAX, INT_MIN};
  for (int row = lane; row < count; row += 32) {
    const int position = positions[begin + row];
    bounds.min_position = min(bounds.min_position, position);
    bounds.max_position = max(bounds.max_position, position);
    const int segment = segments == nullptr ? 0 : segments[begin + row];
    bounds.min_segment = min(bounds.min_segment, segment);
    bounds.max_segment = max(bounds.max_segment, segment);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    bounds.min_position = min(bounds.min_position, __shfl_xor_sync(0xffffffffu, bounds.min_position, offset));
    bounds.max_position = max(bounds.max_position, __shfl_xor_sync(0xffffffffu, bounds.max_position, offset));
    bounds.min_segment = min(bounds.min_segment, __shfl_xor_sync(0xffffffffu, bounds.min_segment, offset));
    bounds.max_segment = max(bounds.max_segment, __shfl_xor_sync(0xffffffffu, bounds.max_segment, offset));
  }
  return bounds;
}

// True when no query of the first tile can see any key of the second: every key is later than every query,
// or the segment ranges do not meet.
__device__ bool fully_masked(const Bounds& queries, const Bounds& keys) {
  return queries.max_position < keys.min_position || queries.max_segment < keys.min_segment ||
         keys.max_segment < queries.min_segment;
}

// row_dot [B, H, S] = sum over the head width of dout * out: one warp per (b, i, h) row.
__global__ void __launch_bounds__(kRowDotThreads)
    row_dot_kernel(float* __restrict__ row_dot,     // [B, H, S]
                   const float* __restrict__ dout,  // [B, S, H, d]
                   const float* __restrict__ out,   // [B, S, H, d]
                   int64_t rows, int S, int H, int d) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * (kRowDotThreads / 32) + threadIdx.x / 32;  // (b, i, h)
  if (row >= rows) return;  // whole warps leave together
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const float* dout_row = dout + row * d;
  const float* out_row = out + row * d;
  float total = 0.0f;
  for (int x = lane; x < d; x += 32) total = fmaf(dout_row[x], out_row[x], total);
  for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
  if (lane == 0) {
    const int64_t h = row % H, bi = row / H, i = bi % S, b = bi / S;
    row_dot[(b * H + h) * S + i] = total;
  }
}

// Opts a kernel into `bytes` of dynamic shared memory (above the 48 KB default); once per instantiation.
template <class Kernel>
void allow_shared_memory(Kernel kernel, size_t bytes) {
  MT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// row_dot [B, H, S] = rowsum(dout * out), the D_i of the softmax backward, from dout, out [B, S, H, d].
void row_dot_launch(float* row_dot, const float* dout, const float* out, int64_t B, int64_t S, int64_t H,
                    int64_t d) {
  const int64_t rows = B * S * H;
  row_dot_kernel<<<blocks_for(rows, kRowDotThreads / 32), kRowDotThreads, 0, stream()>>>(
      row_dot, dout, out, rows, static_cast<int>(S), static_cast<int>(H), static_cast<int>(d));
  MT_CUDA_LAUNCHED("attention_backward (row dot)");
}

void check_shape(int64_t B, int64_t S, int64_t H, int64_t K, int64_t d) {
  MT_CHECK(K > 0 && H % K == 0, "query heads must be a multiple of kv heads");
  MT_CHECK(d >= 1 && d <= kMaxAttentionWidth, "the CUDA attention kernels take head widths 1.." +
                                                  std::to_string(kMaxAttentionWidth) + ", not " +
                                                  std::to_string(d));
  MT_CHECK(B <= 65535 && H <= 65535, "batch and heads index grid dimensions (at most 65535)");
  MT_CHECK(S <= INT_MAX / 2, "sequence length fits an int");
}

}  // namespace
}  // namespace meshtrain::kernels::cuda
