// Fast CPU attention: flash-style tiles of kTile queries x kTile keys, online softmax in the forward and
// score recomputation from the saved log-sum-exp in the backward. One implementation serves a query set
// over a separate key / value set (context_attention_*, context parallelism) and self-attention
// (attention_forward / attention_backward: both sets are the same tokens, bitwise the results this file gave
// before the sets were split).
//
// Arithmetic: both matrix products of a tile pair run as register-blocked rank-1 updates, never as dot
// products (those need a horizontal sum per score, which at d = 64 costs as much as the products):
//   - scores: one side of the pair is packed transposed ([d][kTile], one lane per token), the other side
//     supplies broadcast scalars, so 4 rows x kTile lanes of scores accumulate in registers;
//   - outputs / gradients: y_r += coef * x_t with x_t a contiguous row of v, k, q or dout.
// Every output element is thus one fused multiply-add chain in a fixed order (over the head width c for
// scores, over tokens for the products), whatever the blocking, lane count or which side was packed.
//
// Work split and determinism:
// - Forward: one task per (batch, query head, query tile); each owns its out rows and lse entries.
// - Backward: each (query tile, key tile) pair adds its terms to dq of the query tile and/or to dk, dv of
//   the key tile, in a fixed order: dq rows over key tiles ascending, dk / dv rows over (query head of the
//   group, query tile) ascending. Two schedules produce that order:
//     * owner: one task per (batch, kv head) owns dk, dv of that kv head and dq of its query heads and
//       computes each pair once. Used when B*K tasks keep the threads busy.
//     * split: pass 1, one task per (batch, kv head, key tile), writes dk, dv; pass 2, one task per (batch,
//       query head, query tile), writes dq. Each pair is computed twice (about 1.4x the flops) but there are
//       S/kTile times more tasks; used when B*K is too small for the threads.
//   Both add bitwise identical terms in identical order, so the gradients do not depend on the thread
//   count. No atomics, no per-thread partial sums. In both, dq accumulates in the thread's copy of the
//   head's rows (contiguous; dq's own rows are H * d floats apart) and goes to dq when the task ends.
// - Masking: tile pairs whose position / segment ranges prove that no query sees any key are skipped, pairs
//   that provably see every key skip the per-element mask, everything else is masked per element. Correct
//   for arbitrary positions, and for sorted positions the causal upper triangle is skipped.
//
// The register blocks use GCC/Clang vector extensions (one vector = one register of the target: 16 floats
// with AVX-512, 8 with AVX2) because at -O2 GCC keeps accumulators written as float arrays in `omp simd`
// loops in memory. The first version of this file used dot products with `omp simd` reductions and ran at 28
// GFLOP/s on one Zen 5 core; this one runs at about 135. The blocks are sized to the register file (32
// vector registers with AVX-512, 16 with AVX2): a block written for AVX-512 compiled for AVX2 became twice
// the registers there are and ran at 3 GFLOP/s on a Zen 3 core, no faster than the plain reference. Which
// lanes a block covers never changes an element's chain of operations, so results do not depend on the
// target's vector width. Vectors never cross a function boundary (that would change the ABI between targets
// and trip -Wpsabi).
#include "meshtrain/kernels/cpu/attention.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cpu/fast_math.h"

namespace meshtrain::kernels {
namespace {

// Tokens per query tile and per key tile, and the lane count of a row of scores. 64 x 64 scores are 16 KiB;
// with the packed tiles below everything a pair touches stays in L2.
constexpr int64_t kTile = 64;
// kLanes: floats per Vec (one register). kScoreVecs: Vecs of a score row one register block covers (4 rows x
// kScoreVecs accumulators); kUpdateVecs: Vecs of a head-width row one rank-update block covers (4 rows x
// kUpdateVecs). Both leave room for the operands in the register file.
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
constexpr int kScoreVecs = 4, kUpdateVecs = 4;  // 16 accumulators + 4 operands of 32 registers
// Rows per register block: 6 x kScoreVecs (kUpdateVecs) = 24 accumulators + 4 operands; 4-row and 1-row
// blocks take the rest. 6 rows ran 1.05-1.2x faster than 4 on the Xeon with AMX (bench/README.md).
constexpr int kScoreRows = 6, kUpdateRows = 6;
#else
constexpr int64_t kLanes = 8;
constexpr int kScoreVecs = 2, kUpdateVecs = 2;  // 8 accumulators + 2 operands + a broadcast of 16
constexpr int kScoreRows = 4, kUpdateRows = 4;  // the 4-row blocks alone
#endif
constexpr int64_t kVecsPerTile = kTile / kLanes;  // a row of scores is 4 (AVX-512) or 8 Vecs
static_assert(kVecsPerTile % kScoreVecs == 0);
// Head-width columns packed at once: heads up to 256 wide are packed once per tile and reused for every
// pair; wider heads are repacked per pair in 256-column slices (slower, same results).
constexpr int64_t kPackWidth = 256;
constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

// Unaligned load / store of one Vec (kLanes floats) through memcpy (both compilers emit one vector move); by
// reference so no Vec is passed by value.
inline void load(Vec& value, const float* p) {
  std::memcpy(&value, p, sizeof(Vec));
}
inline void store(float* p, const Vec& value) {
  std::memcpy(p, &value, sizeof(Vec));
}

// Keeps a loaded vector in a register. Without this GCC folds the load into each of its R uses (one memory
// operand per FMA), which makes the register blocks load-bound: 1.5x slower on Zen 5 with AVX-512. An
// empty asm that "modifies" the value cannot be re-read from memory. Only where a Vec fits one register.
inline void pin_register(Vec& value) {
#if defined(__AVX__) && defined(__GNUC__)
  __asm__("" : "+v"(value));  // a zmm (AVX-512) or ymm (AVX2) register: Vec is exactly one
#else
  (void)value;
#endif
}

// Range of positions and segment ids over rows [begin, end) of one sequence; the skip tests below only
// need these four numbers.
struct TileBounds {
  int32_t min_position, max_position, min_segment, max_segment;
};

TileBounds tile_bounds(const int32_t* positions, const int32_t* segment_ids, int64_t begin, int64_t end) {
  TileBounds bounds{std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(), 0, 0};
  for (int64_t row = begin; row < end; ++row) {
    bounds.min_position = std::min(bounds.min_position, positions[row]);
    bounds.max_position = std::max(bounds.max_position, positions[row]);
  }
  if (segment_ids != nullptr) {
    bounds.min_segment = std::numeric_limits<int32_t>::max();
    bounds.max_segment = std::numeric_limits<int32_t>::min();
    for (int64_t row = begin; row < end; ++row) {
      bounds.min_segment = std::min(bounds.min_segment, segment_ids[row]);
      bounds.max_segment = std::max(bounds.max_segment, segment_ids[row]);
    }
  }
  return bounds;
}

// True when no query of the tile can see any key of the tile: every key is later than every query, or
// the segment ranges are disjoint.
bool fully_masked(const TileBounds& queries, const TileBounds& keys) {
  return queries.max_position < keys.min_position || queries.max_segment < keys.min_segment ||
         keys.max_segment < queries.min_segment;
}

// True when every query sees every key: all keys no later than the earliest query, one common segment.
bool fully_visible(const TileBounds& queries, const TileBounds& keys) {
  return keys.max_position <= queries.min_position && queries.min_segment == queries.max_segment &&
         keys.min_segment == keys.max_segment && queries.min_segment == keys.min_segment;
}

// Columns [c0, c1) of up to kTile rows, transposed to data[(c - c0) * kTile + row]; lanes >= count are 0.
// Tagged with what it holds so a tile used by many pairs is packed once.
struct PackedTile {
  const float* rows = nullptr;
  int64_t count = 0, c0 = -1;
  alignas(64) float data[kPackWidth * kTile];
};

const float* pack(PackedTile& packed, const float* rows, int64_t stride, int64_t count, int64_t c0,
                  int64_t c1) {
  if (packed.rows == rows && packed.count == count && packed.c0 == c0) return packed.data;
  for (int64_t row = 0; row < count; ++row) {
    const float* source = rows + row * stride;
    for (int64_t c = c0; c < c1; ++c) packed.data[(c - c0) * kTile + row] = source[c];
  }
  for (int64_t c = c0; c < c1; ++c) std::fill_n(packed.data + (c - c0) * kTile + count, kTile - count, 0.0f);
  packed.rows = rows;
  packed.count = count;
  packed.c0 = c0;
  return packed.data;
}

// out[r * kTile + lane] (= or, when accumulate, +=) sum_{c < width} x_r[c] * packed[c * kTile + lane] for
// r < R, x_r = x + r * x_stride and the lanes of Vecs [v0, v0 + kScoreVecs) of the row: R x kScoreVecs
// accumulators in registers, one broadcast per row and column.
template <int R>
void score_rows(float* out, const float* x, int64_t x_stride, const float* packed, int64_t width,
                bool accumulate, int v0) {
  Vec acc[R][kScoreVecs];
  const int64_t lane0 = v0 * kLanes;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kScoreVecs; ++v) {
      acc[r][v] = Vec{};
      if (accumulate) load(acc[r][v], out + r * kTile + lane0 + v * kLanes);
    }
  }
  for (int64_t c = 0; c < width; ++c) {
    const float* column = packed + c * kTile + lane0;
    Vec lanes[kScoreVecs];
#pragma GCC unroll 4
    for (int v = 0; v < kScoreVecs; ++v) {
      load(lanes[v], column + v * kLanes);
      pin_register(lanes[v]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float scalar = x[r * x_stride + c];
#pragma GCC unroll 4
      for (int v = 0; v < kScoreVecs; ++v) acc[r][v] += scalar * lanes[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kScoreVecs; ++v) store(out + r * kTile + lane0 + v * kLanes, acc[r][v]);
  }
}

// raw[r * kTile + lane] = x_r . col_lane (unscaled) for r < x_count and all kTile lanes, where x_r are rows
// of stride x_stride and col_lane are `col_count` rows of stride col_stride (lanes beyond give 0), packed
// through `packed`.
void score_tile(float* raw, const float* x, int64_t x_stride, int64_t x_count, PackedTile& packed,
                const float* cols, int64_t col_stride, int64_t col_count, int64_t d) {
  for (int64_t c0 = 0; c0 < d; c0 += kPackWidth) {
    const int64_t c1 = std::min(d, c0 + kPackWidth);
    const float* columns = pack(packed, cols, col_stride, col_count, c0, c1);
    int64_t r = 0;
    for (; r + kScoreRows <= x_count; r += kScoreRows) {
      for (int v0 = 0; v0 < kVecsPerTile; v0 += kScoreVecs)
        score_rows<kScoreRows>(raw + r * kTile, x + r * x_stride + c0, x_stride, columns, c1 - c0, c0 > 0,
                               v0);
    }
    for (; r + 4 <= x_count; r += 4) {
      for (int v0 = 0; v0 < kVecsPerTile; v0 += kScoreVecs)
        score_rows<4>(raw + r * kTile, x + r * x_stride + c0, x_stride, columns, c1 - c0, c0 > 0, v0);
    }
    for (; r < x_count; ++r) {
      for (int v0 = 0; v0 < kVecsPerTile; v0 += kScoreVecs)
        score_rows<1>(raw + r * kTile, x + r * x_stride + c0, x_stride, columns, c1 - c0, c0 > 0, v0);
    }
  }
}

// Columns [c0, c0 + V * kLanes) of rank_update below, with R x V accumulators in registers.
template <int R, int V>
void rank_update_block(float* y, int64_t y_stride, const float* coef, int64_t t_stride, int64_t r_stride,
                       const float* x, int64_t x_stride, int64_t n) {
  Vec acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) load(acc[r][v], y + r * y_stride + v * kLanes);
  }
  for (int64_t t = 0; t < n; ++t) {
    Vec row[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      load(row[v], x + t * x_stride + v * kLanes);
      pin_register(row[v]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float scalar = coef[t * t_stride + r * r_stride];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] += scalar * row[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) store(y + r * y_stride + v * kLanes, acc[r][v]);
  }
}

// y_r[c] += sum_{t < n} coef[t * t_stride + r * r_stride] * x_t[c] for r < R, c < d, with y_r = y + r *
// y_stride and x_t = x + t * x_stride; one fused multiply-add per term, t ascending.
template <int R>
void rank_update(float* y, int64_t y_stride, const float* coef, int64_t t_stride, int64_t r_stride,
                 const float* x, int64_t x_stride, int64_t n, int64_t d) {
  int64_t c0 = 0;
  for (; c0 + kUpdateVecs * kLanes <= d; c0 += kUpdateVecs * kLanes) {
    rank_update_block<R, kUpdateVecs>(y + c0, y_stride, coef, t_stride, r_stride, x + c0, x_stride, n);
  }
  for (; c0 + kLanes <= d; c0 += kLanes) {
    rank_update_block<R, 1>(y + c0, y_stride, coef, t_stride, r_stride, x + c0, x_stride, n);
  }
  if (c0 == d) return;
  for (int r = 0; r < R; ++r) {
    float* yr = y + r * y_stride;
    for (int64_t t = 0; t < n; ++t) {
      const float scalar = coef[t * t_stride + r * r_stride];
      const float* xt = x + t * x_stride;
      for (int64_t c = c0; c < d; ++c) yr[c] += scalar * xt[c];
    }
  }
}

// rank_update over `rows` rows of y, four at a time. With `trim`, terms at either end of t whose
// coefficients are all zero for the block (masked entries of diagonal tiles) are dropped; they would add
// exact zeros, so the result is the same.
void rank_update_rows(float* y, int64_t y_stride, int64_t rows, const float* coef, int64_t t_stride,
                      int64_t r_stride, const float* x, int64_t x_stride, int64_t n, int64_t d, bool trim) {
  const auto block = [&]<int R>(int64_t r) {
    const float* block_coef = coef + r * r_stride;
    const auto zero_term = [&](int64_t t) {
      for (int i = 0; i < R; ++i) {
        if (block_coef[t * t_stride + i * r_stride] != 0.0f) return false;
      }
      return true;
    };
    int64_t begin = 0, end = n;
    if (trim) {
      while (end > begin && zero_term(end - 1)) --end;
      while (begin < end && zero_term(begin)) ++begin;
    }
    rank_update<R>(y + r * y_stride, y_stride, block_coef + begin * t_stride, t_stride, r_stride,
                   x + begin * x_stride, x_stride, end - begin, d);
  };
  int64_t r = 0;
  for (; r + kUpdateRows <= rows; r += kUpdateRows) block.template operator()<kUpdateRows>(r);
  for (; r + 4 <= rows; r += 4) block.template operator()<4>(r);
  for (; r < rows; ++r) block.template operator()<1>(r);
}

void zero_rows(float* rows, int64_t stride, int64_t count, int64_t d) {
  for (int64_t row = 0; row < count; ++row) std::fill_n(rows + row * stride, d, 0.0f);
}

using attention_detail::TokenSets;

// One (batch, query head) slice and its kv head: base pointers at token 0 and row strides.
struct HeadView {
  const float* q;                 // [Sq] rows of stride q_stride (= H * d)
  const float* k;                 // [Skv] rows of stride kv_stride (= K * d)
  const float* v;                 // [Skv] rows of stride kv_stride
  const int32_t* q_positions;     // [Sq]
  const int32_t* q_segment_ids;   // [Sq] or nullptr
  const int32_t* kv_positions;    // [Skv]
  const int32_t* kv_segment_ids;  // [Skv] or nullptr
  int64_t Sq, Skv, d, q_stride, kv_stride;
  int64_t group_head;  // h % (H / K): which query head of its kv head's group
};

HeadView head_view(const float* q, const float* k, const float* v, const TokenSets& sets, int64_t b,
                   int64_t h, int64_t H, int64_t K, int64_t d) {
  const int64_t g = h / (H / K), Sq = sets.Sq, Skv = sets.Skv;
  return HeadView{q + (b * Sq * H + h) * d,
                  k + (b * Skv * K + g) * d,
                  v + (b * Skv * K + g) * d,
                  sets.q_positions + b * Sq,
                  sets.q_segment_ids == nullptr ? nullptr : sets.q_segment_ids + b * Sq,
                  sets.kv_positions + b * Skv,
                  sets.kv_segment_ids == nullptr ? nullptr : sets.kv_segment_ids + b * Skv,
                  Sq,
                  Skv,
                  d,
                  H * d,
                  K * d,
                  h % (H / K)};
}

// Positions and segment ids of the tokens laid out along the lanes of a score row, padded so that padding
// lanes are invisible (never read anyway).
struct LaneTokens {
  alignas(64) int32_t position[kTile];
  alignas(64) int32_t segment[kTile];
};

void lane_tokens(LaneTokens& lanes, const int32_t* positions, const int32_t* segment_ids, int64_t begin,
                 int64_t count, int32_t pad_position) {
  for (int64_t lane = 0; lane < kTile; ++lane) {
    const bool real = lane < count;
    lanes.position[lane] = real ? positions[begin + lane] : pad_position;
    lanes.segment[lane] = real && segment_ids != nullptr ? segment_ids[begin + lane] : 0;
  }
}

// scores[r * kTile + lane] = visible ? scale * raw : -inf for r < rows. Row tokens are rows [row_begin,
// row_begin + rows) of row_positions / row_segment_ids (the key set when `keys_are_rows`, else the query
// set); a query sees a key iff same segment and key position <= query position. With `masked` false every
// pair is known visible and only scaling happens. With lane_max, lane_max[lane] also becomes the maximum of
// the rows' results in that lane (-inf when all are masked), read while the row is still in registers.
void scale_and_mask(float* scores, const int32_t* row_positions, const int32_t* row_segment_ids,
                    const LaneTokens& lanes, int64_t row_begin, int64_t rows, bool keys_are_rows, bool masked,
                    float scale, float* lane_max = nullptr) {
  if (lane_max != nullptr) std::fill_n(lane_max, kTile, kNegativeInfinity);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * kTile;
    if (!masked) {
#pragma omp simd
      for (int64_t lane = 0; lane < kTile; ++lane) row[lane] *= scale;
    } else {
      const int32_t position = row_positions[row_begin + r];
      const int32_t segment = row_segment_ids == nullptr ? 0 : row_segment_ids[row_begin + r];
      if (keys_are_rows) {
#pragma omp simd
        for (int64_t lane = 0; lane < kTile; ++lane) {
          const bool visible = lanes.segment[lane] == segment && position <= lanes.position[lane];
          row[lane] = visible ? scale * row[lane] : kNegativeInfinity;
        }
      } else {
#pragma omp simd
        for (int64_t lane = 0; lane < kTile; ++lane) {
          const bool visible = lanes.segment[lane] == segment && lanes.position[lane] <= position;
          row[lane] = visible ? scale * row[lane] : kNegativeInfinity;
        }
      }
    }
    if (lane_max == nullptr) continue;
#pragma omp simd
    for (int64_t lane = 0; lane < kTile; ++lane) lane_max[lane] = std::max(lane_max[lane], row[lane]);
  }
}

