// Grouped matmul on the GPU (grouped_matmul.h): one cuBLASLt GEMM per non-empty expert segment, through the
// one GEMM seam (gemm.h), in expert order on the stream, as the cpu kernel makes one GEMM-seam product per
// segment. Why not a grouped or batched GEMM: a batched GEMM needs equal segments, and cuBLAS's grouped GEMM
// (cublasGemmGroupedBatchedEx) takes the per-group sizes in host arrays too, so either way the offsets are
// read to the host (one copy, one synchronisation per call; E + 1 int32s); one GEMM per expert keeps the
// seam's float32-without-TF32 semantics and its tested cuBLASLt path. Each segment's product is the dense
// matmul's for [rows, I] x [I, O], so a segment's rows sum in cuBLASLt's order for that shape.
// Legend: E experts, I / O input / output width, R = offsets[E] rows.
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/gemm.h"
#include "meshtrain/kernels/cuda/grouped_matmul.h"

namespace meshtrain::kernels::cuda {
namespace {

// The segment bounds on the host, checked as the cpu kernel checks them.
std::vector<int32_t> host_offsets(const int32_t* offsets, int64_t E) {
  std::vector<int32_t> host(static_cast<size_t>(E + 1));
  memory_copy_out(host.data(), offsets, host.size() * sizeof(int32_t));
  MT_CHECK(host[0] == 0, "grouped matmul segments start at row 0");
  for (int64_t e = 0; e < E; ++e) {
    MT_CHECK(host[e + 1] >= host[e], "grouped matmul offsets ascend (expert " + std::to_string(e) + ")");
  }
  return host;
}

}  // namespace

void grouped_matmul_forward(float* out, const float* x, const float* w, const int32_t* offsets, int64_t E,
                            int64_t I, int64_t O) {
  const std::vector<int32_t> bounds = host_offsets(offsets, E);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t begin = bounds[e], rows = bounds[e + 1] - bounds[e];
    if (rows == 0 || O == 0) continue;
    // K = I = 0 zeroes the segment (gemm.h).
    gemm_f32(out + begin * O, x + begin * I, w + e * I * O, rows, O, I, false, false, false);
  }
}

void grouped_matmul_backward(float* d_x, float* d_w, const float* d_out, const float* x, const float* w,
                             const int32_t* offsets, int64_t E, int64_t I, int64_t O) {
  const std::vector<int32_t> bounds = host_offsets(offsets, E);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t begin = bounds[e], rows = bounds[e + 1] - bounds[e];
    if (rows == 0 || I == 0) continue;
    // d_x [rows, I] = d_out [rows, O] @ w[e]^T ([I, O] stored)
    if (d_x != nullptr)
      gemm_f32(d_x + begin * I, d_out + begin * O, w + e * I * O, rows, I, O, false, true, false);
    // d_w[e] [I, O] += x^T ([rows, I] stored) @ d_out [rows, O]
    if (d_w != nullptr && O > 0) {
      gemm_f32(d_w + e * I * O, x + begin * I, d_out + begin * O, I, O, rows, true, false, true);
    }
  }
}

}  // namespace meshtrain::kernels::cuda
