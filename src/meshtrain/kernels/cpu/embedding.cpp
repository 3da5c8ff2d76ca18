#include "meshtrain/kernels/cpu/embedding.h"

#include <omp.h>

#include <algorithm>

#include "meshtrain/core/error.h"

namespace meshtrain::kernels {
namespace {

// Smallest column range per OpenMP task in the scatter-add: each column is owned by one thread and summed in
// token order.
constexpr int64_t kColumnBlock = 32;

// Checked before any parallel region: an exception must not escape an OpenMP worker.
void check_ids(const int32_t* ids, int64_t N, int64_t R, int64_t vocab_offset, int64_t global_rows) {
  if (global_rows < 0) global_rows = vocab_offset + R;
  MT_CHECK(R >= 0 && vocab_offset >= 0 && vocab_offset + R <= global_rows,
           "table rows [" + to_text(vocab_offset) + ", " + to_text(vocab_offset + R) + ") outside [0, " +
               to_text(global_rows) + ")");
  for (int64_t n = 0; n < N; ++n) {
    MT_CHECK(ids[n] >= 0 && ids[n] < global_rows, "embedding id " + to_text(ids[n]) + " at token " +
                                                      to_text(n) + " outside [0, " + to_text(global_rows) +
                                                      ")");
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t R, int64_t D,
                       bool accumulate, int64_t vocab_offset, int64_t global_rows) {
  check_ids(ids, N, R, vocab_offset, global_rows);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row = static_cast<int64_t>(ids[n]) - vocab_offset;
    float* target = out + n * D;
    if (row < 0 || row >= R) {
      // Held by another vocab rank: a zero row, so the sum over the ranks is the lookup.
      if (!accumulate) std::fill(target, target + D, 0.0f);
      continue;
    }
    const float* source = table + row * D;
    if (accumulate) {
      for (int64_t j = 0; j < D; ++j) target[j] += source[j];
    } else {
      std::copy(source, source + D, target);
    }
  }
}

void embedding_backward(float* dtable, const int32_t* ids, const float* dout, int64_t N, int64_t R, int64_t D,
                        int64_t vocab_offset, int64_t global_rows) {
  check_ids(ids, N, R, vocab_offset, global_rows);
  // One contiguous column range per thread (a multiple of 16 floats, at least kColumnBlock), so each token
  // adds one long row segment instead of many 32-float pieces. Every element is still summed in token order
  // by one thread, so the result does not depend on the thread count or on the range width.
  const int64_t threads = std::max(1, omp_get_max_threads());
  const int64_t width = std::max(kColumnBlock, ((D + threads - 1) / threads + 15) / 16 * 16);
  const int64_t blocks = (D + width - 1) / width;
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t begin = block * width;
    const int64_t end = std::min(D, begin + width);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = static_cast<int64_t>(ids[n]) - vocab_offset;
      if (row < 0 || row >= R) continue;  // held by another vocab rank
      float* target = dtable + row * D;
      const float* source = dout + n * D;
#pragma omp simd
      for (int64_t j = begin; j < end; ++j) target[j] += source[j];
    }
  }
}

}  // namespace meshtrain::kernels
