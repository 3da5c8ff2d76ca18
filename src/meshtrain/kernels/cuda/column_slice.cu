// Column slices on the GPU (column_slice.h; semantics of kernels/cpu/column_slice.h): W columns of each
// source row copied to `repeat` destination rows (or zeros), and the transpose summing those rows back in t
// order. Legend: R source rows, W columns copied, repeat destination rows per source row, t < repeat; a
// stride is a row's width in floats and every pointer points at the first copied column of its tensor's first
// row.
#include <algorithm>
#include <cstdint>

#include "meshtrain/kernels/cuda/column_slice.h"
#include "meshtrain/kernels/cuda/device.h"

namespace meshtrain::kernels::cuda {
namespace {

constexpr int64_t kThreads = 256;
// Launch bounds (grid strides cover the rest): source rows over y, column blocks over x.
constexpr int64_t kMaxRowBlocks = int64_t{1} << 14;  // <= 65535, the limit of gridDim.y
constexpr int64_t kMaxColumnBlocks = 1024;

// A block is columns (x, up to kThreads) by source rows (y, what remains of kThreads): packed warps even for
// narrow slices, and no division per element.
struct Launch {
  dim3 grid, block;
};

Launch launch_for(int64_t R, int64_t W) {
  const int64_t columns = std::min(W, kThreads);
  const int64_t rows = std::min(R, kThreads / columns);
  const int64_t column_blocks = std::min((W + columns - 1) / columns, kMaxColumnBlocks);
  const int64_t row_blocks = std::min((R + rows - 1) / rows, kMaxRowBlocks);
  return {dim3(static_cast<unsigned>(column_blocks), static_cast<unsigned>(row_blocks)),
          dim3(static_cast<unsigned>(columns), static_cast<unsigned>(rows))};
}

// out[(r repeat + t) out_stride + j] = x[r x_stride + j] (0 when x is null), for every t < repeat.
__global__ void forward_kernel(float* out,      // [R * repeat rows of out_stride], W columns written
                               const float* x,  // [R rows of x_stride], W columns read, or nullptr
                               int64_t R, int64_t W, int64_t repeat, int64_t out_stride, int64_t x_stride) {
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  const int64_t column_step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < R; r += row_step) {
    float* target = out + r * repeat * out_stride;
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < W; j += column_step) {
      const float value = x == nullptr ? 0.0f : x[r * x_stride + j];
      for (int64_t t = 0; t < repeat; ++t) target[t * out_stride + j] = value;
    }
  }
}

// dx[r dx_stride + j] = dout[(r repeat) dout_stride + j] + ... + dout[(r repeat + repeat - 1) dout_stride +
// j], added in t order from the first row (as the cpu kernel: bitwise equal); zeros when repeat is 0.
__global__ void backward_kernel(float* dx,          // [R rows of dx_stride], W columns written
                                const float* dout,  // [R * repeat rows of dout_stride], W columns read
                                int64_t R, int64_t W, int64_t repeat, int64_t dx_stride,
                                int64_t dout_stride) {
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  const int64_t column_step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < R; r += row_step) {
    const float* source = dout + r * repeat * dout_stride;
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < W; j += column_step) {
      float sum = repeat > 0 ? source[j] : 0.0f;
      for (int64_t t = 1; t < repeat; ++t) sum += source[t * dout_stride + j];
      dx[r * dx_stride + j] = sum;
    }
  }
}

}  // namespace

void column_slice_forward(float* out, const float* x, int64_t R, int64_t W, int64_t repeat,
                          int64_t out_stride, int64_t x_stride) {
  if (R <= 0 || W <= 0 || repeat <= 0) return;
  const Launch launch = launch_for(R, W);
  forward_kernel<<<launch.grid, launch.block, 0, stream()>>>(out, x, R, W, repeat, out_stride, x_stride);
  MT_CUDA_LAUNCHED("column_slice forward_kernel");
}

void column_slice_backward(float* dx, const float* dout, int64_t R, int64_t W, int64_t repeat,
                           int64_t dx_stride, int64_t dout_stride) {
  if (R <= 0 || W <= 0) return;
  const Launch launch = launch_for(R, W);
  backward_kernel<<<launch.grid, launch.block, 0, stream()>>>(dx, dout, R, W, repeat, dx_stride, dout_stride);
  MT_CUDA_LAUNCHED("column_slice backward_kernel");
}

}  // namespace meshtrain::kernels::cuda