// Running softmax statistics of the query rows of one forward tile, per query lane.
struct SoftmaxRows {
  alignas(64) float row_max[kTile], row_sum[kTile], tile_max[kTile], shift[kTile], alpha[kTile];
};

// Starts the online softmax of query rows [i0, i0 + rows) of one head. With `accumulate` it resumes from the
// (out, lse) already there: running max = lse, running sum = 1 (out is normalised, i.e. in units of
// exp(lse)), accumulator = out; a row with lse = -inf has seen nothing yet (sum 0, out zeroed). Folding a key
// set in tile by tile or block by block is thus the same recurrence. Otherwise out rows start at 0.
// start_softmax_rows sets the statistics, start_query_rows also the out rows.
void start_softmax_rows(SoftmaxRows& softmax, const float* lse, int64_t i0, int64_t rows, bool accumulate) {
  std::fill_n(softmax.row_max, kTile, kNegativeInfinity);
  std::fill_n(softmax.row_sum, kTile, 0.0f);
  if (!accumulate) return;
  for (int64_t i = 0; i < rows; ++i) {
    softmax.row_max[i] = lse[i0 + i];
    softmax.row_sum[i] = softmax.row_max[i] == kNegativeInfinity ? 0.0f : 1.0f;
  }
}

void start_query_rows(SoftmaxRows& softmax, float* out, const float* lse, const HeadView& view, int64_t i0,
                      int64_t rows, bool accumulate) {
  start_softmax_rows(softmax, lse, i0, rows, accumulate);
  if (accumulate) {
    for (int64_t i = 0; i < rows; ++i) {
      if (softmax.row_sum[i] == 0.0f) std::fill_n(out + (i0 + i) * view.q_stride, view.d, 0.0f);
    }
  } else {
    zero_rows(out + i0 * view.q_stride, view.q_stride, rows, view.d);
  }
}

// One key tile of the online softmax: scores [cols key rows][kTile query lanes] (scaled and masked) become
// exp(score - running max); the running sums and maxima move on, and softmax.alpha says how far each
// query's maximum moved (what its accumulated output must be multiplied by).
void softmax_tile_statistics(SoftmaxRows& softmax, float* scores, int64_t cols) {
  float* const row_max = softmax.row_max;
  float* const row_sum = softmax.row_sum;
  float* const tile_max = softmax.tile_max;
  float* const shift = softmax.shift;
  float* const alpha = softmax.alpha;
  // New running max per query lane, and the rescale factor for what earlier tiles accumulated.
  std::fill_n(tile_max, kTile, kNegativeInfinity);
  for (int64_t j = 0; j < cols; ++j) {
#pragma omp simd
    for (int64_t lane = 0; lane < kTile; ++lane)
      tile_max[lane] = std::max(tile_max[lane], scores[j * kTile + lane]);
  }
#pragma omp simd
  for (int64_t lane = 0; lane < kTile; ++lane) {
    const float new_max = std::max(row_max[lane], tile_max[lane]);
    shift[lane] = new_max == kNegativeInfinity ? 0.0f : new_max;  // no visible key yet: keep sums at 0
    alpha[lane] = exp_approx(row_max[lane] - shift[lane]);        // 1 when the max did not move
    row_max[lane] = new_max;
    row_sum[lane] *= alpha[lane];
  }
  for (int64_t j = 0; j < cols; ++j) {
    float* row = scores + j * kTile;
#pragma omp simd
    for (int64_t lane = 0; lane < kTile; ++lane) {
      row[lane] = exp_approx(row[lane] - shift[lane]);
      row_sum[lane] += row[lane];
    }
  }
}

// softmax_tile_statistics, then out rows [i0, i0 + rows) rescaled by alpha.
void online_softmax_tile(SoftmaxRows& softmax, float* scores, int64_t cols, float* out, const HeadView& view,
                         int64_t i0, int64_t rows) {
  softmax_tile_statistics(softmax, scores, cols);
  const float* const alpha = softmax.alpha;
  for (int64_t i = 0; i < rows; ++i) {
    if (alpha[i] == 1.0f) continue;
    float* oi = out + (i0 + i) * view.q_stride;
#pragma omp simd
    for (int64_t c = 0; c < view.d; ++c) oi[c] *= alpha[i];
  }
}

// Ends the forward of query rows [i0, i0 + rows): out divided by the running sum, lse = max + log(sum).
// row_sum == 0 only for a query that sees no key (never in self-attention, where a token sees itself): its
// out stays 0 (every p was 0) and its lse is -inf.
void finish_query_rows(const SoftmaxRows& softmax, float* out, float* lse, const HeadView& view, int64_t i0,
                       int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    float* oi = out + (i0 + i) * view.q_stride;
    const bool seen = softmax.row_sum[i] > 0.0f;
    const float inverse = seen ? 1.0f / softmax.row_sum[i] : 0.0f;
#pragma omp simd
    for (int64_t c = 0; c < view.d; ++c) oi[c] *= inverse;
    lse[i0 + i] = seen ? softmax.row_max[i] + std::log(softmax.row_sum[i]) : kNegativeInfinity;
  }
}

// What a kernel's per-thread buffers are sized by: the head width, both token counts, and the query heads
// per kv head.
struct BufferShape {
  int64_t d, Sq, Skv, group;
};

// The float32 forward's per-thread buffers (kept across the tasks a thread runs).
struct ForwardBuffers {
  explicit ForwardBuffers(const BufferShape& /*shape*/) {}
  PackedTile packed_queries;
  LaneTokens query_lanes;
  SoftmaxRows softmax;
  alignas(64) float scores[kTile * kTile];
};

// Forward of query rows [i0, i0 + rows) of one head. Scores are computed transposed (key rows x query
// lanes) so the packed query tile is reused for every key tile. Unnormalised outputs accumulate directly
// in `out` (rows of stride q_stride), so no accumulator scratch is needed. `accumulate`: see
// start_query_rows.
void forward_query_tile(ForwardBuffers& buffers, float* out, float* lse, const HeadView& view, int64_t i0,
                        int64_t rows, float scale, bool accumulate) {
  float* const scores = buffers.scores;
  const int64_t d = view.d;
  start_query_rows(buffers.softmax, out, lse, view, i0, rows, accumulate);
  lane_tokens(buffers.query_lanes, view.q_positions, view.q_segment_ids, i0, rows,
              std::numeric_limits<int32_t>::min());
  const TileBounds query_bounds = tile_bounds(view.q_positions, view.q_segment_ids, i0, i0 + rows);
  for (int64_t j0 = 0; j0 < view.Skv; j0 += kTile) {
    const int64_t cols = std::min(view.Skv - j0, kTile);
    const TileBounds key_bounds = tile_bounds(view.kv_positions, view.kv_segment_ids, j0, j0 + cols);
    if (fully_masked(query_bounds, key_bounds)) continue;
    const float* k_rows = view.k + j0 * view.kv_stride;
    score_tile(scores, k_rows, view.kv_stride, cols, buffers.packed_queries, view.q + i0 * view.q_stride,
               view.q_stride, rows, d);
    const bool masked = !fully_visible(query_bounds, key_bounds);
    scale_and_mask(scores, view.kv_positions, view.kv_segment_ids, buffers.query_lanes, j0, cols, true,
                   masked, scale);
    online_softmax_tile(buffers.softmax, scores, cols, out, view, i0, rows);
    // out_i += sum_j p[j][i] v_j: coefficient of (term j, output row i) is scores[j * kTile + i].
    rank_update_rows(out + i0 * view.q_stride, view.q_stride, rows, scores, kTile, 1,
                     view.v + j0 * view.kv_stride, view.kv_stride, cols, d, masked);
  }
  finish_query_rows(buffers.softmax, out, lse, view, i0, rows);
}

// Gradient slices of one (batch, query head): dq rows like q, dk / dv rows like k, dout like q; lse and
// row_dot (= rowsum(dout * out)) are [Sq]. dq, or dk and dv, are null when that side is not wanted.
struct GradView {
  float* dq;
  // Floats between dq rows: the row length of the thread's dq copy (backward_sets, Kernel::dq_row_floats).
  int64_t dq_stride;
  float* dk;
  float* dv;
  const float* dout;
  const float* lse;
  const float* row_dot;
};

// The lse the backward subtracts: a query that saw no key has lse = -inf, and score - (-inf) would make
// its probabilities exp(+inf) (or NaN for masked -inf scores); +inf makes every one of them exactly 0, so
// such a row gets no gradient.
inline float backward_lse(float lse) {
  return lse == kNegativeInfinity ? std::numeric_limits<float>::infinity() : lse;
}

// Per-pair softmax backward state shared by both kernels: lane tokens and the lse / row_dot of queries laid
// out along lanes.
struct PairLanes {
  LaneTokens tokens;
  alignas(64) float lse[kTile], dot[kTile];
};

