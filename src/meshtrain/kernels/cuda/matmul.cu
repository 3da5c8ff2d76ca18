// Dense matmul on the GPU (matmul.h; semantics of kernels/cpu/matmul.h): out = x @ w + bias and its
// backward, GEMMs through gemm.h (cuBLASLt), the bias broadcast and the bias gradient's column sums here.
// Legend: N tokens, I input width, O output width.
#include <cstdint>

#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/gemm.h"
#include "meshtrain/kernels/cuda/matmul.h"

namespace meshtrain::kernels::cuda {
namespace {

// Column sums: a block of kSumColumns x kSumRowGroups threads owns kSumColumns adjacent columns (a warp reads
// 32 consecutive floats of a row). Thread (column, group) sums rows group, group + kSumRowGroups, ... in
// order; then group 0 adds the kSumRowGroups partial sums in group order. Every sum has one fixed order,
// so dbias is bitwise reproducible (no atomics).
constexpr int kSumColumns = 32;
constexpr int kSumRowGroups = 32;

// out[n, :] = bias, every row.
__global__ void broadcast_bias_kernel(float* out,         // [N, O]
                                      const float* bias,  // [O]
                                      int64_t N, int64_t O) {
  const int64_t count = N * O;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    out[i] = bias[i % O];
  }
}

// dbias[o] += sum over n of dout[n, o], in the fixed order described at kSumColumns.
__global__ void column_sums_kernel(float* dbias,       // [O]
                                   const float* dout,  // [N, O]
                                   int64_t N, int64_t O) {
  __shared__ float partial[kSumRowGroups][kSumColumns];
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kSumColumns + threadIdx.x;
  const int group = static_cast<int>(threadIdx.y);
  float sum = 0.0f;
  if (column < O) {
    for (int64_t n = group; n < N; n += kSumRowGroups) sum += dout[n * O + column];
  }
  partial[group][threadIdx.x] = sum;
  __syncthreads();
  if (group == 0 && column < O) {
    float total = 0.0f;
    for (int g = 0; g < kSumRowGroups; ++g) total += partial[g][threadIdx.x];
    dbias[column] += total;
  }
}

void broadcast_bias(float* out,         // [N, O]
                    const float* bias,  // [O]
                    int64_t N, int64_t O) {
  broadcast_bias_kernel<<<elementwise_blocks(N * O), kElementwiseThreads, 0, stream()>>>(out, bias, N, O);
  MT_CUDA_LAUNCHED("matmul broadcast_bias_kernel");
}

void add_column_sums(float* dbias,       // [O]
                     const float* dout,  // [N, O]
                     int64_t N, int64_t O) {
  const dim3 threads(kSumColumns, kSumRowGroups);
  column_sums_kernel<<<blocks_for(O, kSumColumns), threads, 0, stream()>>>(dbias, dout, N, O);
  MT_CUDA_LAUNCHED("matmul column_sums_kernel");
}

// The bf16 backward once x is in bfloat16 (rounded by matmul_backward or by its producer): dout and w
// rounded into scratch [N, O] + [I, O], the cpu kernel's split (kernels/cpu/matmul.cpp).
void backward_bf16(float* dx, float* dw, const float* dout, const uint16_t* x_bf16, const float* w, int64_t N,
                   int64_t I, int64_t O, bool accumulate_dx, uint16_t* scratch) {
  uint16_t* dout_bf16 = scratch;       // [N, O]
  uint16_t* w_bf16 = scratch + N * O;  // [I, O]
  round_to_bf16(dout_bf16, dout, N * O);
  if (dx != nullptr) {  // dx [N, I] = dout [N, O] @ w^T ([I, O] stored)
    round_to_bf16(w_bf16, w, I * O);
    gemm_bf16(dx, dout_bf16, w_bf16, N, I, O, false, true, accumulate_dx);
  }
  if (dw != nullptr) {  // dw [I, O] += x^T ([N, I] stored) @ dout [N, O]
    gemm_bf16(dw, x_bf16, dout_bf16, I, O, N, true, false, true);
  }
}

// What the forward does before any GEMM: out = bias in every row (or 0 when there is no product to add to
// it); false when nothing is left to do.
bool start_output(float* out, const float* bias, int64_t N, int64_t I, int64_t O) {
  if (N == 0 || O == 0) return false;
  if (bias != nullptr) {
    broadcast_bias(out, bias, N, O);  // then the GEMM accumulates onto it
  } else if (I == 0) {
    MT_CUDA(cudaMemsetAsync(out, 0, static_cast<size_t>(N * O) * sizeof(float), stream()));
  }
  return I > 0;
}

// What the backward does before any GEMM: the bias gradient, and dx when there is no product; false when
// nothing is left to do.
bool start_backward(float* dx, float* dw, float* dbias, const float* dout, int64_t N, int64_t I, int64_t O,
                    bool accumulate_dx) {
  if (dbias != nullptr && O > 0 && N > 0) add_column_sums(dbias, dout, N, O);  // N == 0: adds nothing
  if (N == 0 || I == 0) return false;
  if (O == 0) {  // an empty sum: dx = 0 (or unchanged), dw += 0
    if (dx != nullptr && !accumulate_dx) {
      MT_CUDA(cudaMemsetAsync(dx, 0, static_cast<size_t>(N * I) * sizeof(float), stream()));
    }
    return false;
  }
  return dx != nullptr || dw != nullptr;
}

}  // namespace

