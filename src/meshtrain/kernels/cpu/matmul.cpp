#include "meshtrain/kernels/cpu/matmul.h"

#include <algorithm>
#include <cstring>

#include "meshtrain/kernels/cpu/gemm.h"

namespace meshtrain::kernels {
namespace {

// Columns per OpenMP task in the bias reduction: each column is summed by one thread in token order.
constexpr int64_t kColumnBlock = 32;

// out = bias in every row (or 0 when there is no product to add to it); false when nothing is left to do.
bool start_output(float* out, const float* bias, int64_t N, int64_t I, int64_t O) {
  if (N == 0 || O == 0) return false;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * O, bias, static_cast<size_t>(O) * sizeof(float));
  } else if (I == 0) {
    std::fill(out, out + N * O, 0.0f);
  }
  return I > 0;
}

// dbias += column sums of dout, each column summed by one thread in token order.
void bias_gradient(float* dbias, const float* dout, int64_t N, int64_t O) {
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

// The bf16 backward once x is in bfloat16 (rounded here or by its producer): dout and w rounded into
// scratch [N, O] + [I, O].
void backward_bf16(float* dx, float* dw, const float* dout, const uint16_t* x_bf16, const float* w, int64_t N,
                   int64_t I, int64_t O, bool accumulate_dx, uint16_t* scratch) {
  uint16_t* dout_bf16 = scratch;       // [N, O]
  uint16_t* w_bf16 = scratch + N * O;  // [I, O] elements, in the GEMM's layout
  round_to_bfloat16(dout, N, O, O, dout_bf16);
  if (dx != nullptr)
    gemm_bf16_float32_b(false, true, N, I, O, dout_bf16, O, w, O, accumulate_dx, dx, I, w_bf16);
  if (dw != nullptr) gemm_bf16(true, false, I, O, N, x_bf16, I, dout_bf16, O, true, dw, O);
}

// What the backward does before any GEMM: the bias gradient, and dx when there is no product; false when
// nothing is left to do.
bool start_backward(float* dx, float* dbias, const float* dout, int64_t N, int64_t I, int64_t O,
                    bool accumulate_dx) {
  if (dbias != nullptr && O > 0) bias_gradient(dbias, dout, N, O);
  if (N == 0 || I == 0) return false;
  if (O == 0) {
    if (dx != nullptr && !accumulate_dx) std::fill(dx, dx + N * I, 0.0f);
    return false;
  }
  return true;
}

}  // namespace

int64_t matmul_bf16_scratch_elements(int64_t N, int64_t I, int64_t O, bool x_is_bf16) {
  return (x_is_bf16 ? 0 : N * I) + I * O + N * O;
}

void matmul_forward(float* out, const float* x, const float* w, const float* bias, int64_t N, int64_t I,
                    int64_t O, uint16_t* bf16_inputs) {
  if (!start_output(out, bias, N, I, O)) return;
  if (bf16_inputs != nullptr) {
    uint16_t* x_bf16 = bf16_inputs;  // [N, I], then what matmul_forward_bf16_x rounds
    round_to_bfloat16(x, N, I, I, x_bf16);
    matmul_forward_bf16_x(out, x_bf16, w, bias, N, I, O, bf16_inputs + N * I);
    return;
  }
  gemm(false, false, N, O, I, x, I, w, O, bias != nullptr, out, O);
}

void matmul_forward_bf16_x(float* out, const uint16_t* x, const float* w, const float* bias, int64_t N,
                           int64_t I, int64_t O, uint16_t* bf16_inputs) {
  if (N == 0 || O == 0) return;
  uint16_t* w_bf16 = bf16_inputs;  // [I, O] elements, in the GEMM's layout
  // The bias goes into the product's epilogue (not copied into out first and read back by it).
  gemm_bf16_float32_b(false, false, N, O, I, x, I, w, O, false, out, O, w_bf16, bias);
}

void matmul_backward(float* dx, float* dw, float* dbias, const float* dout, const float* x, const float* w,
                     int64_t N, int64_t I, int64_t O, bool accumulate_dx, uint16_t* bf16_inputs) {
  if (!start_backward(dx, dbias, dout, N, I, O, accumulate_dx)) return;
  if (bf16_inputs != nullptr) {
    uint16_t* x_bf16 = bf16_inputs + N * O + I * O;  // [N, I], after backward_bf16's scratch
    if (dw != nullptr) round_to_bfloat16(x, N, I, I, x_bf16);
    backward_bf16(dx, dw, dout, x_bf16, w, N, I, O, accumulate_dx, bf16_inputs);
    return;
  }
  if (dx != nullptr) {
    gemm(false, true, N, I, O, dout, O, w, O, accumulate_dx, dx, I);
  }
  if (dw != nullptr) {
    gemm(true, false, I, O, N, x, I, dout, O, true, dw, O);
  }
}

void matmul_backward_bf16_x(float* dx, float* dw, float* dbias, const float* dout, const uint16_t* x,
                            const float* w, int64_t N, int64_t I, int64_t O, bool accumulate_dx,
                            uint16_t* bf16_inputs) {
  if (!start_backward(dx, dbias, dout, N, I, O, accumulate_dx)) return;
  backward_bf16(dx, dw, dout, x, w, N, I, O, accumulate_dx, bf16_inputs);
}

}  // namespace meshtrain::kernels