// Turns the raw scores q.k (in `probs`) and raw dout.v (in `dscores`) of query rows [i0, i0 + rows) x key
// rows [j0, j0 + cols) into P = exp(scale s - lse) and dS = scale * P * (dP - row_dot), masked, in the
// layout keys_are_rows picks (see backward_pair). Each element is the same arithmetic in either layout.
void probabilities_and_score_gradients(float* probs, float* dscores, PairLanes& lanes, const HeadView& view,
                                       const GradView& grad, int64_t i0, int64_t rows, int64_t j0,
                                       int64_t cols, bool masked, bool keys_are_rows, float scale) {
  const int64_t row_begin = keys_are_rows ? j0 : i0, row_count = keys_are_rows ? cols : rows;
  const int64_t lane_begin = keys_are_rows ? i0 : j0, lane_count = keys_are_rows ? rows : cols;
  if (keys_are_rows) {
    lane_tokens(lanes.tokens, view.q_positions, view.q_segment_ids, lane_begin, lane_count,
                std::numeric_limits<int32_t>::min());
    scale_and_mask(probs, view.kv_positions, view.kv_segment_ids, lanes.tokens, row_begin, row_count, true,
                   masked, scale);
  } else {
    lane_tokens(lanes.tokens, view.kv_positions, view.kv_segment_ids, lane_begin, lane_count,
                std::numeric_limits<int32_t>::max());
    scale_and_mask(probs, view.q_positions, view.q_segment_ids, lanes.tokens, row_begin, row_count, false,
                   masked, scale);
  }
  // lse and row_dot belong to queries: per lane when queries are lanes, per row otherwise. The unused one is
  // 0, and x - 0 == x exactly, so both layouts compute the same values.
  std::fill_n(lanes.lse, kTile, 0.0f);
  std::fill_n(lanes.dot, kTile, 0.0f);
  if (keys_are_rows) {
    for (int64_t i = 0; i < rows; ++i) lanes.lse[i] = backward_lse(grad.lse[i0 + i]);
    std::copy_n(grad.row_dot + i0, rows, lanes.dot);
  }
  for (int64_t r = 0; r < row_count; ++r) {
    float* pr = probs + r * kTile;
    float* dsr = dscores + r * kTile;
    const float row_lse = keys_are_rows ? 0.0f : backward_lse(grad.lse[i0 + r]);
    const float row_dot = keys_are_rows ? 0.0f : grad.row_dot[i0 + r];
#pragma omp simd
    for (int64_t lane = 0; lane < kTile; ++lane) {
      pr[lane] = exp_approx((pr[lane] - row_lse) - lanes.lse[lane]);
      dsr[lane] = scale * pr[lane] * ((dsr[lane] - row_dot) - lanes.dot[lane]);
    }
  }
}

// Per-thread buffers of the float32 backward: the two packed operands of the score products and the two
// tiles of probabilities P and score gradients dS.
struct BackwardBuffers {
  explicit BackwardBuffers(const BufferShape& /*shape*/) {}
  PackedTile packed_scores, packed_dscores;  // packed side of S = q k^T and of dP = dout v^T
  PairLanes lanes;
  alignas(64) float probs[kTile * kTile];
  alignas(64) float dscores[kTile * kTile];
};

// Contribution of query rows [i0, i0 + rows) x key rows [j0, j0 + cols) of one head. Recomputes
// P = exp(scale q k^T - lse) and dS = scale * P * (dout v^T - row_dot), then dq_i += sum_j dS_ij k_j (when
// grad.dq) and dv_j += sum_i P_ij dout_i, dk_j += sum_i dS_ij q_i (when grad.dk).
// keys_are_rows picks the layout: false = query rows x key lanes (the key tile is packed; used when one key
// tile meets many query tiles), true = key rows x query lanes (the query tile is packed). Each element of P
// and dS is the same arithmetic either way, so the layouts give bitwise equal results.
void backward_pair(BackwardBuffers& buffers, const HeadView& view, const GradView& grad, int64_t i0,
                   int64_t rows, int64_t j0, int64_t cols, bool masked, bool keys_are_rows, float scale) {
  const int64_t d = view.d, qs = view.q_stride, kvs = view.kv_stride;
  const float* q_rows = view.q + i0 * qs;
  const float* dout_rows = grad.dout + i0 * qs;
  const float* k_rows = view.k + j0 * kvs;
  const float* v_rows = view.v + j0 * kvs;
  if (keys_are_rows) {
    score_tile(buffers.probs, k_rows, kvs, cols, buffers.packed_scores, q_rows, qs, rows, d);
    score_tile(buffers.dscores, v_rows, kvs, cols, buffers.packed_dscores, dout_rows, qs, rows, d);
  } else {
    score_tile(buffers.probs, q_rows, qs, rows, buffers.packed_scores, k_rows, kvs, cols, d);
    score_tile(buffers.dscores, dout_rows, qs, rows, buffers.packed_dscores, v_rows, kvs, cols, d);
  }
  probabilities_and_score_gradients(buffers.probs, buffers.dscores, buffers.lanes, view, grad, i0, rows, j0,
                                    cols, masked, keys_are_rows, scale);
  // Element (query i, key j) of P and dS sits at [i * i_stride + j * j_stride].
  const int64_t i_stride = keys_are_rows ? 1 : kTile, j_stride = keys_are_rows ? kTile : 1;
  if (grad.dq != nullptr) {
    rank_update_rows(grad.dq + i0 * grad.dq_stride, grad.dq_stride, rows, buffers.dscores, j_stride, i_stride,
                     k_rows, kvs, cols, d, masked);
  }
  if (grad.dk != nullptr) {
    rank_update_rows(grad.dv + j0 * kvs, kvs, cols, buffers.probs, i_stride, j_stride, dout_rows, qs, rows, d,
                     masked);
    rank_update_rows(grad.dk + j0 * kvs, kvs, cols, buffers.dscores, i_stride, j_stride, q_rows, qs, rows, d,
                     masked);
  }
}

// The float32 kernel as the schedules below use it: dk / dv rows accumulate in place.
struct Float32Kernel {
  using Forward = ForwardBuffers;
  using Backward = BackwardBuffers;
  static void check_cpu() {}
  static void forward_tile(ForwardBuffers& buffers, float* out, float* lse, const HeadView& view, int64_t i0,
                           int64_t rows, float scale, bool accumulate) {
    forward_query_tile(buffers, out, lse, view, i0, rows, scale, accumulate);
  }
  static void pair(BackwardBuffers& buffers, const HeadView& view, const GradView& grad, int64_t i0,
                   int64_t rows, int64_t j0, int64_t cols, bool masked, bool keys_are_rows, float scale) {
    backward_pair(buffers, view, grad, i0, rows, j0, cols, masked, keys_are_rows, scale);
  }
  // dk, dv rows [cols] of stride `stride`: zeroed unless accumulating.
  static void begin_key_tile(BackwardBuffers&, float* dk, float* dv, int64_t stride, int64_t cols, int64_t d,
                             bool accumulate) {
    if (accumulate) return;
    zero_rows(dk, stride, cols, d);
    zero_rows(dv, stride, cols, d);
  }
  static void end_key_tile(BackwardBuffers&, float*, float*, int64_t, int64_t, int64_t) {}
  // Floats per row of the thread's dq copy (backward_sets): the pair adds exactly d columns.
  static int64_t dq_row_floats(int64_t d) { return d; }
};

// ---- bf16 products (AVX512-BF16) ----
//
// The bf16 kernel runs the same tiles, masks, softmax and schedules as the float32 one; only the six
// products differ: their inputs are rounded to bf16 (round to nearest even) when a tile is packed, and each
// product is vdpbf16ps, which adds two bf16 x bf16 products (exact in float32) to a float32 accumulator. So
// the reduction dimension is consumed in pairs: a "pair" below is two bf16 in one uint32, the lower half the
// even index. Every product has the shape of the float32 kernel's register blocks, with a pair in place of a
// term:
//   out[r][lane] (+)= sum_p a(r, p) . b[p][lane]
// where a(r, p) is one pair broadcast to all lanes and b[p] a packed row of pairs, lane = one output column.
// The packings (kTile = 64 tokens per tile, d the head width, pairs = ceil(d / 2)):
//   rows   [kTile][pairs]: token rows rounded, columns in pairs (a as rows: a(r, p) = rows[r * pairs + p]);
//   lanes  [pairs][kTile]: the same transposed, one token per lane (b of the score products);
//   interleaved [kTile / 2][width]: rows 2t and 2t + 1 interleaved column by column (b of the products
//               that reduce over tokens; read as a with a(r, p) = interleaved[p * width + r]).
// Products, with i query and j key tokens of a tile pair:
//   forward   S^T[j][i] = k_rows . q_lanes;          out[i][c] += P^T interleaved . v interleaved;
//   backward  S[i][j] = q_rows . k_lanes, dP[i][j] = dout_rows . v_lanes (key tile packed), or
//             S^T = k_rows . q_lanes, dP^T = v_rows . dout_lanes (query tile packed);
//             dq[i][c] += dS_rows . k interleaved (or dS^T interleaved . k interleaved);
//             dv^T[c][j] += dout interleaved . P interleaved, dk^T[c][j] += q interleaved . dS interleaved,
//             into a per-key-tile accumulator [d][kTile] that is added to dk, dv (transposed) at the end of
//             the key tile.
// Each output element is one chain of vdpbf16ps over its pairs in ascending order whatever the layout, so
// as in the float32 kernel the two backward schedules, and thus thread counts, give bitwise equal results.
// Tokens and columns beyond a tile's count are packed as 0, so they add exact zeros.
// The functions below carry their own target attribute, so the build stays portable; cpu_features() decides
// at run time whether they may run.
#define MESHTRAIN_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// Lanes [0, remaining) of a 16-lane vector (none when remaining <= 0, all when >= 16).
inline __mmask16 first_lanes(int64_t remaining) {
  if (remaining <= 0) return 0;
  return remaining >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << remaining) - 1u);
}

// x = 2^x per lane, for the AMX kernel's softmax, which runs in base 2: n = round(x), 2^(x - n) by Cephes'
// exp2f polynomial on [-1/2, 1/2] (relative error below 1.5e-7, as exp_approx's), times 2^n by vscalefps.
// Exactly 0 for x < -126, so no result is subnormal; for x = -inf, x - n is NaN in a lane the mask clears.
// x is never NaN, nor above 127. (Zero-masking forms with every lane set: the plain intrinsics start from
// _mm512_undefined_ps, which trips GCC 12's -Wmaybe-uninitialized.)
constexpr __mmask16 kAllLanes = 0xffff;