void matmul_forward(float* out, const float* x, const float* w, const float* bias, int64_t N, int64_t I,
                    int64_t O, uint16_t* bf16_inputs) {
  if (bf16_inputs != nullptr) {
    // The cpu kernel's split of the scratch (kernels/cpu/matmul.cpp): x [N, I], then what _bf16_x rounds.
    uint16_t* x_bf16 = bf16_inputs;
    round_to_bf16(x_bf16, x, N * I);
    matmul_forward_bf16_x(out, x_bf16, w, bias, N, I, O, bf16_inputs + N * I);
    return;
  }
  if (!start_output(out, bias, N, I, O)) return;
  gemm_f32(out, x, w, N, O, I, false, false, bias != nullptr);
}

void matmul_forward_bf16_x(float* out, const uint16_t* x, const float* w, const float* bias, int64_t N,
                           int64_t I, int64_t O, uint16_t* bf16_inputs) {
  if (!start_output(out, bias, N, I, O)) return;
  uint16_t* w_bf16 = bf16_inputs;  // [I, O]
  round_to_bf16(w_bf16, w, I * O);
  gemm_bf16(out, x, w_bf16, N, O, I, false, false, bias != nullptr);
}

void matmul_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x, const float* w,
                     int64_t N, int64_t I, int64_t O, bool accumulate_dx, uint16_t* bf16_inputs) {
  if (!start_backward(dx, dw, dbias, dout, N, I, O, accumulate_dx)) return;
  if (bf16_inputs != nullptr) {
    uint16_t* x_bf16 = bf16_inputs + N * O + I * O;  // [N, I], after backward_bf16's scratch
    if (dw != nullptr) round_to_bf16(x_bf16, x, N * I);
    backward_bf16(dx, dw, dout, x_bf16, w, N, I, O, accumulate_dx, bf16_inputs);
    return;
  }
  if (dx != nullptr) gemm_f32(dx, dout, w, N, I, O, false, true, accumulate_dx);
  if (dw != nullptr) gemm_f32(dw, x, dout, I, O, N, true, false, true);
}

void matmul_backward_bf16_x(float* dx, float* dw, float* dbias, const float* dout, const uint16_t* x,
                            const float* w, int64_t N, int64_t I, int64_t O, bool accumulate_dx,
                            uint16_t* bf16_inputs) {
  if (!start_backward(dx, dw, dbias, dout, N, I, O, accumulate_dx)) return;
  backward_bf16(dx, dw, dout, x, w, N, I, O, accumulate_dx, bf16_inputs);
}

}  // namespace meshtrain::kernels::cuda
