// Fast grouped matmul: one GEMM-seam product per non-empty expert segment (gemm.h picks the threads). Each
// product is the one the dense matmul makes for a [rows, I] x [I, O] layer, so the experts run at the
// GEMM's speed for segments of a few dozen rows and up; tiny segments pay a call each.
#include "meshtrain/kernels/cpu/grouped_matmul.h"

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/gemm.h"

namespace meshtrain::kernels {

void grouped_matmul_forward(float* out, const float* x, const float* w, const int32_t* offsets, int64_t E,
                            int64_t I, int64_t O) {
  MT_CHECK(offsets[0] == 0, "grouped matmul segments start at row 0");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t begin = offsets[e], rows = offsets[e + 1] - offsets[e];
    MT_CHECK(rows >= 0, "grouped matmul offsets ascend");
    if (rows == 0 || O == 0) continue;
    // K = I = 0 zeroes the segment.
    gemm(false, false, rows, O, I, x + begin * I, I, w + e * I * O, O, false, out + begin * O, O);
  }
}

void grouped_matmul_backward(float* d_x, float* d_w, const float* d_out, const float* x, const float* w,
                             const int32_t* offsets, int64_t E, int64_t I, int64_t O) {
  MT_CHECK(offsets[0] == 0, "grouped matmul segments start at row 0");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t begin = offsets[e], rows = offsets[e + 1] - offsets[e];
    MT_CHECK(rows >= 0, "grouped matmul offsets ascend");
    if (rows == 0 || I == 0) continue;
    if (d_x != nullptr) {
      gemm(false, true, rows, I, O, d_out + begin * O, O, w + e * I * O, O, false, d_x + begin * I, I);
    }
    if (d_w != nullptr && O > 0) {
      gemm(true, false, I, O, rows, x + begin * I, I, d_out + begin * O, O, true, d_w + e * I * O, O);
    }
  }
}

}  // namespace meshtrain::kernels