MESHTRAIN_AVX512_BF16 inline void exp2_lanes(__m512& x) {
  const __m512 n = _mm512_maskz_roundscale_ps(kAllLanes, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
  x = _mm512_maskz_scalef_ps(normal, p, n);
}

// rows[r * pairs + p] = (x_r[2p], x_r[2p + 1]) rounded to bf16 for r < count, x_r = x + r * stride; columns
// >= width and rows [count, kTile) are 0.
MESHTRAIN_AVX512_BF16 void round_rows(uint32_t* rows, int64_t pairs, const float* x, int64_t stride,
                                      int64_t count, int64_t width) {
  for (int64_t r = 0; r < kTile; ++r) {
    uint32_t* out = rows + r * pairs;
    if (r >= count) {
      std::fill_n(out, pairs, 0u);
      continue;
    }
    const float* source = x + r * stride;
    for (int64_t c = 0; c < width; c += 32) {
      const __m512 low = _mm512_maskz_loadu_ps(first_lanes(width - c), source + c);
      const __m512 high = _mm512_maskz_loadu_ps(first_lanes(width - c - 16), source + c + 16);
      const __m512bh both = _mm512_cvtne2ps_pbh(high, low);  // columns c .. c + 31 in order
      _mm512_mask_storeu_epi32(out + c / 2, first_lanes(pairs - c / 2),
                               reinterpret_cast<const __m512i&>(both));
    }
  }
}

// The permutation of the 32 words of _mm512_cvtne2ps_pbh(b, a) (a's 16 values, then b's) that interleaves
// them: word e of the result takes word e / 2 of a (even e) or of b (odd e).
alignas(64) constexpr uint16_t kZipPairs[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// interleaved[t * width_stride + c] = (x_2t[c], x_2t+1[c]) rounded to bf16 for t < kTile / 2 and c <
// width_stride (a multiple of 16), x_r = x + r * stride; rows >= count and columns >= width are 0.
MESHTRAIN_AVX512_BF16 void interleave_rows(uint32_t* interleaved, int64_t width_stride, const float* x,
                                           int64_t stride, int64_t count, int64_t width) {
  const __m512i zip = _mm512_load_si512(kZipPairs);
  for (int64_t t = 0; t < kTile / 2; ++t) {
    uint32_t* out = interleaved + t * width_stride;
    const int64_t first = 2 * t, second = 2 * t + 1;
    if (first >= count) {
      std::fill_n(out, width_stride, 0u);
      continue;
    }
    for (int64_t c = 0; c < width_stride; c += 16) {
      const __mmask16 mask = first_lanes(width - c);
      const __m512 a = _mm512_maskz_loadu_ps(mask, x + first * stride + c);
      const __m512 b =
          second < count ? _mm512_maskz_loadu_ps(mask, x + second * stride + c) : _mm512_setzero_ps();
      const __m512bh both = _mm512_cvtne2ps_pbh(b, a);  // a's 16 values, then b's
      _mm512_storeu_si512(out + c, _mm512_permutexvar_epi16(zip, reinterpret_cast<const __m512i&>(both)));
    }
  }
}

// r[i] becomes column i of the 16 x 16 floats r[0..15] (rows), in registers: for block sizes b = 8, 4, 2,
// 1, the off-diagonal b x b blocks of every 2b x 2b block swap. (permutex2var: the unpack and shuffle
// intrinsics trip GCC 12's -Wuninitialized under a target attribute.)
struct TransposeIndices {
  // Stage s (b = 8 >> s): the new top row's and bottom row's lanes from (top, bottom), 16 + lane for the
  // bottom one.
  alignas(64) int32_t low[4][16];
  alignas(64) int32_t high[4][16];
};

constexpr TransposeIndices transpose_indices() {
  TransposeIndices indices{};
  for (int stage = 0; stage < 4; ++stage) {
    const int b = 8 >> stage;
    for (int c = 0; c < 16; ++c) {
      indices.low[stage][c] = (c & b) != 0 ? 16 + c - b : c;
      indices.high[stage][c] = (c & b) != 0 ? 16 + c : c + b;
    }
  }
  return indices;
}

alignas(64) constexpr TransposeIndices kTransposeIndices = transpose_indices();

MESHTRAIN_AVX512_BF16 inline void transpose_16x16(__m512* r) {
  for (int stage = 0; stage < 4; ++stage) {
    const int b = 8 >> stage;
    const __m512i low_index = _mm512_load_si512(kTransposeIndices.low[stage]);
    const __m512i high_index = _mm512_load_si512(kTransposeIndices.high[stage]);
    for (int i = 0; i < 16; ++i) {
      if ((i & b) != 0) continue;
      const __m512 top = r[i], bottom = r[i + b];
      r[i] = _mm512_permutex2var_ps(top, low_index, bottom);
      r[i + b] = _mm512_permutex2var_ps(top, high_index, bottom);
    }
  }
}

// r[i] = x[i * stride + c] for c < 16 of the 16 x 16 block at x, 0 for i >= rows or c >= cols.
MESHTRAIN_AVX512_BF16 inline void load_block(__m512* r, const float* x, int64_t stride, int64_t rows,
                                             int64_t cols) {
  const __mmask16 mask = first_lanes(cols);
  for (int64_t i = 0; i < 16; ++i)
    r[i] = i < rows ? _mm512_maskz_loadu_ps(mask, x + i * stride) : _mm512_setzero_ps();
}

// lanes[p * kTile + r] = rows[r * pairs + p]: the packed rows of a tile, one token per lane. The pairs are
// moved as 32-bit lanes of float vectors (loads, permutes and stores keep every bit).
MESHTRAIN_AVX512_BF16 void lanes_from_rows(uint32_t* lanes, const uint32_t* rows, int64_t pairs) {
  for (int64_t r0 = 0; r0 < kTile; r0 += 16) {
    for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
      __m512 block[16];
      load_block(block, reinterpret_cast<const float*>(rows + r0 * pairs + p0), pairs, 16, pairs - p0);
      transpose_16x16(block);
      for (int64_t p = 0; p < std::min<int64_t>(16, pairs - p0); ++p)
        _mm512_storeu_ps(lanes + (p0 + p) * kTile + r0, block[p]);
    }
  }
}

// to[c * kTile + i] = x_i[c] (x_i = x + i * stride) for c < to_rows and i < kTile (to_rows a multiple of
// 16): token rows [count] of width `cols` transposed into [to_rows][kTile], 0 beyond them.
MESHTRAIN_AVX512_BF16 void transpose_tokens(float* to, int64_t to_rows, const float* x, int64_t stride,
                                            int64_t count, int64_t cols) {
  for (int64_t i0 = 0; i0 < kTile; i0 += 16) {
    for (int64_t c0 = 0; c0 < to_rows; c0 += 16) {
      __m512 r[16];
      load_block(r, x + i0 * stride + c0, stride, count - i0, cols - c0);
      transpose_16x16(r);
      for (int64_t c = 0; c < 16; ++c) _mm512_storeu_ps(to + (c0 + c) * kTile + i0, r[c]);
    }
  }
}

// y_i[c] = scale_i * from[c * kTile + i] (y_i = y + i * stride; scale_i = scale[i], or 1 without scale) for
// i < count and c < cols: transpose_tokens undone, from [cols rounded up to 16][kTile].
MESHTRAIN_AVX512_BF16 void untranspose_tokens(float* y, int64_t stride, int64_t count, int64_t cols,
                                              const float* from, const float* scale) {
  for (int64_t i0 = 0; i0 < count; i0 += 16) {
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      __m512 r[16];
      load_block(r, from + c0 * kTile + i0, kTile, 16, 16);
      transpose_16x16(r);
      const __mmask16 mask = first_lanes(cols - c0);
      for (int64_t i = 0; i < std::min<int64_t>(16, count - i0); ++i) {
        const __m512 row = scale == nullptr ? r[i] : _mm512_mul_ps(r[i], _mm512_set1_ps(scale[i0 + i]));
        _mm512_mask_storeu_ps(y + (i0 + i) * stride + c0, mask, row);
      }
    }
  }
}

// R rows x V vectors of bf16_product: R x V accumulators in registers; `last` masks the lanes of vector V
// - 1.
template <int R, int V>
MESHTRAIN_AVX512_BF16 void bf16_block(float* out, int64_t out_stride, const uint32_t* a, int64_t a_row,
                                      int64_t a_pair, const uint32_t* b, int64_t b_stride, int64_t pairs,
                                      bool accumulate, __mmask16 last) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __mmask16 mask = v == V - 1 ? last : static_cast<__mmask16>(0xffff);
      acc[r][v] =
          accumulate ? _mm512_maskz_loadu_ps(mask, out + r * out_stride + v * 16) : _mm512_setzero_ps();
    }
  }
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i columns[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      columns[v] = _mm512_loadu_si512(b + p * b_stride + v * 16);
      __asm__("" : "+v"(columns[v]));  // keep in a register (see pin_register)
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i pair = _mm512_set1_epi32(static_cast<int32_t>(a[r * a_row + p * a_pair]));
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], reinterpret_cast<const __m512bh&>(pair),
                                     reinterpret_cast<const __m512bh&>(columns[v]));
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __mmask16 mask = v == V - 1 ? last : static_cast<__mmask16>(0xffff);
      _mm512_mask_storeu_ps(out + r * out_stride + v * 16, mask, acc[r][v]);
    }
  }
}

// Rows [r0, r0 + R) of bf16_product, all lanes.
template <int R>
MESHTRAIN_AVX512_BF16 void bf16_rows(float* out, int64_t out_stride, int64_t lanes, const uint32_t* a,
                                     int64_t a_row, int64_t a_pair, const uint32_t* b, int64_t b_stride,
                                     int64_t pairs, bool accumulate) {
  const int64_t vectors = (lanes + 15) / 16;
  const __mmask16 tail = first_lanes(lanes - (vectors - 1) * 16);
  int64_t v0 = 0;
  for (; v0 + 4 <= vectors; v0 += 4) {
    bf16_block<R, 4>(out + v0 * 16, out_stride, a, a_row, a_pair, b + v0 * 16, b_stride, pairs, accumulate,
                     v0 + 4 == vectors ? tail : static_cast<__mmask16>(0xffff));
  }
  for (; v0 < vectors; ++v0) {
    bf16_block<R, 1>(out + v0 * 16, out_stride, a, a_row, a_pair, b + v0 * 16, b_stride, pairs, accumulate,
                     v0 + 1 == vectors ? tail : static_cast<__mmask16>(0xffff));
  }
}

// out[r * out_stride + lane] (= or, with accumulate, +=) sum_{p < pairs} a(r, p) . b[p * b_stride + lane]
// for r < rows and lane < lanes, a(r, p) = a[r * a_row + p * a_pair]: each term two bf16 products added in
// float32 (vdpbf16ps), p ascending.
MESHTRAIN_AVX512_BF16 void bf16_product(float* out, int64_t out_stride, int64_t rows, int64_t lanes,
                                        const uint32_t* a, int64_t a_row, int64_t a_pair, const uint32_t* b,
                                        int64_t b_stride, int64_t pairs, bool accumulate) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    bf16_rows<4>(out + r * out_stride, out_stride, lanes, a + r * a_row, a_row, a_pair, b, b_stride, pairs,
                 accumulate);
  }
  for (; r < rows; ++r) {
    bf16_rows<1>(out + r * out_stride, out_stride, lanes, a + r * a_row, a_row, a_pair, b, b_stride, pairs,
                 accumulate);
  }
}

// Per-thread buffers of the bf16 kernel, sized by the head width (heap: any d works). Packed tiles are
// tagged with their source rows so that a tile used by many pairs is packed once.
struct Bf16Buffers {
  explicit Bf16Buffers(const BufferShape& shape)
      : pairs((shape.d + 1) / 2),
        width(round_up(shape.d, 16)),
        token_rows(static_cast<size_t>(4 * kTile * pairs)),
        token_lanes(static_cast<size_t>(4 * kTile * pairs)),
        interleaved(static_cast<size_t>(4 * kTile / 2 * width)),
        tile_pairs(static_cast<size_t>(2 * kTile / 2 * kTile)),
        key_gradients(static_cast<size_t>(2 * width * kTile)) {}
  static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
  // [kTile][pairs] rows / [pairs][kTile] lanes of operand `which` (0 q, 1 dout, 2 k, 3 v).
  uint32_t* rows(int which) { return token_rows.data() + which * kTile * pairs; }
  uint32_t* lanes(int which) { return token_lanes.data() + which * kTile * pairs; }
  // [kTile / 2][width] interleaved operand `which` (0 q, 1 dout, 2 k, 3 v).
  uint32_t* zipped(int which) { return interleaved.data() + which * kTile / 2 * width; }
  // [kTile / 2][kTile] interleaved rows of P (0) or dS (1), or [kTile][kTile / 2] rows of dS (1).
  uint32_t* tile(int which) { return tile_pairs.data() + which * kTile / 2 * kTile; }

  int64_t pairs, width;
  std::vector<uint32_t> token_rows, token_lanes, interleaved, tile_pairs;
  std::vector<float> key_gradients;   // dk^T, dv^T [width][kTile] of the key tile in progress
  const float* packed_lanes[4] = {};  // source rows of lanes(which)
  int64_t packed_count[4] = {};
  const float* packed_keys = nullptr;  // source rows of zipped(2) (k interleaved)
  int64_t packed_key_count = 0;
  // Forward and backward state as in the float32 kernel.
  PairLanes lanes_state;
  SoftmaxRows softmax;
  alignas(64) float probs[kTile * kTile];
  alignas(64) float dscores[kTile * kTile];
};

// lanes(which) = token rows [count] of x (stride `stride`) one per lane, unless it already holds them.
void pack_lanes(Bf16Buffers& t, int which, const float* x, int64_t stride, int64_t count, int64_t d) {
  if (t.packed_lanes[which] == x && t.packed_count[which] == count) return;
  round_rows(t.rows(which), t.pairs, x, stride, count, d);
  lanes_from_rows(t.lanes(which), t.rows(which), t.pairs);
  t.packed_lanes[which] = x;
  t.packed_count[which] = count;
}

// zipped(2) = k rows [count] interleaved, unless it already holds them.
void pack_keys_zipped(Bf16Buffers& t, const float* k, int64_t stride, int64_t count, int64_t d) {
  if (t.packed_keys == k && t.packed_key_count == count) return;
  interleave_rows(t.zipped(2), t.width, k, stride, count, d);
  t.packed_keys = k;
  t.packed_key_count = count;
}

// The bf16 forward of query rows [i0, i0 + rows) of one head: forward_query_tile with bf16 products.
void forward_query_tile_bf16(Bf16Buffers& t, float* out, float* lse, const HeadView& view, int64_t i0,
                             int64_t rows, float scale, bool accumulate) {
  const int64_t d = view.d, pairs = t.pairs;
  start_query_rows(t.softmax, out, lse, view, i0, rows, accumulate);
  lane_tokens(t.lanes_state.tokens, view.q_positions, view.q_segment_ids, i0, rows,
              std::numeric_limits<int32_t>::min());
  pack_lanes(t, 0, view.q + i0 * view.q_stride, view.q_stride, rows, d);
  const TileBounds query_bounds = tile_bounds(view.q_positions, view.q_segment_ids, i0, i0 + rows);
  for (int64_t j0 = 0; j0 < view.Skv; j0 += kTile) {
    const int64_t cols = std::min(view.Skv - j0, kTile);
    const TileBounds key_bounds = tile_bounds(view.kv_positions, view.kv_segment_ids, j0, j0 + cols);
    if (fully_masked(query_bounds, key_bounds)) continue;
    // S^T [cols][kTile] = k_rows . q_lanes.
    round_rows(t.rows(2), pairs, view.k + j0 * view.kv_stride, view.kv_stride, cols, d);
    bf16_product(t.probs, kTile, cols, kTile, t.rows(2), pairs, 1, t.lanes(0), kTile, pairs, false);
    const bool masked = !fully_visible(query_bounds, key_bounds);
    scale_and_mask(t.probs, view.kv_positions, view.kv_segment_ids, t.lanes_state.tokens, j0, cols, true,
                   masked, scale);
    online_softmax_tile(t.softmax, t.probs, cols, out, view, i0, rows);
    // out[i][c] += sum_j P^T[j][i] v[j][c]: a(i, t) = (P^T[2t][i], P^T[2t + 1][i]).
    interleave_rows(t.tile(0), kTile, t.probs, kTile, cols, kTile);
    interleave_rows(t.zipped(3), t.width, view.v + j0 * view.kv_stride, view.kv_stride, cols, d);
    bf16_product(out + i0 * view.q_stride, view.q_stride, rows, d, t.tile(0), 1, kTile, t.zipped(3), t.width,
                 (cols + 1) / 2, true);
  }
  finish_query_rows(t.softmax, out, lse, view, i0, rows);
}

