#include "meshtrain/kernels/cpu/cross_entropy.h"

#include <cstring>
#include <memory>
#include <new>

#include "meshtrain/kernels/cpu/fast_math.h"
#include "meshtrain/kernels/cpu/gemm.h"

namespace meshtrain::kernels {
namespace {

// C (+)= op(A) op(B) in float32 or, when the inputs are bfloat16 bits, with bf16 inputs.
void product(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
             const float* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  gemm(transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}
void product(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
             int64_t lda, const uint16_t* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  gemm_bf16(transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
}

// Row helpers of the softmax, written with GCC/Clang vector extensions (16 floats, split by the compiler on
// targets without AVX-512): GCC does not vectorise an `omp simd reduction(max)` over floats without
// -ffast-math, nor reliably a float -> double sum next to exp_approx (measured: 0.47 and 2.3 ns per element
// as scalar code, 0.03 and 0.3 here). Vectors never cross a function boundary.
typedef float Floats __attribute__((vector_size(64)));
typedef double Doubles __attribute__((vector_size(64)));
typedef float HalfFloats __attribute__((vector_size(32)));
constexpr int64_t kLanes = 16;

// max of row[0, count), count >= 1. Max is exact, so the lane order does not matter.
float row_maximum(const float* row, int64_t count) {
  float result = row[0];
  int64_t v = 0;
  if (count >= kLanes) {
    Floats lanes;
    std::memcpy(&lanes, row, sizeof lanes);
    for (v = kLanes; v + kLanes <= count; v += kLanes) {
      Floats next;
      std::memcpy(&next, row + v, sizeof next);
      lanes = lanes < next ? next : lanes;
    }
    for (int64_t lane = 0; lane < kLanes; ++lane) result = std::max(result, lanes[lane]);
  }
  for (; v < count; ++v) result = std::max(result, row[v]);
  return result;
}

// Columns of logits per GEMM of chunk_logits: each block's product lands in an L2-sized buffer and is then
// copied into the chunk's logits. oneDNN 2.6.3's bf16 matmul writing [667, 50257] float32 logits in one call
// ran at 550-650 GFLOP/s on the Xeon with AMX, against 920-970 for 512-2048-column blocks with the copy
// (bench/README.md); its float32 GEMM was the same speed either way (350 GFLOP/s).
constexpr int64_t kLogitsBlockColumns = 1024;

// dst[0, count) = src[0, count); returns max(running, max of src). Max is exact: any order gives the same.
float copy_and_maximum(float* dst, const float* src, int64_t count, float running) {
  int64_t v = 0;
  if (count >= kLanes) {
    Floats lanes;
    std::memcpy(&lanes, src, sizeof lanes);
    for (; v + kLanes <= count; v += kLanes) {
      Floats next;
      std::memcpy(&next, src + v, sizeof next);
      std::memcpy(dst + v, &next, sizeof next);
      lanes = lanes < next ? next : lanes;
    }
    for (int64_t lane = 0; lane < kLanes; ++lane) running = std::max(running, lanes[lane]);
  }
  for (; v < count; ++v) {
    dst[v] = src[v];
    running = std::max(running, src[v]);
  }
  return running;
}

// out[:, 0, columns) (leading dimension ld_out) = h [rows, D] @ W[:, column, column + columns), float32 or
// bfloat16 inputs (In).
template <class In>
void logits_product(float* out, int64_t ld_out, const In* h, const In* w, UnembedLayout layout, int64_t rows,
                    int64_t column, int64_t columns, int64_t D, int64_t V) {
  const bool transpose_w = layout != UnembedLayout::kernel_DV;
  product(false, transpose_w, rows, columns, D, h, D, w + (transpose_w ? column * D : column),
          transpose_w ? D : V, false, out, ld_out);
}

// logits [rows, vocab_valid] (leading dimension vocab_valid) = h [rows, D] @ W[:, :vocab_valid]. Padding
// columns are never computed: they do not take part in the softmax. float32 (block null): one product, and
// the softmax takes each row's maximum where it reads the row; bfloat16: kLogitsBlockColumns columns at a
// time through block [rows, columns], and maxima[r] = max of row r from the copy.
template <class In>
void chunk_logits(float* logits, float* maxima, float* block, const In* h, const In* w, UnembedLayout layout,
                  int64_t rows, int64_t D, int64_t V, int64_t vocab_valid) {
  if (block == nullptr) {
    logits_product(logits, vocab_valid, h, w, layout, rows, 0, vocab_valid, D, V);
    return;
  }
  for (int64_t column = 0; column < vocab_valid; column += kLogitsBlockColumns) {
    const int64_t columns = std::min(kLogitsBlockColumns, vocab_valid - column);
    logits_product(block, columns, h, w, layout, rows, column, columns, D, V);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float running = column == 0 ? -std::numeric_limits<float>::infinity() : maxima[r];
      maxima[r] = copy_and_maximum(logits + r * vocab_valid + column, block + r * columns, columns, running);
    }
  }
}

// row[v] = exp(row[v] - shift) for v < count; returns their sum, accumulated in double: 16 lanes (two vectors
// of 8) over the full blocks of 16, the tail in order, then the lanes in order. A fixed order, so the sum
// depends only on the row.
double exponentiate_and_sum(float* row, int64_t count, float shift) {
#pragma omp simd
  for (int64_t v = 0; v < count; ++v) row[v] = exp_approx(row[v] - shift);
  Doubles low = {}, high = {};
  int64_t v = 0;
  for (; v + kLanes <= count; v += kLanes) {
    HalfFloats first, second;
    std::memcpy(&first, row + v, sizeof first);
    std::memcpy(&second, row + v + kLanes / 2, sizeof second);
    low += __builtin_convertvector(first, Doubles);
    high += __builtin_convertvector(second, Doubles);
  }
  double tail = 0.0;
  for (; v < count; ++v) tail += static_cast<double>(row[v]);
  double total = 0.0;
  for (int64_t lane = 0; lane < kLanes / 2; ++lane) total += low[lane];
  for (int64_t lane = 0; lane < kLanes / 2; ++lane) total += high[lane];
  return total + tail;
}

// dlogits of one row from its exponentials: (exp * scale - onehot(target)), target < 0 for none (an ignored
// token, or a target on another vocab-parallel rank). Float32 inputs: written over the row in place. bf16
// inputs: rounded straight into the row of dlogits_bf16 that the backward GEMMs read, in the same pass, so
// the float32 values are neither written back nor read again by a separate rounding pass over the chunk.
// Both give bitwise the values of scaling, subtracting and then rounding.
void write_dlogits(float* row, int64_t count, float scale, int64_t target, uint16_t* dlogits_bf16) {
  if (dlogits_bf16 == nullptr) {
#pragma omp simd
    for (int64_t v = 0; v < count; ++v) row[v] *= scale;
    if (target >= 0) row[target] -= 1.0f;
    return;
  }
#pragma omp simd
  for (int64_t v = 0; v < count; ++v) dlogits_bf16[v] = bfloat16_from_float(row[v] * scale);
  if (target >= 0) dlogits_bf16[target] = bfloat16_from_float(row[target] * scale - 1.0f);
}

// The factor of a counted row's softmax in its dlogits: d(lse - logit[target] + m lse^2) / d logit[v] =
// softmax[v] (1 + 2 m lse) - onehot[v], softmax[v] = exp[v] / sum_exp. m = 0 gives exactly 1 / sum_exp.
float softmax_scale(double sum_exp, double log_sum_exp, double z_loss_multiplier) {
  return static_cast<float>((1.0 + 2.0 * z_loss_multiplier * log_sum_exp) / sum_exp);
}

// Gradients of `rows` tokens from `start` (a chunk, or a group for dw) from their dlogits [rows,
// local_valid] and h rows h_chunk: dh rows written (when dh), dw accumulated (when dw).
template <class In>
void backward_chunk(float* dh, float* dw, const In* h_chunk, const In* w, const In* dlogits,
                    UnembedLayout layout, int64_t start, int64_t rows, int64_t D, int64_t V,
                    int64_t local_valid) {
  const bool kernel_dv = layout == UnembedLayout::kernel_DV;
  if (dh != nullptr) {
    // kernel_DV: dh [rows, D] = dlogits [rows, vv] @ W[:, :vv]^T; table_VD: dlogits @ E[:vv, :]
    product(false, kernel_dv, rows, D, local_valid, dlogits, local_valid, w, kernel_dv ? V : D, false,
            dh + start * D, D);
  }
  if (dw != nullptr) {
    if (kernel_dv) {
      // dW[:, :vv] += h_chunk^T [D, rows] @ dlogits [rows, vv]
      product(true, false, D, local_valid, rows, h_chunk, D, dlogits, local_valid, true, dw, V);
    } else {
      // dE[:vv, :] += dlogits^T [vv, rows] @ h_chunk [rows, D]
      product(true, false, local_valid, D, rows, dlogits, local_valid, h_chunk, D, true, dw, D);
    }
  }
}

}  // namespace

int64_t cross_entropy_scratch_floats(int64_t chunk_tokens, int64_t V) {
  // Logits [C, V] (only the valid columns are used) + C doubles of per-row loss (2 floats each) + the
  // vocab-parallel statistics: C float maxima and 2 * C doubles (4 floats each; one rank's per-row z-losses)
  // aligned up by at most one float.
  return chunk_tokens * V + 2 * chunk_tokens + chunk_tokens + 4 * chunk_tokens + 1;
}

int64_t cross_entropy_bf16_scratch_elements(int64_t N, int64_t chunk_tokens, int64_t D, int64_t V) {
  // W, a group of h and of dlogits in bf16, then the float32 block of logits (2 elements per float, plus
  // one to align it).
  const int64_t group_tokens = cross_entropy_group_tokens(N, chunk_tokens, V);
  return D * V + group_tokens * D + group_tokens * V + 2 * chunk_tokens * kLogitsBlockColumns + 1;
}

CrossEntropySums unembed_cross_entropy(float* dh, float* dw, const float* h, const float* w,
                                       UnembedLayout layout, const int32_t* targets, const uint8_t* loss_mask,
                                       int64_t N, int64_t D, int64_t V, int64_t vocab_valid,
                                       double z_loss_multiplier, int64_t chunk_tokens, float* scratch,
                                       const VocabParallel* vocab_parallel, uint16_t* bf16_inputs) {
  MT_CHECK(N >= 0 && D >= 1 && V >= 1 && chunk_tokens >= 1, "N >= 0, D >= 1, V >= 1, chunk_tokens >= 1");
  MT_CHECK(z_loss_multiplier >= 0.0, "z_loss_multiplier >= 0 (the config validates it)");
  const bool parallel = vocab_parallel != nullptr;
  if (parallel) {
    MT_CHECK(vocab_valid >= 1 && vocab_parallel->vocab_offset >= 0, "vocab_valid >= 1, vocab_offset >= 0");
    MT_CHECK(vocab_parallel->all_reduce_max && vocab_parallel->all_reduce_sum,
             "vocab-parallel cross-entropy needs both all-reduce callbacks");
  } else {
    MT_CHECK(vocab_valid >= 1 && vocab_valid <= V, "vocab_valid must be in [1, V]");
  }
  MT_CHECK(N == 0 || (h != nullptr && w != nullptr && targets != nullptr && scratch != nullptr),
           "h, w, targets and scratch are required");
  // Targets are validated by the data path; checked here, outside the parallel region (an exception
  // cannot leave an OpenMP region), because an out-of-range target would read past the logits row.
  CrossEntropySums sums;
  for (int64_t n = 0; n < N; ++n) {
    if (loss_mask != nullptr && loss_mask[n] == 0) continue;
    MT_CHECK(targets[n] >= 0 && targets[n] < vocab_valid, "target out of [0, vocab_valid)");
    sums.valid_count += 1;
  }
  const bool want_gradients = dh != nullptr || dw != nullptr;
  // Global id of local column 0, and the valid local columns [0, local_valid): all of vocab_valid on a
  // single rank; possibly none on a vocab-parallel rank that holds only padding.
  const int64_t offset = parallel ? vocab_parallel->vocab_offset : 0;
  const int64_t local_valid = parallel ? std::clamp<int64_t>(vocab_valid - offset, 0, V) : vocab_valid;
  // The chunk's logits are packed with leading dimension local_valid; the per-row losses (double) follow
  // the largest possible logits block. They are written with memcpy: the buffer holds floats.
  float* logits = scratch;
  unsigned char* row_loss_bytes = reinterpret_cast<unsigned char*>(scratch + chunk_tokens * V);
  // Vocab-parallel statistics after the losses: float maxima [C], then doubles [2 * C] at the next 8-byte
  // boundary, created there as doubles (the callback takes a double*). A single rank keeps its per-row
  // z-losses in the first C of those doubles.
  float* maxima = nullptr;
  double* statistics = nullptr;
  if (N > 0) {
    maxima = scratch + chunk_tokens * V + 2 * chunk_tokens;
    void* place = maxima + chunk_tokens;
    size_t space = static_cast<size_t>(4 * chunk_tokens + 1) * sizeof(float);
    const size_t bytes = static_cast<size_t>(2 * chunk_tokens) * sizeof(double);
    MT_CHECK(std::align(alignof(double), bytes, place, space) != nullptr, "scratch alignment");
    statistics = ::new (place) double[static_cast<size_t>(2 * chunk_tokens)];
  }

  // bf16 inputs: W rounded once for every chunk, then each chunk's h and dlogits, kept for the group of
  // chunks whose weight gradient is one product (cross_entropy_group_tokens; G = C in float32).
  const int64_t group_tokens =
      bf16_inputs != nullptr ? cross_entropy_group_tokens(N, chunk_tokens, V) : chunk_tokens;
  uint16_t* w_bf16 = nullptr;         // layout of w, [D, V] or [V, D]
  uint16_t* h_group_bf16 = nullptr;   // [G, D]
  uint16_t* dlogits_group = nullptr;  // [G, local_valid]
  float* logits_block = nullptr;      // [C, kLogitsBlockColumns], float32
  if (bf16_inputs != nullptr && N > 0 && local_valid > 0) {
    w_bf16 = bf16_inputs;
    h_group_bf16 = bf16_inputs + D * V;
    dlogits_group = h_group_bf16 + group_tokens * D;
    void* place = dlogits_group + group_tokens * V;
    size_t space = static_cast<size_t>(2 * chunk_tokens * kLogitsBlockColumns + 1) * sizeof(uint16_t);
    const size_t bytes = static_cast<size_t>(chunk_tokens * kLogitsBlockColumns) * sizeof(float);
    MT_CHECK(std::align(alignof(float), bytes, place, space) != nullptr, "bf16 scratch alignment");
    logits_block = ::new (place) float[static_cast<size_t>(chunk_tokens * kLogitsBlockColumns)];
    if (layout == UnembedLayout::kernel_DV) {
      round_to_bfloat16(w, D, V, V, w_bf16);
    } else {
      round_to_bfloat16(w, V, D, D, w_bf16);
    }
  }

  for (int64_t start = 0; start < N; start += chunk_tokens) {
    const int64_t rows = std::min(chunk_tokens, N - start);
    const float* h_chunk = h + start * D;
    // The group this chunk belongs to (groups are whole chunks), and its rows in the group's bf16 buffers.
    const int64_t group_start = start / group_tokens * group_tokens;
    const int64_t group_end = std::min(group_start + group_tokens, N);
    uint16_t* h_chunk_bf16 = h_group_bf16 != nullptr ? h_group_bf16 + (start - group_start) * D : nullptr;
    uint16_t* dlogits_bf16 =
        dlogits_group != nullptr ? dlogits_group + (start - group_start) * local_valid : nullptr;
    if (local_valid == 0) {
      std::fill(maxima, maxima + rows, -std::numeric_limits<float>::infinity());
    } else if (w_bf16 != nullptr) {
      round_to_bfloat16(h_chunk, rows, D, D, h_chunk_bf16);
      chunk_logits(logits, maxima, logits_block, h_chunk_bf16, w_bf16, layout, rows, D, V, local_valid);
    } else {
      chunk_logits(logits, maxima, nullptr, h_chunk, w, layout, rows, D, V, local_valid);
    }

    if (!parallel) {
      double* row_z_losses = statistics;  // [rows]
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        float* row = logits + r * vocab_valid;
        const bool counts = loss_mask == nullptr || loss_mask[start + r] != 0;
        double loss = 0.0, z_loss = 0.0;
        if (counts || want_gradients) {
          // Stable log-softmax: shift by the row maximum so exp never overflows. The exponentials are always
          // stored (the chunk's logits are scratch), so the eval-only pass and the pass with gradients run
          // the same code and give bitwise equal losses.
          const float max_logit = logits_block != nullptr ? maxima[r] : row_maximum(row, vocab_valid);
          const float target_logit = counts ? row[targets[start + r]] : 0.0f;
          const double sum_exp = exponentiate_and_sum(row, vocab_valid, max_logit);
          // dlogits = (softmax (1 + 2 m lse) - onehot) * mask: an ignored token contributes an all-zero row.
          float scale = 0.0f;
          if (counts) {
            const double log_sum_exp = static_cast<double>(max_logit) + std::log(sum_exp);
            loss = log_sum_exp - static_cast<double>(target_logit);
            z_loss = z_loss_multiplier * log_sum_exp * log_sum_exp;
            scale = softmax_scale(sum_exp, log_sum_exp, z_loss_multiplier);
          }
          if (want_gradients) {
            write_dlogits(row, vocab_valid, scale, counts ? targets[start + r] : -1,
                          w_bf16 != nullptr ? dlogits_bf16 + r * vocab_valid : nullptr);
          }
        }
        std::memcpy(row_loss_bytes + r * static_cast<int64_t>(sizeof(double)), &loss, sizeof(double));
        row_z_losses[r] = z_loss;
      }
      // Serial sums in row order: the losses do not depend on the thread count.
      for (int64_t r = 0; r < rows; ++r) {
        double loss = 0.0;
        std::memcpy(&loss, row_loss_bytes + r * static_cast<int64_t>(sizeof(double)), sizeof(double));
        sums.loss_sum += loss;
        sums.z_loss_sum += row_z_losses[r];
      }
    } else {
      // Vocab-parallel: the same stable log-softmax with the row maximum and the sum of exponentials
      // combined over the ranks. Rows nobody needs (ignored, no gradients) keep a sum of 0.
      double* sum_exps = statistics;              // [rows]
      double* target_logits = statistics + rows;  // [rows]
      if (logits_block == nullptr && local_valid > 0) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) maxima[r] = row_maximum(logits + r * local_valid, local_valid);
      }
      vocab_parallel->all_reduce_max(maxima, rows);
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        float* row = logits + r * local_valid;
        const bool counts = loss_mask == nullptr || loss_mask[start + r] != 0;
        double sum_exp = 0.0, target_logit = 0.0;
        if ((counts || want_gradients) && local_valid > 0) {
          const int64_t local_target = counts ? targets[start + r] - offset : -1;
          if (local_target >= 0 && local_target < local_valid) target_logit = row[local_target];
          sum_exp = exponentiate_and_sum(row, local_valid, maxima[r]);
        }
        sum_exps[r] = sum_exp;
        target_logits[r] = target_logit;
      }
      vocab_parallel->all_reduce_sum(statistics, 2 * rows);
      // Serial sums in row order: the losses do not depend on the thread count. Each counted row's sum of
      // exponentials is then replaced by its softmax scale, which the gradients read.
      double* softmax_scales = sum_exps;  // [rows]
      for (int64_t r = 0; r < rows; ++r) {
        if (loss_mask != nullptr && loss_mask[start + r] == 0) continue;
        const double log_sum_exp = static_cast<double>(maxima[r]) + std::log(sum_exps[r]);
        sums.loss_sum += log_sum_exp - target_logits[r];
        sums.z_loss_sum += z_loss_multiplier * log_sum_exp * log_sum_exp;
        softmax_scales[r] = softmax_scale(sum_exps[r], log_sum_exp, z_loss_multiplier);
      }
      if (want_gradients && local_valid > 0) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
          // dlogits = (softmax (1 + 2 m lse) - onehot) * mask, softmax over all ranks' columns.
          float* row = logits + r * local_valid;
          const bool counts = loss_mask == nullptr || loss_mask[start + r] != 0;
          const float scale = counts ? static_cast<float>(softmax_scales[r]) : 0.0f;
          const int64_t local_target = counts ? targets[start + r] - offset : -1;
          write_dlogits(row, local_valid, scale,
                        local_target >= 0 && local_target < local_valid ? local_target : -1,
                        w_bf16 != nullptr ? dlogits_bf16 + r * local_valid : nullptr);
        }
      }
    }

    if (local_valid == 0) {
      // A vocab-parallel rank holding only padding: no logits, so its share of dh is zero and dw is
      // untouched.
      if (dh != nullptr) std::fill(dh + start * D, dh + (start + rows) * D, 0.0f);
      continue;
    }
    if (want_gradients && w_bf16 != nullptr) {
      // dh per chunk; dw once the group's last chunk is in.
      backward_chunk(dh, nullptr, h_chunk_bf16, w_bf16, dlogits_bf16, layout, start, rows, D, V, local_valid);
      if (start + rows == group_end) {
        backward_chunk(nullptr, dw, h_group_bf16, w_bf16, dlogits_group, layout, group_start,
                       group_end - group_start, D, V, local_valid);
      }
    } else if (want_gradients) {
      backward_chunk(dh, dw, h_chunk, w, logits, layout, start, rows, D, V, local_valid);
    }
  }
  return sums;
}

void unembed_logits(float* out, const float* h, const float* w, UnembedLayout layout, int64_t N, int64_t D,
                    int64_t V, int64_t vocab_valid) {
  MT_CHECK(N >= 0 && D >= 1, "N >= 0, D >= 1");
  MT_CHECK(vocab_valid >= 1 && vocab_valid <= V, "vocab_valid must be in [1, V]");
  if (N == 0) return;
  logits_product<float>(out, V, h, w, layout, N, 0, vocab_valid, D, V);
  // Padding columns can never be sampled.
  for (int64_t n = 0; n < N; ++n) {
    std::fill(out + n * V + vocab_valid, out + (n + 1) * V, -std::numeric_limits<float>::infinity());
  }
}

}  // namespace meshtrain::kernels
