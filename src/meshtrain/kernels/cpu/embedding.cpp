#include "meshtrain/kernels/cpu/embedding.h"

#include <algorithm>

#include "meshtrain/core/error.h"

namespace meshtrain::kernels {
namespace {

// Columns per OpenMP task in the scatter-add: each column is owned by one thread and summed in token order.
constexpr int64_t kColumnBlock = 32;

// Checked before any parallel region: an exception must not escape an OpenMP worker.
void check_ids(const int32_t* ids, int64_t N, int64_t R) {
  for (int64_t n = 0; n < N; ++n) {
    MT_CHECK(ids[n] >= 0 && ids[n] < R, "embedding id " + to_text(ids[n]) + " at token " + to_text(n) +
                                            " outside [0, " + to_text(R) + ")");
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t R, int64_t D,
                       bool accumulate) {
  check_ids(ids, N, R);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* source = table + static_cast<int64_t>(ids[n]) * D;
    float* target = out + n * D;
    if (accumulate) {
      for (int64_t j = 0; j < D; ++j) target[j] += source[j];
    } else {
      std::copy(source, source + D, target);
    }
  }
}

void embedding_backward(float* dtable, const int32_t* ids, const float* dout, int64_t N, int64_t R,
                        int64_t D) {
  check_ids(ids, N, R);
  const int64_t blocks = (D + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t begin = block * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, D - begin);
    for (int64_t n = 0; n < N; ++n) {
      float* target = dtable + static_cast<int64_t>(ids[n]) * D + begin;
      const float* source = dout + n * D + begin;
      for (int64_t j = 0; j < width; ++j) target[j] += source[j];
    }
  }
}

}  // namespace meshtrain::kernels