// The bf16 backward of one tile pair: backward_pair with bf16 products. dk, dv go to the key tile's
// accumulators (begin_key_tile / end_key_tile), so only the key-tile-packed layout writes them.
void backward_pair_bf16(Bf16Buffers& t, const HeadView& view, const GradView& grad, int64_t i0, int64_t rows,
                        int64_t j0, int64_t cols, bool masked, bool keys_are_rows, float scale) {
  const int64_t d = view.d, qs = view.q_stride, kvs = view.kv_stride, pairs = t.pairs;
  const float* q_rows = view.q + i0 * qs;
  const float* dout_rows = grad.dout + i0 * qs;
  const float* k_rows = view.k + j0 * kvs;
  const float* v_rows = view.v + j0 * kvs;
  if (keys_are_rows) {  // S^T = k_rows . q_lanes, dP^T = v_rows . dout_lanes
    pack_lanes(t, 0, q_rows, qs, rows, d);
    pack_lanes(t, 1, dout_rows, qs, rows, d);
    round_rows(t.rows(2), pairs, k_rows, kvs, cols, d);
    round_rows(t.rows(3), pairs, v_rows, kvs, cols, d);
    bf16_product(t.probs, kTile, cols, kTile, t.rows(2), pairs, 1, t.lanes(0), kTile, pairs, false);
    bf16_product(t.dscores, kTile, cols, kTile, t.rows(3), pairs, 1, t.lanes(1), kTile, pairs, false);
  } else {  // S = q_rows . k_lanes, dP = dout_rows . v_lanes
    pack_lanes(t, 2, k_rows, kvs, cols, d);
    pack_lanes(t, 3, v_rows, kvs, cols, d);
    round_rows(t.rows(0), pairs, q_rows, qs, rows, d);
    round_rows(t.rows(1), pairs, dout_rows, qs, rows, d);
    bf16_product(t.probs, kTile, rows, kTile, t.rows(0), pairs, 1, t.lanes(2), kTile, pairs, false);
    bf16_product(t.dscores, kTile, rows, kTile, t.rows(1), pairs, 1, t.lanes(3), kTile, pairs, false);
  }
  probabilities_and_score_gradients(t.probs, t.dscores, t.lanes_state, view, grad, i0, rows, j0, cols, masked,
                                    keys_are_rows, scale);
  const int64_t key_pairs = (cols + 1) / 2, query_pairs = (rows + 1) / 2;
  if (grad.dq != nullptr) {  // dq[i][c] += sum_j dS[i][j] k[j][c]
    pack_keys_zipped(t, k_rows, kvs, cols, d);
    if (keys_are_rows) {
      interleave_rows(t.tile(1), kTile, t.dscores, kTile, cols, kTile);
      bf16_product(grad.dq + i0 * grad.dq_stride, grad.dq_stride, rows, d, t.tile(1), 1, kTile, t.zipped(2),
                   t.width, key_pairs, true);
    } else {
      round_rows(t.tile(1), kTile / 2, t.dscores, kTile, rows, kTile);
      bf16_product(grad.dq + i0 * grad.dq_stride, grad.dq_stride, rows, d, t.tile(1), kTile / 2, 1,
                   t.zipped(2), t.width, key_pairs, true);
    }
  }
  if (grad.dk != nullptr) {  // dv^T[c][j] += sum_i dout[i][c] P[i][j], dk^T[c][j] += sum_i q[i][c] dS[i][j]
    float* dk_t = t.key_gradients.data();
    float* dv_t = dk_t + t.width * kTile;
    interleave_rows(t.zipped(1), t.width, dout_rows, qs, rows, d);
    interleave_rows(t.tile(0), kTile, t.probs, kTile, rows, kTile);
    bf16_product(dv_t, kTile, d, kTile, t.zipped(1), 1, t.width, t.tile(0), kTile, query_pairs, true);
    interleave_rows(t.zipped(0), t.width, q_rows, qs, rows, d);
    interleave_rows(t.tile(1), kTile, t.dscores, kTile, rows, kTile);
    bf16_product(dk_t, kTile, d, kTile, t.zipped(0), 1, t.width, t.tile(1), kTile, query_pairs, true);
  }
}

// Accumulators dk_t, dv_t [width][kTile] (width = d rounded up to 16) = dk, dv rows [cols] (stride
// `stride`) transposed when accumulating, else 0.
void begin_transposed_key_gradients(float* dk_t, float* dv_t, int64_t width, const float* dk, const float* dv,
                                    int64_t stride, int64_t cols, int64_t d, bool accumulate) {
  if (!accumulate) {
    std::fill_n(dk_t, width * kTile, 0.0f);
    std::fill_n(dv_t, width * kTile, 0.0f);
    return;
  }
  transpose_tokens(dk_t, width, dk, stride, cols, d);
  transpose_tokens(dv_t, width, dv, stride, cols, d);
}

// dk, dv rows [cols] = the accumulators transposed.
void end_transposed_key_gradients(const float* dk_t, const float* dv_t, float* dk, float* dv, int64_t stride,
                                  int64_t cols, int64_t d) {
  untranspose_tokens(dk, stride, cols, d, dk_t, nullptr);
  untranspose_tokens(dv, stride, cols, d, dv_t, nullptr);
}

// The bf16 kernel as the schedules below use it: dk / dv of a key tile accumulate transposed in the
// thread's buffers from begin_key_tile to end_key_tile (accumulators [width][kTile], see above).
struct Bf16Kernel {
  using Forward = Bf16Buffers;
  using Backward = Bf16Buffers;
  // The engine refuses dtype=bfloat16 without AVX512-BF16 before this is reached.
  static void check_cpu() {
    MT_CHECK(cpu_features().avx512_bf16, "bf16 attention needs a CPU with AVX512-BF16 (this one: " +
                                             cpu_features().describe() + "): run with dtype=float32");
  }
  static void forward_tile(Bf16Buffers& t, float* out, float* lse, const HeadView& view, int64_t i0,
                           int64_t rows, float scale, bool accumulate) {
    forward_query_tile_bf16(t, out, lse, view, i0, rows, scale, accumulate);
  }
  static void pair(Bf16Buffers& t, const HeadView& view, const GradView& grad, int64_t i0, int64_t rows,
                   int64_t j0, int64_t cols, bool masked, bool keys_are_rows, float scale) {
    backward_pair_bf16(t, view, grad, i0, rows, j0, cols, masked, keys_are_rows, scale);
  }
  static void begin_key_tile(Bf16Buffers& t, float* dk, float* dv, int64_t stride, int64_t cols, int64_t d,
                             bool accumulate) {
    float* dk_t = t.key_gradients.data();
    begin_transposed_key_gradients(dk_t, dk_t + t.width * kTile, t.width, dk, dv, stride, cols, d,
                                   accumulate);
  }
  static void end_key_tile(Bf16Buffers& t, float* dk, float* dv, int64_t stride, int64_t cols, int64_t d) {
    const float* dk_t = t.key_gradients.data();
    end_transposed_key_gradients(dk_t, dk_t + t.width * kTile, dk, dv, stride, cols, d);
  }
  static int64_t dq_row_floats(int64_t d) { return d; }
};

// ---- bf16 products on AMX tiles ----
//
// The AMX kernel runs the same tiles, masks, softmax, backward formulas and schedules with each product on
// tile registers: _tile_dpbf16ps adds A [16 rows][16 pairs] times B [16 pairs][16 columns] (a pair = two
// bf16 in one uint32, the lower half the even index of the reduction) to C [16][16] float32. Every product
// below is an amx_product: C [m_tiles * 16][n_tiles * 16] (+)= A [.][ksteps * 16 pairs] B, with A tiles
// read from row-major bf16 and B tiles from "pair rows" (row p holds the pairs p of every column).
//
// Layouts, chosen so that no product needs a tile transposed per pair (transposing a 64 x 64 tile is work of
// the order of its products at d = 64): with Q, K, V, dO the token rows of one head, P and dS [queries][keys]
// of a tile pair,
//   forward   S^T [keys][queries] = K . Q^T        A: K rows bf16, B: Q^T pair rows (d pairs x queries);
//             out^T [d][queries] += V^T . P^T      A: V^T bf16 (d x keys), B: P^T pair rows (key pairs);
//             so the softmax runs on key rows x query lanes as in the float32 forward, and out^T (one
//             accumulator per query tile in the thread's buffers, two key tiles per product, one held
//             back) is written to out when the tile ends;
//   backward  S = Q . K^T, dP = dO . V^T         A: Q, dO rows, B: K^T, V^T pair rows;
//             dq += dS . K                        A: dS rows, B: K pair rows (key pairs x d), accumulated
//                                                 on the tiles straight from the thread's dq copy;
//             dv^T += dO^T . P, dk^T += Q^T . dS  A: dO^T, Q^T bf16 (d x queries), B: P, dS pair rows (query
//                                                 pairs), into per-key-tile accumulators as in the bf16
//                                                 kernel, two tile pairs per product (one held back).
// The layout never depends on the schedule (the keys_are_rows hint of the float32 kernel is ignored), so
// the owner and split schedules compute each partial product identically and add them in the same order:
// results are bitwise independent of the thread count. Token operands are packed (rounded, zero-padded to
// the tile and to 16 or 32 head-width columns) once per 64-token tile per thread and kept for the whole call
// (memory linear in S: the key tiles of the kv head being worked on, and in the backward the query tiles
// of its group's heads), instead of once per tile pair.
// Tile registers: C 0-3, A 4-5, B 6-7, all 16 rows x 64 bytes (palette 1), configured when a thread's
// buffers are made and released when they go.
#define MESHTRAIN_AMX \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// C (+)= A B over whole tiles: A tile (mi, k) at a + mi * 16 * a_stride + k * 64 bytes, B tile (k, nj) at
// b + k * 16 * b_stride + nj * 64, C tile (mi, nj) at c + mi * 16 * c_stride + nj * 64 (strides in bytes).
// With a2 / b2, the reduction goes on over ksteps2 more steps read from them (same strides): C (+)= A B + A2
// B2 with C kept on the tile registers in between, the same instructions in the same order as two products.
struct AmxProduct {
  float* c;
  int64_t c_stride;
  const void* a;
  int64_t a_stride;
  const void* b;
  int64_t b_stride;
  int64_t m_tiles, n_tiles, ksteps;
  bool accumulate;  // C starts from memory, else from 0
  const void* a2 = nullptr;
  const void* b2 = nullptr;
  int64_t ksteps2 = 0;
};

// C tiles [mi, mi + MR) x [nj, nj + NR) of an AmxProduct, the reduction in ascending k.
template <int MR, int NR>
MESHTRAIN_AMX void amx_block(const AmxProduct& p, int64_t mi, int64_t nj) {
  char* const c = reinterpret_cast<char*>(p.c) + mi * 16 * p.c_stride + nj * 64;
  const int64_t c_down = 16 * p.c_stride, a_down = 16 * p.a_stride, b_down = 16 * p.b_stride;
  if (p.accumulate) {
    _tile_loadd(0, c, p.c_stride);
    if constexpr (NR > 1) _tile_loadd(1, c + 64, p.c_stride);
    if constexpr (MR > 1) _tile_loadd(2, c + c_down, p.c_stride);
    if constexpr (MR > 1 && NR > 1) _tile_loadd(3, c + c_down + 64, p.c_stride);
  } else {
    _tile_zero(0);
    if constexpr (NR > 1) _tile_zero(1);
    if constexpr (MR > 1) _tile_zero(2);
    if constexpr (MR > 1 && NR > 1) _tile_zero(3);
  }
  // Each load just before the first product that reads it: the next step's A0 / B0 loads then overlap the
  // products of A1 (a tile register is free once the products reading it are done). The lambda names the
  // target itself: clang does not pass the enclosing function's target on to it (GCC does).
  const auto reduce = [&](const void* a_base, const void* b_base, int64_t ksteps) MESHTRAIN_AMX {
    const char* const a = static_cast<const char*>(a_base) + mi * 16 * p.a_stride;
    const char* const b = static_cast<const char*>(b_base) + nj * 64;
    for (int64_t k = 0; k < ksteps; ++k) {
      _tile_loadd(4, a + k * 64, p.a_stride);
      _tile_loadd(6, b + k * b_down, p.b_stride);
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (NR > 1) {
        _tile_loadd(7, b + k * b_down + 64, p.b_stride);
        _tile_dpbf16ps(1, 4, 7);
      }
      if constexpr (MR > 1) {
        _tile_loadd(5, a + a_down + k * 64, p.a_stride);
        _tile_dpbf16ps(2, 5, 6);
      }
      if constexpr (MR > 1 && NR > 1) _tile_dpbf16ps(3, 5, 7);
    }
  };
  reduce(p.a, p.b, p.ksteps);
  if (p.ksteps2 > 0) reduce(p.a2, p.b2, p.ksteps2);
  _tile_stored(0, c, p.c_stride);
  if constexpr (NR > 1) _tile_stored(1, c + 64, p.c_stride);
  if constexpr (MR > 1) _tile_stored(2, c + c_down, p.c_stride);
  if constexpr (MR > 1 && NR > 1) _tile_stored(3, c + c_down + 64, p.c_stride);
}

MESHTRAIN_AMX void amx_product(const AmxProduct& p) {
  int64_t mi = 0;
  for (; mi + 2 <= p.m_tiles; mi += 2) {
    int64_t nj = 0;
    for (; nj + 2 <= p.n_tiles; nj += 2) amx_block<2, 2>(p, mi, nj);
    if (nj < p.n_tiles) amx_block<2, 1>(p, mi, nj);
  }
  if (mi < p.m_tiles) {
    int64_t nj = 0;
    for (; nj + 2 <= p.n_tiles; nj += 2) amx_block<1, 2>(p, mi, nj);
    if (nj < p.n_tiles) amx_block<1, 1>(p, mi, nj);
  }
}

// Palette 1 with the eight tiles 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

MESHTRAIN_AMX void configure_tiles() {
  static const TileConfig config;
  _tile_loadconfig(&config);
}

MESHTRAIN_AMX void release_tiles() {
  _tile_release();
}

