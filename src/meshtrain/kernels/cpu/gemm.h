// The float32 GEMM that every matmul of the engine goes through (linear layers, the unembedding), and the
// backend behind it. Legend: C [M, N] = op(A) [M, K] @ op(B) [K, N], row-major, where op(X) is X as stored
// or, with transpose_x, X stored transposed ([K, M] for A, [N, K] for B); lda / ldb / ldc are row strides.
//
// Backend: oneDNN, loaded at run time (libdnnl.so.2). It picks its kernels from the CPU's features, so it
// runs its AVX-512 or AVX2 code on CPU models no table knows; OpenBLAS 0.3.21 picks by model and ran SSE3
// kernels on a new Xeon (measurements in bench/README.md). The engine checks oneDNN's choice against
// its own CPUID reading (core/cpu_features.h) and its result against the reference on a small product.
// Without oneDNN the matmuls run gemm_reference on all threads, with a warning saying so.
// MESHTRAIN_GEMM_BACKEND=reference forces the reference; MESHTRAIN_ONEDNN_LIBRARY names another library file.
//
// gemm_bf16 is the same product with A and B in bfloat16 (already rounded, see round_to_bfloat16), each
// product and sum in float32, C in float32: oneDNN's matmul primitive with bf16 inputs (AMX or AVX512-BF16
// kernels where the CPU has them), else the reference on the widened values.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "meshtrain/core/dtype.h"

namespace meshtrain::kernels {

struct GemmBackend {
  std::string name;     // "onednn" or "reference"
  std::string version;  // "oneDNN 2.6.3", or the reason there is none
  std::string isa;      // the instruction set its kernels use: "avx512_core_bf16", "avx2", ...
  std::string warning;  // non-empty when matmuls run slower than this CPU allows, with the reason and the fix
  std::string bf16_isa;  // what gemm_bf16 runs: oneDNN's kernel ("brg:avx512_core_amx_bf16"), or "reference"
  std::string describe() const;  // "oneDNN 2.6.3 (sgemm + matmul primitive), isa avx512_core_bf16"
};

// Chosen (and oneDNN loaded and checked) on first use; the same for the whole process.
const GemmBackend& gemm_backend();

// C = op(A) op(B), or C += op(A) op(B) with accumulate. K == 0 leaves C (accumulate) or zeroes it.
void gemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, bool accumulate, float* C, int64_t ldc);

// C = op(A) op(B) (or +=) with bfloat16 inputs and float32 accumulation and output.
void gemm_bf16(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, bool accumulate, float* C, int64_t ldc);

// gemm_bf16 with B given in float32 and rounded to bfloat16 (round to nearest even) into b_scratch [K * N]
// elements: with oneDNN, in one reorder into the layout its bf16 kernel reads (format_tag any), so the
// product copies nothing of B (bench/README.md, "bf16 weights in oneDNN's layout"); else row-major.
// Where oneDNN rounds, a float32 denormal may become zero (the bf16 convert instruction flushes them).
// bias [N] (or nullptr; not with accumulate): C = op(A) op(B) + bias in every row, the bias added to each
// float32 sum as the product writes it (oneDNN's bias argument) rather than copied into C and read back.
void gemm_bf16_float32_b(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K,
                         const uint16_t* A, int64_t lda, const float* B, int64_t ldb, bool accumulate,
                         float* C, int64_t ldc, uint16_t* b_scratch, const float* bias = nullptr);

// An input element as the accumulator type: bfloat16 bits widen exactly to float.
template <class T, class In>
T widened(In value) {
  if constexpr (std::is_same_v<In, uint16_t>) {
    return static_cast<T>(float_from_bfloat16(value));
  } else {
    return static_cast<T>(value);
  }
}

// The plain reference: rows [row_begin, row_end) of C, each accumulated in T over k in order. In is T, or
// uint16_t for bfloat16 inputs.
template <class T, class In = T>
void gemm_reference_rows(bool transpose_a, bool transpose_b, int64_t N, int64_t K, const In* A, int64_t lda,
                         const In* B, int64_t ldb, bool accumulate, T* C, int64_t ldc, int64_t row_begin,
                         int64_t row_end) {
  for (int64_t m = row_begin; m < row_end; ++m) {
    T* row = C + m * ldc;
    if (!accumulate) {
      for (int64_t n = 0; n < N; ++n) row[n] = T(0);
    }
    if (transpose_b) {  // B stored [N, K]: a dot product per output
      for (int64_t n = 0; n < N; ++n) {
        T sum = T(0);
        for (int64_t k = 0; k < K; ++k)
          sum += widened<T>(transpose_a ? A[k * lda + m] : A[m * lda + k]) * widened<T>(B[n * ldb + k]);
        row[n] += sum;
      }
    } else {  // B stored [K, N]: rows of B scaled into the output row (contiguous, vectorises)
      for (int64_t k = 0; k < K; ++k) {
        const T a = widened<T>(transpose_a ? A[k * lda + m] : A[m * lda + k]);
        const In* b = B + k * ldb;
        for (int64_t n = 0; n < N; ++n) row[n] += a * widened<T>(b[n]);
      }
    }
  }
}

template <class T, class In = T>
void gemm_reference(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, const In* A,
                    int64_t lda, const In* B, int64_t ldb, bool accumulate, T* C, int64_t ldc) {
  gemm_reference_rows(transpose_a, transpose_b, N, K, A, lda, B, ldb, accumulate, C, ldc, 0, M);
}

}  // namespace meshtrain::kernels
