// What the one-block-per-row norm kernels (rmsnorm.cu, layernorm.cu) share: the block sizes, a row sum in a
// fixed order, and the layout of their deterministic parameter-gradient column sums. Device code only.
#pragma once

#include <algorithm>
#include <cstdint>

namespace meshtrain::kernels::cuda {
namespace {

// Threads of the one-block-per-row kernels (a multiple of 32, at most 1024). Fixed, so every row sum runs
// the same tree on every call: forward and dx are bitwise reproducible.
constexpr int kRowThreads = 256;
// Rows one launch covers at once (a block-stride loop covers the rest; far above any real N).
constexpr int64_t kMaxRowBlocks = 1 << 20;
// The parameter-gradient column sums (dw, db): a block of kColumns columns (one per threadIdx.x, so each
// row's read is one coalesced 128-byte segment) by kRowLanes lanes; lane k sums rows k, k + kRowLanes, ...
// in order, then lane 0 adds the kRowLanes partials in lane order. A fixed partition and order: the sums are
// bitwise reproducible without float atomics or scratch.
constexpr int kColumns = 32;
constexpr int kRowLanes = 32;
constexpr int kColumnThreads = kColumns * kRowLanes;  // one column-sum block
static_assert(kColumnThreads <= 1024, "a column-sum block fits the block size limit");

// The sum of every thread's `value` over the block (blockDim.x a multiple of 32, at most 1024), returned to
// every thread. A fixed tree: within each warp by shuffles, then the warps' sums by warp 0. shared: [32],
// free for reuse when this returns. Every thread of the block must call it (it synchronises).
__device__ float block_sum(float value, float* shared) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < warps ? shared[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
    if (lane == 0) shared[0] = value;
  }
  __syncthreads();
  const float result = shared[0];
  __syncthreads();  // every thread has read shared[0] before the next call writes it
  return result;
}

// 1 / sqrt(sum_squares / D + eps), each step correctly rounded as the cpu's /, + and std::sqrt: the rstd
// both norms save.
__device__ float inverse_root_mean(float sum_squares, int64_t D, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_squares, static_cast<float>(D)), eps)));
}

unsigned row_blocks(int64_t N) {
  return static_cast<unsigned>(std::min(N, kMaxRowBlocks));
}

}  // namespace
}  // namespace meshtrain::kernels::cuda