// columns[c * kTile + r] = bf16 of x_r[c] for c < width_rows (a multiple of 16) and r < kTile, x_r = x + r *
// stride: a token tile transposed (the A operand of the products that reduce over tokens); rows >= count
// and columns >= d are 0. Rounded to nearest even, as round_rows does.
MESHTRAIN_AVX512_BF16 void pack_columns(uint16_t* columns, int64_t width_rows, const float* x, int64_t stride,
                                        int64_t count, int64_t d) {
  for (int64_t r0 = 0; r0 < kTile; r0 += 16) {
    for (int64_t c0 = 0; c0 < width_rows; c0 += 16) {
      __m512 r[16];
      load_block(r, x + r0 * stride + c0, stride, count - r0, d - c0);
      transpose_16x16(r);
      for (int64_t c = 0; c < 16; ++c) {
        const __m256bh rounded = _mm512_cvtneps_pbh(r[c]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(columns + (c0 + c) * kTile + r0),
                            reinterpret_cast<const __m256i&>(rounded));
      }
    }
  }
}

// Packed forms of token tiles, one slot per tile, tagged with the source rows they hold so that a thread
// packs each tile once per call. Which of the four forms a set keeps is fixed by the sizes given (0: not
// kept); every form is zero beyond the tile's tokens and the head width.
struct PackedTokenTiles {
  // rows: [kTile][pairs] bf16 rows (pairs = d rounded up to 32, in pairs); pair_rows: their transpose
  // [pairs][kTile]; columns: [width][kTile] bf16, the tile transposed (width = d rounded up to 16);
  // token_pairs: [kTile / 2][width], rows 2t and 2t + 1 interleaved.
  PackedTokenTiles(int64_t slots, int64_t pair_count, int64_t width_rows, bool keep_rows, bool keep_pair_rows,
                   bool keep_columns, bool keep_token_pairs)
      : pairs(pair_count),
        width(width_rows),
        tags(static_cast<size_t>(slots), nullptr),
        counts(static_cast<size_t>(slots), -1),
        rows_size(keep_rows ? kTile * pairs : 0),
        pair_rows_size(keep_pair_rows ? kTile * pairs : 0),
        columns_size(keep_columns ? kTile * width : 0),
        token_pairs_size(keep_token_pairs ? kTile / 2 * width : 0),
        rows_data(new uint32_t[static_cast<size_t>(slots * rows_size)]),
        pair_rows_data(new uint32_t[static_cast<size_t>(slots * pair_rows_size)]),
        columns_data(new uint16_t[static_cast<size_t>(slots * columns_size)]),
        token_pairs_data(new uint32_t[static_cast<size_t>(slots * token_pairs_size)]) {}

  uint32_t* rows(int64_t slot) { return rows_data.get() + slot * rows_size; }
  uint32_t* pair_rows(int64_t slot) { return pair_rows_data.get() + slot * pair_rows_size; }
  uint16_t* columns(int64_t slot) { return columns_data.get() + slot * columns_size; }
  uint32_t* token_pairs(int64_t slot) { return token_pairs_data.get() + slot * token_pairs_size; }

  // Packs token rows [count] of x (stride `stride`, head width d) into `slot` unless it holds them.
  void pack(int64_t slot, const float* x, int64_t stride, int64_t count, int64_t d) {
    const auto index = static_cast<size_t>(slot);
    if (tags[index] == x && counts[index] == count) return;
    if (rows_size > 0 || pair_rows_size > 0) {
      uint32_t* target = rows_size > 0 ? rows(slot) : scratch_rows();
      round_rows(target, pairs, x, stride, count, d);
      if (pair_rows_size > 0) lanes_from_rows(pair_rows(slot), target, pairs);
    }
    if (columns_size > 0) pack_columns(columns(slot), width, x, stride, count, d);
    if (token_pairs_size > 0) interleave_rows(token_pairs(slot), width, x, stride, count, d);
    tags[index] = x;
    counts[index] = count;
  }

  int64_t pairs, width;
  std::vector<const float*> tags;
  std::vector<int64_t> counts;
  int64_t rows_size, pair_rows_size, columns_size, token_pairs_size;

 private:
  uint32_t* scratch_rows() {
    if (!scratch) scratch.reset(new uint32_t[static_cast<size_t>(kTile * pairs)]);
    return scratch.get();
  }
  std::unique_ptr<uint32_t[]> rows_data, pair_rows_data;
  std::unique_ptr<uint16_t[]> columns_data;
  std::unique_ptr<uint32_t[]> token_pairs_data, scratch;
};

// Per-thread buffers of the AMX kernel (heap, sized by the head width and the token counts). Forward: key
// tiles keep K rows and V columns; the query tile its pair rows. Backward: key tiles keep K and V pair
// rows and K token pairs; query tiles (of every head of the group) Q and dO rows and columns.
struct AmxBuffers {
  static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
  static int64_t tiles(int64_t count) { return (count + kTile - 1) / kTile; }
  AmxBuffers(const BufferShape& shape, bool backward)
      : pairs(round_up(shape.d, 32) / 2),
        width(round_up(shape.d, 16)),
        keys(tiles(shape.Skv), pairs, width, !backward, backward, false, backward),
        values(tiles(shape.Skv), pairs, width, false, backward, !backward, false),
        queries(backward ? shape.group * tiles(shape.Sq) : 1, pairs, width, backward, !backward, backward,
                false),
        douts(backward ? shape.group * tiles(shape.Sq) : 0, pairs, width, backward, false, backward, false),
        accumulators(static_cast<size_t>(2 * width * kTile)) {
    configure_tiles();
  }
  ~AmxBuffers() { release_tiles(); }
  AmxBuffers(const AmxBuffers&) = delete;
  AmxBuffers& operator=(const AmxBuffers&) = delete;

  int64_t pairs, width;
  PackedTokenTiles keys, values, queries, douts;
  // Forward: out^T [width][kTile] of the query tile. Backward: dk^T, dv^T [width][kTile] of the key tile.
  std::vector<float> accumulators;
  PairLanes lanes_state;
  SoftmaxRows softmax;
  alignas(64) float probs[kTile * kTile];
  alignas(64) float dscores[kTile * kTile];
  // The backward's dk^T / dv^T products of one tile pair are held back and run with the next pair's as one
  // product over 128 queries (backward_pair_amx), and so is the forward's out^T product of one key tile with
  // the next's over 128 keys (forward_query_tile_amx): the float32 accumulators are loaded and stored half
  // as often. held: whether a pair waits, and its query slot (backward) or key slot (forward).
  bool held = false;
  int64_t held_slot = 0;
  // P (backward) or P^T (forward) pair rows, and dS pair rows: [0] of a held-back pair, [1] of the pair
  // computed while one is held; p_pairs() / ds_pairs() are those of the pair being computed.
  alignas(64) uint32_t p_pairs_data[2][kTile * kTile / 2];
  alignas(64) uint32_t ds_pairs_data[2][kTile * kTile / 2];
  uint32_t* p_pairs() { return p_pairs_data[held ? 1 : 0]; }
  uint32_t* ds_pairs() { return ds_pairs_data[held ? 1 : 0]; }
  alignas(64) uint32_t ds_rows[kTile * kTile / 2];  // dS rows bf16 [kTile][kTile / 2 pairs]
};

// The AMX forward's online softmax of one key tile, in base 2: S^T [cols][kTile] (scaled by scale *
// log2(e), masked) with its per-lane maxima in softmax.tile_max becomes P^T = 2^(s - running max), written
// straight as the pair rows of the out^T product (key rows 2t and 2t + 1 interleaved, bf16, zero beyond
// cols), in one pass over the scores. A running max moves only when the tile's exceeds it by more than
// kMaxSlack (the first visible key always moves it), so P^T stays below 2^kMaxSlack and most tiles leave
// every max where it was: then the accumulated out^T needs no rescaling, and the function returns false.
// Otherwise alpha = 2^(old max - new max) per lane (1 where the max stayed) and it returns true. The
// running sums move on as in softmax_tile_statistics.
constexpr float kMaxSlack = 8.0f;

MESHTRAIN_AMX bool amx_softmax_tile(AmxBuffers& t, int64_t cols) {
  constexpr int64_t kVectors = kTile / 16;
  SoftmaxRows& softmax = t.softmax;
  const __m512 negative_infinity = _mm512_set1_ps(kNegativeInfinity), slack = _mm512_set1_ps(kMaxSlack);
  __m512 shift[kVectors], sum[kVectors];
  bool moved_any = false;
  for (int64_t v = 0; v < kVectors; ++v) {
    const __m512 old_max = _mm512_load_ps(softmax.row_max + 16 * v);
    const __m512 tile_max = _mm512_load_ps(softmax.tile_max + 16 * v);
    const __mmask16 moved = _mm512_cmp_ps_mask(tile_max, _mm512_add_ps(old_max, slack), _CMP_GT_OQ);
    moved_any = moved_any || moved != 0;
    const __m512 new_max = _mm512_mask_blend_ps(moved, old_max, tile_max);
    // No visible key yet: shift by 0 keeps the sums at 0.
    const __mmask16 none = _mm512_cmp_ps_mask(new_max, negative_infinity, _CMP_EQ_OQ);
    shift[v] = _mm512_mask_blend_ps(none, new_max, _mm512_setzero_ps());
    __m512 alpha = _mm512_sub_ps(old_max, shift[v]);
    exp2_lanes(alpha);  // exactly 1 where the max stayed (or 0 where no key is visible yet)
    _mm512_store_ps(softmax.alpha + 16 * v, alpha);
    _mm512_store_ps(softmax.row_max + 16 * v, new_max);
    sum[v] = _mm512_mul_ps(_mm512_load_ps(softmax.row_sum + 16 * v), alpha);
  }
  const __m512i zip = _mm512_load_si512(kZipPairs);
  for (int64_t j = 0; j < kTile; j += 2) {
    uint32_t* pairs = t.p_pairs() + j / 2 * kTile;
    if (j >= cols) {
      std::fill_n(pairs, kTile, 0u);
      continue;
    }
    const float* first = t.probs + j * kTile;
    const bool has_second = j + 1 < cols;
    for (int64_t v = 0; v < kVectors; ++v) {
      __m512 a = _mm512_sub_ps(_mm512_load_ps(first + 16 * v), shift[v]);
      exp2_lanes(a);
      sum[v] = _mm512_add_ps(sum[v], a);
      __m512 b = _mm512_setzero_ps();
      if (has_second) {
        b = _mm512_sub_ps(_mm512_load_ps(first + kTile + 16 * v), shift[v]);
        exp2_lanes(b);
        sum[v] = _mm512_add_ps(sum[v], b);
      }
      const __m512bh both = _mm512_cvtne2ps_pbh(b, a);  // a's 16 values, then b's
      _mm512_store_si512(pairs + 16 * v,
                         _mm512_permutexvar_epi16(zip, reinterpret_cast<const __m512i&>(both)));
    }
  }
  for (int64_t v = 0; v < kVectors; ++v) _mm512_store_ps(softmax.row_sum + 16 * v, sum[v]);
  return moved_any;
}

// out^T [width][kTile] += V^T P^T of key slot `slot` with P^T pair rows `pairs` (key pairs), and of slot2
// with pairs2 when slot2 >= 0, as one product over both tiles' keys. Nothing is held after.
MESHTRAIN_AMX void add_values_amx(AmxBuffers& t, int64_t slot, const uint32_t* pairs, int64_t slot2,
                                  const uint32_t* pairs2) {
  const bool both = slot2 >= 0;
  amx_product(AmxProduct{t.accumulators.data(), kTile * 4, t.values.columns(slot), kTile * 2, pairs,
                         kTile * 4, t.width / 16, kTile / 16, kTile / 32, true,
                         both ? t.values.columns(slot2) : nullptr, both ? pairs2 : nullptr,
                         both ? kTile / 32 : 0});
  t.held = false;
}

// The AMX forward of query rows [i0, i0 + rows) of one head: forward_query_tile with the products above and
// the softmax in base 2 (amx_softmax_tile); lse is written in base e as every kernel's.
MESHTRAIN_AMX void forward_query_tile_amx(AmxBuffers& t, float* out, float* lse, const HeadView& view,
                                          int64_t i0, int64_t rows, float scale, bool accumulate) {
  const int64_t d = view.d, width = t.width, qs = view.q_stride, kvs = view.kv_stride;
  float* const out_t = t.accumulators.data();  // [width][kTile]: out^T of the tile, unnormalised
  start_softmax_rows(t.softmax, lse, i0, rows, accumulate);
  for (int64_t i = 0; i < rows; ++i) t.softmax.row_max[i] *= kLog2e;  // resumed maxima in base 2
  std::fill_n(out_t, width * kTile, 0.0f);
  for (int64_t i = 0; i < rows; ++i) {  // resume from out (accumulate) where the row has seen keys
    if (t.softmax.row_sum[i] == 0.0f) continue;
    for (int64_t c = 0; c < d; ++c) out_t[c * kTile + i] = out[(i0 + i) * qs + c];
  }
  lane_tokens(t.lanes_state.tokens, view.q_positions, view.q_segment_ids, i0, rows,
              std::numeric_limits<int32_t>::min());
  t.queries.pack(0, view.q + i0 * qs, qs, rows, d);
  const TileBounds query_bounds = tile_bounds(view.q_positions, view.q_segment_ids, i0, i0 + rows);
  for (int64_t j0 = 0; j0 < view.Skv; j0 += kTile) {
    const int64_t cols = std::min(view.Skv - j0, kTile), slot = j0 / kTile;
    const TileBounds key_bounds = tile_bounds(view.kv_positions, view.kv_segment_ids, j0, j0 + cols);
    if (fully_masked(query_bounds, key_bounds)) continue;
    t.keys.pack(slot, view.k + j0 * kvs, kvs, cols, d);
    t.values.pack(slot, view.v + j0 * kvs, kvs, cols, d);
    // S^T [cols][kTile] = K Q^T.
    amx_product(AmxProduct{t.probs, kTile * 4, t.keys.rows(slot), t.pairs * 4, t.queries.pair_rows(0),
                           kTile * 4, (cols + 15) / 16, kTile / 16, t.pairs / 16, false});
    const bool masked = !fully_visible(query_bounds, key_bounds);
    scale_and_mask(t.probs, view.kv_positions, view.kv_segment_ids, t.lanes_state.tokens, j0, cols, true,
                   masked, scale * kLog2e, t.softmax.tile_max);
    uint32_t* const pairs = t.p_pairs();  // where amx_softmax_tile writes P^T: [1] while a tile is held
    if (amx_softmax_tile(t, cols)) {
      // A max moved: what was accumulated under the old maxima, the held tile's P^T included, is rescaled,
      // and this tile's P^T (under the new ones) is added after.
      if (t.held) add_values_amx(t, t.held_slot, t.p_pairs_data[0], -1, nullptr);
      for (int64_t c = 0; c < width; ++c) {
        float* row = out_t + c * kTile;
#pragma omp simd
        for (int64_t lane = 0; lane < kTile; ++lane) row[lane] *= t.softmax.alpha[lane];
      }
      add_values_amx(t, slot, pairs, -1, nullptr);
    } else if (t.held) {
      add_values_amx(t, t.held_slot, t.p_pairs_data[0], slot, pairs);
    } else {
      t.held = true;  // the next tile writes its P^T beside this one's
      t.held_slot = slot;
    }
  }
  if (t.held) add_values_amx(t, t.held_slot, t.p_pairs_data[0], -1, nullptr);
  // As finish_query_rows, from out^T: the row's 1 / sum (0 for a query that saw no key), its lse.
  alignas(64) float inverse[kTile];
  for (int64_t i = 0; i < rows; ++i) {
    const bool seen = t.softmax.row_sum[i] > 0.0f;
    inverse[i] = seen ? 1.0f / t.softmax.row_sum[i] : 0.0f;
    lse[i0 + i] = seen ? t.softmax.row_max[i] * kLn2 + std::log(t.softmax.row_sum[i]) : kNegativeInfinity;
  }
  untranspose_tokens(out + i0 * qs, qs, rows, d, out_t, inverse);
}

