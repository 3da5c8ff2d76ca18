#include "meshtrain/kernels/cpu/matmul.h"

#include <algorithm>
#include <cstring>

#include "meshtrain/kernels/cpu/gemm.h"

namespace meshtrain::kernels {
namespace {

// Columns per OpenMP task in the bias reduction: each column is summed by one thread in token order.
constexpr int64_t kColumnBlock = 32;

}  // namespace

int64_t matmul_bf16_scratch_elements(int64_t N, int64_t I, int64_t O) {
  return N * I + I * O + N * O;
}

void matmul_forward(float* out, const float* x, const float* w, const float* bias, int64_t N, int64_t I,
                    int64_t O, uint16_t* bf16_inputs) {
  if (N == 0 || O == 0) return;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * O, bias, static_cast<size_t>(O) * sizeof(float));
  } else if (I == 0) {
    std::fill(out, out + N * O, 0.0f);
  }
  if (I == 0) return;
  if (bf16_inputs != nullptr) {
    uint16_t* x_bf16 = bf16_inputs;          // [N, I]
    uint16_t* w_bf16 = bf16_inputs + N * I;  // [I, O]
    round_to_bfloat16(x, N, I, I, x_bf16);
    round_to_bfloat16(w, I, O, O, w_bf16);
    gemm_bf16(false, false, N, O, I, x_bf16, I, w_bf16, O, bias != nullptr, out, O);
    return;
  }
  gemm(false, false, N, O, I, x, I, w, O, bias != nullptr, out, O);
}

void matmul_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x, const float* w,
                     int64_t N, int64_t I, int64_t O, bool accumulate_dx, uint16_t* bf16_inputs) {
  if (dbias != nullptr && O > 0) {
    const int64_t blocks = (O + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t begin = block * kColumnBlock;
      const int64_t width = std::min(kColumnBlock, O - begin);
      float sum[kColumnBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const float* row = dout + n * O + begin;
        for (int64_t j = 0; j < width; ++j) sum[j] += row[j];
      }
      for (int64_t j = 0; j < width; ++j) dbias[begin + j] += sum[j];
    }
  }
  if (N == 0 || I == 0) return;
  if (O == 0) {
    if (dx != nullptr && !accumulate_dx) std::fill(dx, dx + N * I, 0.0f);
    return;
  }
  if (bf16_inputs != nullptr) {
    uint16_t* dout_bf16 = bf16_inputs;               // [N, O]
    uint16_t* w_bf16 = bf16_inputs + N * O;          // [I, O]
    uint16_t* x_bf16 = bf16_inputs + N * O + I * O;  // [N, I]
    round_to_bfloat16(dout, N, O, O, dout_bf16);
    if (dx != nullptr) {
      round_to_bfloat16(w, I, O, O, w_bf16);
      gemm_bf16(false, true, N, I, O, dout_bf16, O, w_bf16, O, accumulate_dx, dx, I);
    }
    if (dw != nullptr) {
      round_to_bfloat16(x, N, I, I, x_bf16);
      gemm_bf16(true, false, I, O, N, x_bf16, I, dout_bf16, O, true, dw, O);
    }
    return;
  }
  if (dx != nullptr) {
    gemm(false, true, N, I, O, dout, O, w, O, accumulate_dx, dx, I);
  }
  if (dw != nullptr) {
    gemm(true, false, I, O, N, x, I, dout, O, true, dw, O);
  }
}

}  // namespace meshtrain::kernels
