// The one GEMM seam of the cuda kernels (cuBLASLt), as kernels/cpu/gemm.h is the cpu kernels': matmul and
// the fused loss multiply through it. Row-major operands, float32 output and accumulation.
// Legend: M, N output rows and columns, K the reduced dimension.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshtrain::kernels::cuda {

// C [M, N] = op(A) @ op(B), or C += op(A) @ op(B) when accumulate. A is [M, K] (or [K, M] when transposed_a),
// B is [K, N] (or [N, K] when transposed_b), all row-major and contiguous. gemm_f32 multiplies float32
// operands in full float32 (CUBLAS_COMPUTE_32F: no TF32, so results match the cpu kernels to float32
// rounding); gemm_bf16 takes bf16 operands (bit patterns, as round_to_bf16 writes them) on the tensor
// cores with float32 accumulation. M, N or K == 0: C is left as it is (accumulate) or zeroed.
void gemm_f32(float* c, const float* a, const float* b, int64_t M, int64_t N, int64_t K, bool transposed_a,
              bool transposed_b, bool accumulate);
void gemm_bf16(float* c, const uint16_t* a, const uint16_t* b, int64_t M, int64_t N, int64_t K,
               bool transposed_a, bool transposed_b, bool accumulate);

// Bytes of the one cuBLASLt workspace every GEMM shares (device memory beside the arena, allocated at the
// first GEMM and kept for the process).
size_t gemm_workspace_bytes();

// out[i] = in[i] rounded to bf16, nearest even (NaN stays a NaN), as the cpu kernels round.
void round_to_bf16(uint16_t* out, const float* in, int64_t count);

}  // namespace meshtrain::kernels::cuda
