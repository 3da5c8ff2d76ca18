// Dispatch and combine on the GPU (moe_dispatch.h; semantics of kernels/cpu/moe_dispatch.h). Every output
// element has one thread that writes it (no atomics): the gather by sorted row, the gather's backward and the
// combine by token (a token's kept slots summed in slot order, as the cpu kernel), the combine's backward by
// assignment (each kept assignment owns its sorted row; its weight gradient is one warp's dot product in a
// fixed tree).
// Legend: N tokens, D width, k experts per token, M = N k assignments, R kept (sorted) rows.
#include <cstdint>

#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/moe_dispatch.h"

namespace meshtrain::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

// sorted_x row i = x row sorted[i] / k; zeros where sorted[i] < 0.
__global__ void gather_forward_kernel(float* sorted_x,        // [R, D]
                                      const float* x,         // [N, D]
                                      const int32_t* sorted,  // [M]
                                      int64_t R, int64_t k, int64_t D) {
  const int64_t count = R * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t row = i / D, c = i - row * D;
    const int32_t assignment = sorted[row];
    sorted_x[i] = assignment < 0 ? 0.0f : x[(assignment / k) * D + c];
  }
}

// out row t = (or +=) the sum over token t's kept slots s, in slot order, of weight[t, s] * rows row
// position[t k + s], weight 1 where weights is nullptr: the combine, and the gather's transpose.
__global__ void sum_token_slots_kernel(float* out,               // [N, D]
                                       const float* rows,        // [R, D]
                                       const float* weights,     // [N, k] or nullptr
                                       const int32_t* position,  // [M]
                                       int64_t N, int64_t k, int64_t D, bool accumulate) {
  const int64_t count = N * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t t = i / D, c = i - t * D;
    float sum = accumulate ? out[i] : 0.0f;
    for (int64_t s = 0; s < k; ++s) {
      const int32_t row = position[t * k + s];
      if (row < 0) continue;
      const float weight = weights == nullptr ? 1.0f : weights[t * k + s];
      sum += weight * rows[row * D + c];
    }
    out[i] = sum;
  }
}

// d_y_sorted row position[a] = weights[a] d_out row a / k, for every kept assignment a.
__global__ void combine_backward_rows_kernel(float* d_y_sorted,        // [R, D]
                                             const float* d_out,       // [N, D]
                                             const float* weights,     // [N, k]
                                             const int32_t* position,  // [M]
                                             int64_t M, int64_t k, int64_t D) {
  const int64_t count = M * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t a = i / D, c = i - a * D;
    const int32_t row = position[a];
    if (row >= 0) d_y_sorted[row * D + c] = weights[a] * d_out[(a / k) * D + c];
  }
}

// d_weights[a] = d_out row a / k . y_sorted row position[a] (0 when dropped): one warp per assignment, lane
// j summing columns j, j + 32, ... in order, then a fixed shuffle tree.
__global__ void combine_backward_weights_kernel(float* d_weights,         // [N, k]
                                                const float* d_out,       // [N, D]
                                                const float* y_sorted,    // [R, D]
                                                const int32_t* position,  // [M]
                                                int64_t M, int64_t k, int64_t D) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  for (int64_t a = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; a < M;
       a += warps) {
    const int32_t row = position[a];  // the same for the whole warp
    float dot = 0.0f;
    if (row >= 0) {
      const float* gradient = d_out + (a / k) * D;
      const float* y = y_sorted + static_cast<int64_t>(row) * D;
      for (int64_t c = lane; c < D; c += kWarp) dot += gradient[c] * y[c];
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) dot += __shfl_down_sync(0xffffffffu, dot, offset);
    if (lane == 0) d_weights[a] = dot;
  }
}

void sum_token_slots(float* out, const float* rows, const float* weights, const int32_t* position, int64_t N,
                     int64_t k, int64_t D, bool accumulate, const char* what) {
  if (N <= 0 || D <= 0) return;
  sum_token_slots_kernel<<<elementwise_blocks(N * D), kElementwiseThreads, 0, stream()>>>(
      out, rows, weights, position, N, k, D, accumulate);
  MT_CUDA_LAUNCHED(what);
}

}  // namespace

void moe_gather_forward(float* sorted_x, const float* x, const int32_t* sorted, int64_t R, int64_t k,
                        int64_t D) {
  if (R <= 0 || D <= 0) return;
  gather_forward_kernel<<<elementwise_blocks(R * D), kElementwiseThreads, 0, stream()>>>(sorted_x, x, sorted,
                                                                                         R, k, D);
  MT_CUDA_LAUNCHED("moe_dispatch gather_forward_kernel");
}

void moe_gather_backward(float* d_x, const float* d_sorted_x, const int32_t* position, int64_t N, int64_t k,
                         int64_t D, bool accumulate) {
  sum_token_slots(d_x, d_sorted_x, nullptr, position, N, k, D, accumulate,
                  "moe_dispatch sum_token_slots_kernel (gather backward)");
}

void moe_combine_forward(float* out, const float* y_sorted, const float* weights, const int32_t* position,
                         int64_t N, int64_t k, int64_t D, bool accumulate) {
  sum_token_slots(out, y_sorted, weights, position, N, k, D, accumulate,
                  "moe_dispatch sum_token_slots_kernel (combine forward)");
}

void moe_combine_backward(float* d_y_sorted, float* d_weights, const float* d_out, const float* y_sorted,
                          const float* weights, const int32_t* position, int64_t N, int64_t k, int64_t D) {
  const int64_t M = N * k;
  if (M <= 0) return;
  if (D > 0) {
    combine_backward_rows_kernel<<<elementwise_blocks(M * D), kElementwiseThreads, 0, stream()>>>(
        d_y_sorted, d_out, weights, position, M, k, D);
    MT_CUDA_LAUNCHED("moe_dispatch combine_backward_rows_kernel");
  }
  const unsigned blocks =
      blocks_for(std::min<int64_t>(M, kElementwiseMaxBlocks * kWarpsPerBlock), kWarpsPerBlock);
  combine_backward_weights_kernel<<<blocks, kWarpsPerBlock * kWarp, 0, stream()>>>(d_weights, d_out, y_sorted,
                                                                                   position, M, k, D);
  MT_CUDA_LAUNCHED("moe_dispatch combine_backward_weights_kernel");
}

}  // namespace meshtrain::kernels::cuda