// The AMX backward's P = exp(scale s - lse) and dS = scale * P * (dP - row_dot) of query rows [i0, i0 + rows)
// x the key tile, from the raw scores q.k in t.probs and the raw dout.v in t.dscores (query rows x key
// lanes), written straight as the bf16 operands the products read: with want_dq, t.ds_rows (dS rows); with
// want_dkdv, t.p_pairs() and t.ds_pairs() (query rows 2u and 2u + 1 interleaved); zero beyond `rows`. As in
// the AMX forward, P is taken in base 2: 2^(scale log2(e) s - log2(e) lse). What probabilities_and_score_
// gradients, round_rows and interleave_rows would do, without writing and reading P and dS in float32.
MESHTRAIN_AMX void amx_probabilities_and_score_gradients(AmxBuffers& t, const HeadView& view,
                                                         const GradView& grad, int64_t i0, int64_t rows,
                                                         int64_t j0, int64_t cols, bool masked, float scale,
                                                         bool want_dq, bool want_dkdv) {
  lane_tokens(t.lanes_state.tokens, view.kv_positions, view.kv_segment_ids, j0, cols,
              std::numeric_limits<int32_t>::max());
  scale_and_mask(t.probs, view.q_positions, view.q_segment_ids, t.lanes_state.tokens, i0, rows, false, masked,
                 scale * kLog2e);
  const __m512i zip = _mm512_load_si512(kZipPairs);
  alignas(64) float p[2][kTile], ds[2][kTile];  // two query rows of P and dS
  for (int64_t r = 0; r < kTile; r += 2) {
    for (int64_t i = 0; i < 2; ++i) {
      if (r + i >= rows) {
        std::fill_n(p[i], kTile, 0.0f);
        std::fill_n(ds[i], kTile, 0.0f);
        continue;
      }
      const float* scores = t.probs + (r + i) * kTile;
      const float* dscores = t.dscores + (r + i) * kTile;
      const __m512 row_lse = _mm512_set1_ps(backward_lse(grad.lse[i0 + r + i]) * kLog2e);
      const __m512 row_dot = _mm512_set1_ps(grad.row_dot[i0 + r + i]), scales = _mm512_set1_ps(scale);
      for (int64_t lane = 0; lane < kTile; lane += 16) {
        __m512 probability = _mm512_sub_ps(_mm512_load_ps(scores + lane), row_lse);
        exp2_lanes(probability);
        _mm512_store_ps(p[i] + lane, probability);
        const __m512 difference = _mm512_sub_ps(_mm512_load_ps(dscores + lane), row_dot);
        _mm512_store_ps(ds[i] + lane, _mm512_mul_ps(_mm512_mul_ps(scales, probability), difference));
      }
    }
    if (want_dkdv) {
      for (int64_t c = 0; c < kTile; c += 16) {
        const __m512bh p_both = _mm512_cvtne2ps_pbh(_mm512_load_ps(p[1] + c), _mm512_load_ps(p[0] + c));
        const __m512bh ds_both = _mm512_cvtne2ps_pbh(_mm512_load_ps(ds[1] + c), _mm512_load_ps(ds[0] + c));
        _mm512_store_si512(t.p_pairs() + r / 2 * kTile + c,
                           _mm512_permutexvar_epi16(zip, reinterpret_cast<const __m512i&>(p_both)));
        _mm512_store_si512(t.ds_pairs() + r / 2 * kTile + c,
                           _mm512_permutexvar_epi16(zip, reinterpret_cast<const __m512i&>(ds_both)));
      }
    }
    if (want_dq) {
      for (int64_t i = 0; i < 2; ++i) {
        for (int64_t c = 0; c < kTile; c += 32) {
          const __m512bh both =
              _mm512_cvtne2ps_pbh(_mm512_load_ps(ds[i] + c + 16), _mm512_load_ps(ds[i] + c));
          _mm512_store_si512(t.ds_rows + (r + i) * (kTile / 2) + c / 2,
                             reinterpret_cast<const __m512i&>(both));
        }
      }
    }
  }
}

MESHTRAIN_AMX void add_key_gradients_amx(AmxBuffers& t, int64_t second);

// The AMX backward of one tile pair (layout above, whatever keys_are_rows says).
MESHTRAIN_AMX void backward_pair_amx(AmxBuffers& t, const HeadView& view, const GradView& grad, int64_t i0,
                                     int64_t rows, int64_t j0, int64_t cols, bool masked, float scale) {
  const int64_t d = view.d, width = t.width, qs = view.q_stride, kvs = view.kv_stride;
  const int64_t key_slot = j0 / kTile,
                query_slot = view.group_head * ((view.Sq + kTile - 1) / kTile) + i0 / kTile;
  t.keys.pack(key_slot, view.k + j0 * kvs, kvs, cols, d);
  t.values.pack(key_slot, view.v + j0 * kvs, kvs, cols, d);
  t.queries.pack(query_slot, view.q + i0 * qs, qs, rows, d);
  t.douts.pack(query_slot, grad.dout + i0 * qs, qs, rows, d);
  const int64_t row_tiles = (rows + 15) / 16;
  // S = Q K^T, dP = dO V^T, [rows][kTile].
  amx_product(AmxProduct{t.probs, kTile * 4, t.queries.rows(query_slot), t.pairs * 4,
                         t.keys.pair_rows(key_slot), kTile * 4, row_tiles, kTile / 16, t.pairs / 16, false});
  amx_product(AmxProduct{t.dscores, kTile * 4, t.douts.rows(query_slot), t.pairs * 4,
                         t.values.pair_rows(key_slot), kTile * 4, row_tiles, kTile / 16, t.pairs / 16,
                         false});
  amx_probabilities_and_score_gradients(t, view, grad, i0, rows, j0, cols, masked, scale, grad.dq != nullptr,
                                        grad.dk != nullptr);
  if (grad.dq != nullptr) {  // dq rows += dS K, accumulated on the tiles: grad.dq is the thread's dq copy,
                             // rows of width floats, padded to whole tiles (AmxKernel::dq_row_floats)
    amx_product(AmxProduct{grad.dq + i0 * grad.dq_stride, grad.dq_stride * 4, t.ds_rows, kTile * 2,
                           t.keys.token_pairs(key_slot), width * 4, row_tiles, width / 16, kTile / 32, true});
  }
  // dv^T += dO^T P, dk^T += Q^T dS: held back for the next pair, or run with the held one.
  if (grad.dk != nullptr) {
    if (!t.held) {
      t.held = true;  // the next pair writes its P and dS beside these
      t.held_slot = query_slot;
    } else {
      add_key_gradients_amx(t, query_slot);
    }
  }
}

// dv^T += dO^T P and dk^T += Q^T dS of the held tile pair (its pair rows in buffers [0]) and, when second >=
// 0, of the pair of query slot `second` (buffers [1]), as one product over both pairs' queries: the same tile
// instructions in the same order as a product per pair, so bitwise the same sums. Nothing is held after.
MESHTRAIN_AMX void add_key_gradients_amx(AmxBuffers& t, int64_t second) {
  const int64_t width = t.width, first = t.held_slot;
  float* dk_t = t.accumulators.data();
  float* dv_t = dk_t + width * kTile;
  const bool both = second >= 0;
  amx_product(AmxProduct{dv_t, kTile * 4, t.douts.columns(first), kTile * 2, t.p_pairs_data[0], kTile * 4,
                         width / 16, kTile / 16, kTile / 32, true, both ? t.douts.columns(second) : nullptr,
                         both ? t.p_pairs_data[1] : nullptr, both ? kTile / 32 : 0});
  amx_product(AmxProduct{dk_t, kTile * 4, t.queries.columns(first), kTile * 2, t.ds_pairs_data[0], kTile * 4,
                         width / 16, kTile / 16, kTile / 32, true, both ? t.queries.columns(second) : nullptr,
                         both ? t.ds_pairs_data[1] : nullptr, both ? kTile / 32 : 0});
  t.held = false;
}

struct AmxForwardBuffers : AmxBuffers {
  explicit AmxForwardBuffers(const BufferShape& shape) : AmxBuffers(shape, false) {}
};
struct AmxBackwardBuffers : AmxBuffers {
  explicit AmxBackwardBuffers(const BufferShape& shape) : AmxBuffers(shape, true) {}
};

// The AMX kernel as the schedules below use it: dk / dv of a key tile accumulate transposed in the
// thread's buffers ([width][kTile] each) from begin_key_tile to end_key_tile.
struct AmxKernel {
  using Forward = AmxForwardBuffers;
  using Backward = AmxBackwardBuffers;
  // AMX-BF16 with the tile permission (cpu_features asked for it) and AVX512-BF16 for the packing; the cpu
  // table selects these kernels only then.
  static void check_cpu() {
    MT_CHECK(
        cpu_features().amx_bf16 && cpu_features().avx512_bf16,
        "AMX attention needs a CPU with AMX-BF16 and AVX512-BF16 and the OS's tile permission (this one: " +
            cpu_features().describe() + "): run with dtype=float32");
  }
  static void forward_tile(AmxBuffers& t, float* out, float* lse, const HeadView& view, int64_t i0,
                           int64_t rows, float scale, bool accumulate) {
    forward_query_tile_amx(t, out, lse, view, i0, rows, scale, accumulate);
  }
  static void pair(AmxBuffers& t, const HeadView& view, const GradView& grad, int64_t i0, int64_t rows,
                   int64_t j0, int64_t cols, bool masked, bool /*keys_are_rows*/, float scale) {
    backward_pair_amx(t, view, grad, i0, rows, j0, cols, masked, scale);
  }
  static void begin_key_tile(AmxBuffers& t, float* dk, float* dv, int64_t stride, int64_t cols, int64_t d,
                             bool accumulate) {
    float* dk_t = t.accumulators.data();
    begin_transposed_key_gradients(dk_t, dk_t + t.width * kTile, t.width, dk, dv, stride, cols, d,
                                   accumulate);
  }
  static void end_key_tile(AmxBuffers& t, float* dk, float* dv, int64_t stride, int64_t cols, int64_t d) {
    if (t.held) add_key_gradients_amx(t, -1);  // a pair held back with no next one in this key tile
    const float* dk_t = t.accumulators.data();
    end_transposed_key_gradients(dk_t, dk_t + t.width * kTile, dk, dv, stride, cols, d);
  }
  // The dq product's float32 tiles load and store their rows in the dq copy: whole 16-column tiles (the
  // columns past d get exact zeros from K's zero padding).
  static int64_t dq_row_floats(int64_t d) { return (d + 15) / 16 * 16; }
};

// Forward over a query set and a key / value set with Kernel (Float32Kernel or Bf16Kernel): one task per
// (batch, query head, query tile), each thread with its own buffers.
template <class Kernel>
void forward_sets(float* out, float* lse, const float* q, const float* k, const float* v,
                  const TokenSets& sets, int64_t B, int64_t H, int64_t K, int64_t d, bool accumulate) {
  MT_CHECK(K > 0 && H % K == 0, "query heads must be a multiple of kv heads");
  // An empty set may pass nullptr (an empty vector's data()) whatever the other set does.
  MT_CHECK(
      sets.Sq == 0 || sets.Skv == 0 || (sets.q_segment_ids == nullptr) == (sets.kv_segment_ids == nullptr),
      "segment ids are given for both token sets or for neither");
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t Sq = sets.Sq;
  const int64_t query_tiles = (Sq + kTile - 1) / kTile;
  const int64_t tasks = B * H * query_tiles;
#pragma omp parallel
  {
    typename Kernel::Forward buffers(BufferShape{d, Sq, sets.Skv, H / K});
    // Later query tiles see more keys under a causal mask: hand them out first so dynamic scheduling ends
    // with the cheap ones.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t tile = query_tiles - 1 - task % query_tiles;
      const int64_t bh = task / query_tiles, b = bh / H, h = bh % H;
      const HeadView view = head_view(q, k, v, sets, b, h, H, K, d);
      const int64_t i0 = tile * kTile;
      Kernel::forward_tile(buffers, out + (b * Sq * H + h) * d, lse + bh * Sq, view, i0,
                           std::min(Sq - i0, kTile), scale, accumulate);
    }
  }
}

