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

// Blocks of kLogitsBlockColumns over V columns.
int64_t logits_blocks(int64_t V) {
  return (V + kLogitsBlockColumns - 1) / kLogitsBlockColumns;
}

// The bf16 loss's online softmax statistics of a chunk's rows, filled block by block as the logits GEMM
// produces each block (chunk_logits): per row the running maximum, the sum of exp(x - that maximum) over the
// blocks so far (double) and the target's logit (0 where the row has none among these columns); per row and
// block the shift its exponentials were taken at. The chunk then holds exp(x - shift of its block), not x:
// the exponentials are taken once, while the block is in cache, and the softmax pass over the chunk only
// scales and rounds them. With one block (V <= 1024) the values are bitwise those of the float32 path's
// passes.
struct OnlineSoftmax {
  float* maxima;          // [rows]
  double* sums;           // [rows]
  double* target_logits;  // [rows]
  float* shifts;          // [rows][blocks]
  int64_t blocks;
};

// out[:, 0, columns) (leading dimension ld_out) = h [rows, D] @ W[:, column, column + columns), float32 or
// bfloat16 inputs (In).
template <class In>
void logits_product(float* out, int64_t ld_out, const In* h, const In* w, UnembedLayout layout, int64_t rows,
                    int64_t column, int64_t columns, int64_t D, int64_t V) {
  const bool transpose_w = layout != UnembedLayout::kernel_DV;
  product(false, transpose_w, rows, columns, D, h, D, w + (transpose_w ? column * D : column),
          transpose_w ? D : V, false, out, ld_out);
}

// out[v] = exp(x[v] - shift) for v < count (out may be x); returns their sum, accumulated in double: 16 lanes
// (two vectors of 8) over the full blocks of 16, the tail in order, then the lanes in order. A fixed order,
// so the sum depends only on the values.
double exponentiate_into(float* out, const float* x, int64_t count, float shift) {
#pragma omp simd
  for (int64_t v = 0; v < count; ++v) out[v] = exp_approx(x[v] - shift);
  const float* row = out;
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

// logits [rows, vocab_valid] (leading dimension vocab_valid) = h [rows, D] @ W[:, :vocab_valid]. Padding
// columns are never computed: they do not take part in the softmax. float32 (online null): one product;
// the softmax pass then takes each row's maximum and exponentials. bfloat16: kLogitsBlockColumns columns at a
// time through block [rows, columns], each block's exponentials and statistics taken from it (OnlineSoftmax)
// and written to the chunk; target_column(r) is row r's target column, or < 0 for none.
template <class In, class TargetColumn>
void chunk_logits(float* logits, OnlineSoftmax* online, float* block, const In* h, const In* w,
                  UnembedLayout layout, int64_t rows, int64_t D, int64_t V, int64_t vocab_valid,
                  const TargetColumn& target_column) {
  if (online == nullptr) {
    logits_product(logits, vocab_valid, h, w, layout, rows, 0, vocab_valid, D, V);
    return;
  }
  for (int64_t column = 0; column < vocab_valid; column += kLogitsBlockColumns) {
    const int64_t columns = std::min(kLogitsBlockColumns, vocab_valid - column);
    const int64_t b = column / kLogitsBlockColumns;
    logits_product(block, columns, h, w, layout, rows, column, columns, D, V);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = block + r * columns;
      const float previous = column == 0 ? -std::numeric_limits<float>::infinity() : online->maxima[r];
      const float running = std::max(previous, row_maximum(x, columns));
      // The sum so far was of exp(x - previous): rescaled to the new maximum (exactly 1 when it did not
      // move).
      double sum = column == 0 ? 0.0 : online->sums[r];
      if (running > previous && sum != 0.0) sum *= std::exp(static_cast<double>(previous) - running);
      sum += exponentiate_into(logits + r * vocab_valid + column, x, columns, running);
      online->maxima[r] = running;
      online->sums[r] = sum;
      online->shifts[r * online->blocks + b] = running;
      const int64_t target = target_column(r);
      if (column == 0) online->target_logits[r] = 0.0;
      if (target >= column && target < column + columns) online->target_logits[r] = x[target - column];
    }
  }
}