// Backward over a query set and a key / value set with Kernel; with `accumulate` dq, dk, dv are added to,
// else written.
template <class Kernel>
void backward_sets(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                   const float* q, const float* k, const float* v, const TokenSets& sets, int64_t B,
                   int64_t H, int64_t K, int64_t d, bool accumulate, float* scratch) {
  MT_CHECK(K > 0 && H % K == 0, "query heads must be a multiple of kv heads");
  // An empty set may pass nullptr (an empty vector's data()) whatever the other set does.
  MT_CHECK(
      sets.Sq == 0 || sets.Skv == 0 || (sets.q_segment_ids == nullptr) == (sets.kv_segment_ids == nullptr),
      "segment ids are given for both token sets or for neither");
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t group = H / K;
  const int64_t Sq = sets.Sq, Skv = sets.Skv;
  const int64_t query_tiles = (Sq + kTile - 1) / kTile, key_tiles = (Skv + kTile - 1) / kTile;

  // row_dot [B,H,Sq] = rowsum(dout * out), the D_i of the softmax backward.
  float* row_dot = scratch;
#pragma omp parallel for schedule(static)
  for (int64_t index = 0; index < B * H * Sq; ++index) {
    const int64_t bh = index / Sq, i = index % Sq, b = bh / H, h = bh % H;
    const int64_t row = ((b * Sq + i) * H + h) * d;
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t c = 0; c < d; ++c) total += dout[row + c] * out[row + c];
    row_dot[index] = total;
  }

  // dq accumulates in a per-thread copy of a head's dq, whole query tiles of rows dq_row floats apart
  // (Kernel::dq_row_floats), and goes to dq once: in dq's own layout [B, Sq, H, d] the rows are H * d floats
  // apart (8 KB at qwen3-0.6b), so every key tile's updates touched 64 rows on 64 pages, and the store of
  // those sums was half of the pair's non-product time. Nothing reads the copy's padding.
  const int64_t dq_row = Kernel::dq_row_floats(d), head_rows = query_tiles * kTile;
  const auto load_dq = [&](float* copy, int64_t b, int64_t h, int64_t i0, int64_t rows) {
    for (int64_t i = i0; i < i0 + rows; ++i) {
      float* row = copy + i * dq_row;
      if (accumulate) {
        std::copy_n(dq + ((b * Sq + i) * H + h) * d, d, row);
      } else {
        std::fill_n(row, d, 0.0f);
      }
    }
  };
  const auto store_dq = [&](const float* copy, int64_t b, int64_t h, int64_t i0, int64_t rows) {
    for (int64_t i = i0; i < i0 + rows; ++i)
      std::copy_n(copy + i * dq_row, d, dq + ((b * Sq + i) * H + h) * d);
  };

  // Gradient views of (b, h) with dq in a copy (above), or none; the null members select which side the pair
  // writes.
  const auto grad_view = [&](int64_t b, int64_t h, float* dq_copy, bool want_dkdv) {
    const int64_t g = h / group;
    return GradView{dq_copy,
                    dq_row,
                    want_dkdv ? dk + (b * Skv * K + g) * d : nullptr,
                    want_dkdv ? dv + (b * Skv * K + g) * d : nullptr,
                    dout + (b * Sq * H + h) * d,
                    lse + (b * H + h) * Sq,
                    row_dot + (b * H + h) * Sq};
  };
  // All query tiles of the group's heads against key tile [j0, j0 + cols) (layout: key tile packed once).
  // dq_owned: the owner schedule's dq copies of the group's heads, or nullptr for no dq.
  const auto key_tile = [&](typename Kernel::Backward& buffers, int64_t b, int64_t g, int64_t j0,
                            int64_t cols, float* dq_owned) {
    float* dk_tile = dk + ((b * Skv + j0) * K + g) * d;
    float* dv_tile = dv + ((b * Skv + j0) * K + g) * d;
    Kernel::begin_key_tile(buffers, dk_tile, dv_tile, K * d, cols, d, accumulate);
    const TileBounds key_bounds =
        tile_bounds(sets.kv_positions + b * Skv,
                    sets.kv_segment_ids == nullptr ? nullptr : sets.kv_segment_ids + b * Skv, j0, j0 + cols);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const HeadView view = head_view(q, k, v, sets, b, h, H, K, d);
      const GradView grad = grad_view(
          b, h, dq_owned == nullptr ? nullptr : dq_owned + (h - g * group) * head_rows * dq_row, true);
      for (int64_t i0 = 0; i0 < Sq; i0 += kTile) {
        const int64_t rows = std::min(Sq - i0, kTile);
        const TileBounds query_bounds = tile_bounds(view.q_positions, view.q_segment_ids, i0, i0 + rows);
        if (fully_masked(query_bounds, key_bounds)) continue;
        Kernel::pair(buffers, view, grad, i0, rows, j0, cols, !fully_visible(query_bounds, key_bounds), false,
                     scale);
      }
    }
    Kernel::end_key_tile(buffers, dk_tile, dv_tile, K * d, cols, d);
  };

  // Owner schedule when B*K tasks fill at least 3/4 of the thread-rounds they need (the split schedule
  // costs ~1.4x the flops, so it only pays when the owners would leave more than that idle).
  const int64_t threads = omp_get_max_threads();
  const int64_t owners = B * K;
  const int64_t rounds = (owners + threads - 1) / threads;
  if (4 * owners >= 3 * rounds * threads) {
#pragma omp parallel
    {
      typename Kernel::Backward buffers(BufferShape{d, Sq, Skv, group});
      // dq of the owner's query heads, [group][head_rows][dq_row].
      std::vector<float> dq_owned(static_cast<size_t>(group * head_rows * dq_row));
#pragma omp for schedule(dynamic, 1)
      for (int64_t owner = 0; owner < owners; ++owner) {
        const int64_t b = owner / K, g = owner % K;
        for (int64_t h = g * group; h < (g + 1) * group; ++h)
          load_dq(dq_owned.data() + (h - g * group) * head_rows * dq_row, b, h, 0, Sq);
        for (int64_t j0 = 0; j0 < Skv; j0 += kTile)
          key_tile(buffers, b, g, j0, std::min(Skv - j0, kTile), dq_owned.data());
        for (int64_t h = g * group; h < (g + 1) * group; ++h)
          store_dq(dq_owned.data() + (h - g * group) * head_rows * dq_row, b, h, 0, Sq);
      }
    }
    return;
  }

#pragma omp parallel
  {
    typename Kernel::Backward buffers(BufferShape{d, Sq, Skv, group});
    std::vector<float> dq_head(static_cast<size_t>(head_rows * dq_row));  // pass 2's dq copy of one head
    // Split schedule, pass 1: dk, dv per (batch, kv head, key tile); early key tiles are seen by more
    // queries, so they go first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * K * key_tiles; ++task) {
      const int64_t j0 = (task % key_tiles) * kTile, owner = task / key_tiles;
      key_tile(buffers, owner / K, owner % K, j0, std::min(Skv - j0, kTile), nullptr);
    }
    // Pass 2 (after the implicit barrier): dq per (batch, query head, query tile), key tiles ascending as in
    // the owner schedule, layout with the query tile packed once.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * H * query_tiles; ++task) {
      const int64_t tile = query_tiles - 1 - task % query_tiles, bh = task / query_tiles, b = bh / H,
                    h = bh % H;
      const int64_t i0 = tile * kTile, rows = std::min(Sq - i0, kTile);
      const HeadView view = head_view(q, k, v, sets, b, h, H, K, d);
      const GradView grad = grad_view(b, h, dq_head.data(), false);
      load_dq(dq_head.data(), b, h, i0, rows);
      const TileBounds query_bounds = tile_bounds(view.q_positions, view.q_segment_ids, i0, i0 + rows);
      for (int64_t j0 = 0; j0 < Skv; j0 += kTile) {
        const int64_t cols = std::min(Skv - j0, kTile);
        const TileBounds key_bounds = tile_bounds(view.kv_positions, view.kv_segment_ids, j0, j0 + cols);
        if (fully_masked(query_bounds, key_bounds)) continue;
        Kernel::pair(buffers, view, grad, i0, rows, j0, cols, !fully_visible(query_bounds, key_bounds), true,
                     scale);
      }
      store_dq(dq_head.data(), b, h, i0, rows);
    }
  }
}

// The four entries of one kind of kernel; self-attention is the case where the query set is the key / value
// set.
template <class Kernel>
void context_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                     const int32_t* q_positions, const int32_t* q_segment_ids, const int32_t* kv_positions,
                     const int32_t* kv_segment_ids, int64_t B, int64_t Sq, int64_t Skv, int64_t H, int64_t K,
                     int64_t d, bool accumulate) {
  Kernel::check_cpu();
  forward_sets<Kernel>(out, lse, q, k, v,
                       TokenSets{q_positions, q_segment_ids, kv_positions, kv_segment_ids, Sq, Skv}, B, H, K,
                       d, accumulate);
}

template <class Kernel>
void context_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                      const float* q, const float* k, const float* v, const int32_t* q_positions,
                      const int32_t* q_segment_ids, const int32_t* kv_positions,
                      const int32_t* kv_segment_ids, int64_t B, int64_t Sq, int64_t Skv, int64_t H, int64_t K,
                      int64_t d, bool accumulate, float* scratch) {
  Kernel::check_cpu();
  backward_sets<Kernel>(dq, dk, dv, dout, out, lse, q, k, v,
                        TokenSets{q_positions, q_segment_ids, kv_positions, kv_segment_ids, Sq, Skv}, B, H, K,
                        d, accumulate, scratch);
}

template <class Kernel>
void self_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                  const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S, int64_t H,
                  int64_t K, int64_t d) {
  context_forward<Kernel>(out, lse, q, k, v, positions, segment_ids, positions, segment_ids, B, S, S, H, K, d,
                          false);
}

template <class Kernel>
void self_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                   const float* q, const float* k, const float* v, const int32_t* positions,
                   const int32_t* segment_ids, int64_t B, int64_t S, int64_t H, int64_t K, int64_t d,
                   float* scratch) {
  context_backward<Kernel>(dq, dk, dv, dout, out, lse, q, k, v, positions, segment_ids, positions,
                           segment_ids, B, S, S, H, K, d, false, scratch);
}

template <class Kernel>
AttentionKernels kernel_set() {
  return {self_forward<Kernel>, self_backward<Kernel>, context_forward<Kernel>, context_backward<Kernel>};
}

}  // namespace

int64_t attention_forward_scratch_floats(int64_t, int64_t, int64_t, int64_t, int64_t, int) {
  return 0;
}

int64_t attention_backward_scratch_floats(int64_t B, int64_t S, int64_t H, int64_t, int64_t, int) {
  return B * H * S;
}

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S, int64_t H,
                       int64_t K, int64_t d) {
  self_forward<Float32Kernel>(out, lse, q, k, v, positions, segment_ids, B, S, H, K, d);
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S, int64_t H,
                        int64_t K, int64_t d, float* scratch) {
  self_backward<Float32Kernel>(dq, dk, dv, dout, out, lse, q, k, v, positions, segment_ids, B, S, H, K, d,
                               scratch);
}

void context_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                               const int32_t* q_positions, const int32_t* q_segment_ids,
                               const int32_t* kv_positions, const int32_t* kv_segment_ids, int64_t B,
                               int64_t Sq, int64_t Skv, int64_t H, int64_t K, int64_t d, bool accumulate) {
  context_forward<Float32Kernel>(out, lse, q, k, v, q_positions, q_segment_ids, kv_positions, kv_segment_ids,
                                 B, Sq, Skv, H, K, d, accumulate);
}

void context_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                const float* lse, const float* q, const float* k, const float* v,
                                const int32_t* q_positions, const int32_t* q_segment_ids,
                                const int32_t* kv_positions, const int32_t* kv_segment_ids, int64_t B,
                                int64_t Sq, int64_t Skv, int64_t H, int64_t K, int64_t d, bool accumulate,
                                float* scratch) {
  context_backward<Float32Kernel>(dq, dk, dv, dout, out, lse, q, k, v, q_positions, q_segment_ids,
                                  kv_positions, kv_segment_ids, B, Sq, Skv, H, K, d, accumulate, scratch);
}

AttentionKernels attention_kernels_with(AttentionProducts products) {
  switch (products) {
    case AttentionProducts::float32:  // the named entries, so a table holding them compares equal
      return {attention_forward, attention_backward, context_attention_forward, context_attention_backward};
    case AttentionProducts::avx512_bf16:
      return kernel_set<Bf16Kernel>();
    case AttentionProducts::amx:
      return kernel_set<AmxKernel>();
  }
  MT_CHECK(false, "an AttentionProducts value");
  return {};
}

int64_t context_attention_backward_scratch_floats(int64_t B, int64_t Sq, int64_t H) {
  return B * H * Sq;
}

void attention_decode(float* out, float* key_cache, float* value_cache, float* scores, const float* q,
                      const float* k, const float* v, int64_t position, int64_t H, int64_t K, int64_t d) {
  std::copy(k, k + K * d, key_cache + position * K * d);
  std::copy(v, v + K * d, value_cache + position * K * d);
  const int64_t group = H / K, visible = position + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t h = 0; h < H; ++h) {
    const float* query = q + h * d;
    const int64_t g = h / group;
    float maximum = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < visible; ++j) {
      const float* key = key_cache + (j * K + g) * d;
      float dot = 0.0f;
      for (int64_t c = 0; c < d; ++c) dot += query[c] * key[c];
      scores[j] = scale * dot;
      maximum = std::max(maximum, scores[j]);
    }
    float* row = out + h * d;
    std::fill(row, row + d, 0.0f);
    float sum = 0.0f;
    for (int64_t j = 0; j < visible; ++j) {
      const float p = std::exp(scores[j] - maximum);
      sum += p;
      const float* value = value_cache + (j * K + g) * d;
      for (int64_t c = 0; c < d; ++c) row[c] += p * value[c];
    }
    for (int64_t c = 0; c < d; ++c) row[c] /= sum;
  }
}

}  // namespace meshtrain::kernels