// dlogits of one row from its exponentials: (exp * scale - onehot(target)), target < 0 for none (an ignored
// token, or a target on another vocab-parallel rank), written over the row in place (float32 inputs).
void write_dlogits(float* row, int64_t count, float scale, int64_t target) {
#pragma omp simd
  for (int64_t v = 0; v < count; ++v) row[v] *= scale;
  if (target >= 0) row[target] -= 1.0f;
}

// The same for bf16 inputs from the online exponentials of one row, exps [count] taken at shifts [blocks]
// (one per block of kLogitsBlockColumns), the row's maximum max_logit: each block's exponentials times
// exp(shift - max_logit) (exactly 1 for the block whose shift is the maximum) and the scale, rounded straight
// into the row of dlogits_bf16 that the backward GEMMs read, so no float32 dlogits are written.
void write_dlogits_online(const float* exps, const float* shifts, int64_t count, float max_logit, float scale,
                          int64_t target, uint16_t* dlogits_bf16) {
  for (int64_t column = 0, b = 0; column < count; column += kLogitsBlockColumns, ++b) {
    const int64_t end = std::min(count, column + kLogitsBlockColumns);
    const float ratio = exp_approx(shifts[b] - max_logit);
#pragma omp simd
    for (int64_t v = column; v < end; ++v) dlogits_bf16[v] = bfloat16_from_float(exps[v] * ratio * scale);
  }
  if (target >= 0) {
    const float ratio = exp_approx(shifts[target / kLogitsBlockColumns] - max_logit);
    dlogits_bf16[target] = bfloat16_from_float(exps[target] * ratio * scale - 1.0f);
  }
}

// The factor of a counted row's softmax in its dlogits: d(lse - logit[target] + m lse^2) / d logit[v] =
// softmax[v] (1 + 2 m lse) - onehot[v], softmax[v] = exp[v] / sum_exp. m = 0 gives exactly 1 / sum_exp.
float softmax_scale(double sum_exp, double log_sum_exp, double z_loss_multiplier) {
  return static_cast<float>((1.0 + 2.0 * z_loss_multiplier * log_sum_exp) / sum_exp);
}

// A counted row's loss (lse - target logit), z-loss (m lse^2) and softmax scale from its maximum, sum of
// exponentials and target logit: one rank and vocab-parallel run this same arithmetic.
struct RowLoss {
  double loss, z_loss;
  float scale;
};
RowLoss row_loss(float max_logit, double sum_exp, double target_logit, double z_loss_multiplier) {
  const double log_sum_exp = static_cast<double>(max_logit) + std::log(sum_exp);
  return {log_sum_exp - target_logit, z_loss_multiplier * log_sum_exp * log_sum_exp,
          softmax_scale(sum_exp, log_sum_exp, z_loss_multiplier)};
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

// Adds a chunk's per-row losses (doubles at row_loss_bytes, written with memcpy) and z-losses to sums,
// serially in row order, so that the sums do not depend on the thread count. Both paths (one rank,
// vocab-parallel) store their rows' values and add them here: adding a z-loss where it is formed lets GCC
// contract m lse^2 + sum into one fused multiply-add (-ffp-contract=fast is its default for C++), which
// rounds once where the other path rounds twice: the paths differed in the last bit on an AVX2 CPU.
void add_row_losses(CrossEntropySums& sums, const unsigned char* row_loss_bytes, const double* row_z_losses,
                    int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    double loss = 0.0;
    std::memcpy(&loss, row_loss_bytes + r * static_cast<int64_t>(sizeof(double)), sizeof(double));
    sums.loss_sum += loss;
    sums.z_loss_sum += row_z_losses[r];
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
  // W, a group of h and of dlogits in bf16, then the float32 block of logits and the online softmax's shifts
  // [C, blocks] (2 elements per float, plus one to align them).
  const int64_t group_tokens = cross_entropy_group_tokens(N, chunk_tokens, V);
  return D * V + group_tokens * D + group_tokens * V +
         2 * chunk_tokens * (kLogitsBlockColumns + logits_blocks(V)) + 1;
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
  // boundary, created there as doubles (the callback takes a double*). The per-row z-losses go in the
  // second half of those doubles (after the rows' sums, over the target logits once read).
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
  // bf16: the online softmax's statistics (OnlineSoftmax), per row in `statistics` (the layout the
  // vocab-parallel all-reduce takes: sums, then target logits), the shifts [C, blocks] after the block.
  OnlineSoftmax online{maxima, statistics, nullptr, nullptr, logits_blocks(V)};
  if (bf16_inputs != nullptr && N > 0 && local_valid > 0) {
    w_bf16 = bf16_inputs;
    h_group_bf16 = bf16_inputs + D * V;
    dlogits_group = h_group_bf16 + group_tokens * D;
    void* place = dlogits_group + group_tokens * V;
    const int64_t floats = chunk_tokens * (kLogitsBlockColumns + online.blocks);
    size_t space = static_cast<size_t>(2 * floats + 1) * sizeof(uint16_t);
    const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
    MT_CHECK(std::align(alignof(float), bytes, place, space) != nullptr, "bf16 scratch alignment");
    logits_block = ::new (place) float[static_cast<size_t>(floats)];
    online.shifts = logits_block + chunk_tokens * kLogitsBlockColumns;
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
    // Row r's target column among this rank's, or -1 (an ignored token, or a target on another rank).
    const auto target_column = [&](int64_t r) -> int64_t {
      if (loss_mask != nullptr && loss_mask[start + r] == 0) return -1;
      const int64_t local = targets[start + r] - offset;
      return local >= 0 && local < local_valid ? local : -1;
    };
    online.target_logits = statistics + rows;  // [rows], after the sums: the all-reduce's layout
    if (local_valid == 0) {
      std::fill(maxima, maxima + rows, -std::numeric_limits<float>::infinity());
    } else if (w_bf16 != nullptr) {
      round_to_bfloat16(h_chunk, rows, D, D, h_chunk_bf16);
      chunk_logits(logits, &online, logits_block, h_chunk_bf16, w_bf16, layout, rows, D, V, local_valid,
                   target_column);
    } else {
      chunk_logits(logits, nullptr, nullptr, h_chunk, w, layout, rows, D, V, local_valid, target_column);
    }
    const bool bf16 = w_bf16 != nullptr;  // the online softmax's statistics are in `online`

    if (!parallel) {
      // Per-row z-losses over the online sums (bf16): each row reads its statistics before writing there.
      double* row_z_losses = statistics + rows;  // [rows]
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        float* row = logits + r * vocab_valid;
        const bool counts = loss_mask == nullptr || loss_mask[start + r] != 0;
        double loss = 0.0, z_loss = 0.0;
        if (counts || want_gradients) {
          // Stable log-softmax: shift by the row maximum so exp never overflows. The exponentials are always
          // stored (the chunk's logits are scratch), so the eval-only pass and the pass with gradients run
          // the same code and give bitwise equal losses. bf16: taken block by block in chunk_logits.
          const float max_logit = bf16 ? maxima[r] : row_maximum(row, vocab_valid);
          const double target_logit = !counts ? 0.0
                                      : bf16  ? online.target_logits[r]
                                              : static_cast<double>(row[targets[start + r]]);
          const double sum_exp = bf16 ? online.sums[r] : exponentiate_into(row, row, vocab_valid, max_logit);
          // dlogits = (softmax (1 + 2 m lse) - onehot) * mask: an ignored token contributes an all-zero row.
          float scale = 0.0f;
          if (counts) {
            const RowLoss counted = row_loss(max_logit, sum_exp, target_logit, z_loss_multiplier);
            loss = counted.loss;
            z_loss = counted.z_loss;
            scale = counted.scale;
          }
          if (want_gradients && bf16) {
            write_dlogits_online(row, online.shifts + r * online.blocks, vocab_valid, max_logit, scale,
                                 target_column(r), dlogits_bf16 + r * vocab_valid);
          } else if (want_gradients) {
            write_dlogits(row, vocab_valid, scale, target_column(r));
          }
        }
        std::memcpy(row_loss_bytes + r * static_cast<int64_t>(sizeof(double)), &loss, sizeof(double));
        row_z_losses[r] = z_loss;
      }
      add_row_losses(sums, row_loss_bytes, row_z_losses, rows);
    } else {
      // Vocab-parallel: the same stable log-softmax with the row maximum and the sum of exponentials
      // combined over the ranks. float32 rows nobody needs (ignored, no gradients) keep a sum of 0.
      double* sum_exps = statistics;              // [rows]
      double* target_logits = statistics + rows;  // [rows]
      if (!bf16 && local_valid > 0) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) maxima[r] = row_maximum(logits + r * local_valid, local_valid);
      }
      vocab_parallel->all_reduce_max(maxima, rows);
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        float* row = logits + r * local_valid;
        const bool counts = loss_mask == nullptr || loss_mask[start + r] != 0;
        if (bf16 && local_valid > 0) {
          // The online sum was of exp(x - this rank's maximum, its last block's shift): to the global one.
          const float local_maximum =
              online.shifts[r * online.blocks + (local_valid - 1) / kLogitsBlockColumns];
          if (sum_exps[r] != 0.0) sum_exps[r] *= std::exp(static_cast<double>(local_maximum) - maxima[r]);
          continue;  // target_logits[r] was taken with the sums
        }
        double sum_exp = 0.0, target_logit = 0.0;
        if ((counts || want_gradients) && local_valid > 0) {
          const int64_t local_target = target_column(r);
          if (local_target >= 0) target_logit = row[local_target];
          sum_exp = exponentiate_into(row, row, local_valid, maxima[r]);
        }
        sum_exps[r] = sum_exp;
        target_logits[r] = target_logit;
      }
      vocab_parallel->all_reduce_sum(statistics, 2 * rows);
      // Each counted row's loss and z-loss, stored as the single-rank path stores them; its sum of
      // exponentials is replaced by its softmax scale, which the gradients read.
      double* softmax_scales = sum_exps;     // [rows]
      double* row_z_losses = target_logits;  // [rows], each written once its target logit is read
      for (int64_t r = 0; r < rows; ++r) {
        double loss = 0.0, z_loss = 0.0;
        if (loss_mask == nullptr || loss_mask[start + r] != 0) {
          const RowLoss counted = row_loss(maxima[r], sum_exps[r], target_logits[r], z_loss_multiplier);
          loss = counted.loss;
          z_loss = counted.z_loss;
          softmax_scales[r] = counted.scale;
        }
        std::memcpy(row_loss_bytes + r * static_cast<int64_t>(sizeof(double)), &loss, sizeof(double));
        row_z_losses[r] = z_loss;
      }
      add_row_losses(sums, row_loss_bytes, row_z_losses, rows);
      if (want_gradients && local_valid > 0) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
          // dlogits = (softmax (1 + 2 m lse) - onehot) * mask, softmax over all ranks' columns.
          float* row = logits + r * local_valid;
          const bool counts = loss_mask == nullptr || loss_mask[start + r] != 0;
          const float scale = counts ? static_cast<float>(softmax_scales[r]) : 0.0f;
          const int64_t target = target_column(r);
          if (bf16) {
            write_dlogits_online(row, online.shifts + r * online.blocks, local_valid, maxima[r], scale,
                                 target, dlogits_bf16 + r * local_valid);
          } else {
            write_dlogits(row, local_valid, scale, target);
          }
        }
      }
    }

    if (local_valid == 0) {
      // A vocab-parallel rank holding only padding: no logits, so its share of dh is zero and dw is
      // untouched.
      if (dh != nullptr) std::fill(dh + start * D, dh + (start + rows) * D, 0.0f);
      continue;
    }
    if (want_gradients && bf16) {
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
