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
//   count. No atomics, no per-thread partial sums.
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

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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
#else
constexpr int64_t kLanes = 8;
constexpr int kScoreVecs = 2, kUpdateVecs = 2;  // 8 accumulators + 2 operands + a broadcast of 16
#endif
constexpr int64_t kVecsPerTile = kTile / kLanes;  // a row of scores is 4 (AVX-512) or 8 Vecs
static_assert(kVecsPerTile % kScoreVecs == 0);
// Head-width columns packed at once: heads up to 256 wide are packed once per tile and reused for every
// pair; wider heads are repacked per pair in 256-column slices (slower, same results).
constexpr int64_t kPackWidth = 256;
constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

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
                  K * d};
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
// pair is known visible and only scaling happens.
void scale_and_mask(float* scores, const int32_t* row_positions, const int32_t* row_segment_ids,
                    const LaneTokens& lanes, int64_t row_begin, int64_t rows, bool keys_are_rows, bool masked,
                    float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * kTile;
    if (!masked) {
#pragma omp simd
      for (int64_t lane = 0; lane < kTile; ++lane) row[lane] *= scale;
      continue;
    }
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
}

// Forward of query rows [i0, i0 + rows) of one head. Scores are computed transposed (key rows x query
// lanes) so the packed query tile is reused for every key tile. Unnormalised outputs accumulate directly
// in `out` (rows of stride q_stride), so no accumulator scratch is needed.
// With `accumulate` the online softmax resumes from the (out, lse) already there: running max = lse,
// running sum = 1 (out is normalised, i.e. in units of exp(lse)), accumulator = out; a row with lse = -inf
// has seen nothing yet (sum 0, out zeroed). Folding a key set in tile by tile or block by block is thus the
// same recurrence.
void forward_query_tile(float* out, float* lse, const HeadView& view, int64_t i0, int64_t rows, float scale,
                        bool accumulate) {
  PackedTile packed_queries;
  LaneTokens query_lanes;
  alignas(64) float scores[kTile * kTile];
  alignas(64) float row_max[kTile], row_sum[kTile], tile_max[kTile], shift[kTile], alpha[kTile];
  const int64_t d = view.d;
  std::fill_n(row_max, kTile, kNegativeInfinity);
  std::fill_n(row_sum, kTile, 0.0f);
  if (accumulate) {
    for (int64_t i = 0; i < rows; ++i) {
      row_max[i] = lse[i0 + i];
      row_sum[i] = row_max[i] == kNegativeInfinity ? 0.0f : 1.0f;
      if (row_sum[i] == 0.0f) std::fill_n(out + (i0 + i) * view.q_stride, d, 0.0f);
    }
  } else {
    zero_rows(out + i0 * view.q_stride, view.q_stride, rows, d);
  }
  lane_tokens(query_lanes, view.q_positions, view.q_segment_ids, i0, rows,
              std::numeric_limits<int32_t>::min());
  const TileBounds query_bounds = tile_bounds(view.q_positions, view.q_segment_ids, i0, i0 + rows);
  for (int64_t j0 = 0; j0 < view.Skv; j0 += kTile) {
    const int64_t cols = std::min(view.Skv - j0, kTile);
    const TileBounds key_bounds = tile_bounds(view.kv_positions, view.kv_segment_ids, j0, j0 + cols);
    if (fully_masked(query_bounds, key_bounds)) continue;
    const float* k_rows = view.k + j0 * view.kv_stride;
    score_tile(scores, k_rows, view.kv_stride, cols, packed_queries, view.q + i0 * view.q_stride,
               view.q_stride, rows, d);
    const bool masked = !fully_visible(query_bounds, key_bounds);
    scale_and_mask(scores, view.kv_positions, view.kv_segment_ids, query_lanes, j0, cols, true, masked,
                   scale);
    // Online softmax per query lane: new running max, rescale factor for what earlier tiles accumulated.
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
    for (int64_t i = 0; i < rows; ++i) {
      if (alpha[i] == 1.0f) continue;
      float* oi = out + (i0 + i) * view.q_stride;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) oi[c] *= alpha[i];
    }
    // out_i += sum_j p[j][i] v_j: coefficient of (term j, output row i) is scores[j * kTile + i].
    rank_update_rows(out + i0 * view.q_stride, view.q_stride, rows, scores, kTile, 1,
                     view.v + j0 * view.kv_stride, view.kv_stride, cols, d, masked);
  }
  // row_sum == 0 only for a query that sees no key (never in self-attention, where a token sees itself):
  // its out stays 0 (every p was 0) and its lse is -inf.
  for (int64_t i = 0; i < rows; ++i) {
    float* oi = out + (i0 + i) * view.q_stride;
    const bool seen = row_sum[i] > 0.0f;
    const float inverse = seen ? 1.0f / row_sum[i] : 0.0f;
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) oi[c] *= inverse;
    lse[i0 + i] = seen ? row_max[i] + std::log(row_sum[i]) : kNegativeInfinity;
  }
}

// Gradient slices of one (batch, query head): dq rows like q, dk / dv rows like k, dout like q; lse and
// row_dot (= rowsum(dout * out)) are [Sq]. dq, or dk and dv, are null when that side is not wanted.
struct GradView {
  float* dq;
  float* dk;
  float* dv;
  const float* dout;
  const float* lse;
  const float* row_dot;
};

// Per-thread buffers of the backward: the two packed operands of the score products and the two tiles of
// probabilities P and score gradients dS.
struct BackwardBuffers {
  PackedTile packed_scores, packed_dscores;  // packed side of S = q k^T and of dP = dout v^T
  LaneTokens lanes;
  alignas(64) float probs[kTile * kTile];
  alignas(64) float dscores[kTile * kTile];
  alignas(64) float lane_lse[kTile], lane_dot[kTile];
};

// The lse the backward subtracts: a query that saw no key has lse = -inf, and score - (-inf) would make
// its probabilities exp(+inf) (or NaN for masked -inf scores); +inf makes every one of them exactly 0, so
// such a row gets no gradient.
inline float backward_lse(float lse) {
  return lse == kNegativeInfinity ? std::numeric_limits<float>::infinity() : lse;
}

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
  // Row side and lane side of this layout.
  const int64_t row_begin = keys_are_rows ? j0 : i0, row_count = keys_are_rows ? cols : rows;
  const int64_t lane_begin = keys_are_rows ? i0 : j0, lane_count = keys_are_rows ? rows : cols;
  if (keys_are_rows) {
    score_tile(buffers.probs, k_rows, kvs, cols, buffers.packed_scores, q_rows, qs, rows, d);
    score_tile(buffers.dscores, v_rows, kvs, cols, buffers.packed_dscores, dout_rows, qs, rows, d);
  } else {
    score_tile(buffers.probs, q_rows, qs, rows, buffers.packed_scores, k_rows, kvs, cols, d);
    score_tile(buffers.dscores, dout_rows, qs, rows, buffers.packed_dscores, v_rows, kvs, cols, d);
  }
  if (keys_are_rows) {
    lane_tokens(buffers.lanes, view.q_positions, view.q_segment_ids, lane_begin, lane_count,
                std::numeric_limits<int32_t>::min());
    scale_and_mask(buffers.probs, view.kv_positions, view.kv_segment_ids, buffers.lanes, row_begin, row_count,
                   true, masked, scale);
  } else {
    lane_tokens(buffers.lanes, view.kv_positions, view.kv_segment_ids, lane_begin, lane_count,
                std::numeric_limits<int32_t>::max());
    scale_and_mask(buffers.probs, view.q_positions, view.q_segment_ids, buffers.lanes, row_begin, row_count,
                   false, masked, scale);
  }
  // lse and row_dot belong to queries: per lane when queries are lanes, per row otherwise. The unused one is
  // 0, and x - 0 == x exactly, so both layouts compute the same values.
  std::fill_n(buffers.lane_lse, kTile, 0.0f);
  std::fill_n(buffers.lane_dot, kTile, 0.0f);
  if (keys_are_rows) {
    for (int64_t i = 0; i < rows; ++i) buffers.lane_lse[i] = backward_lse(grad.lse[i0 + i]);
    std::copy_n(grad.row_dot + i0, rows, buffers.lane_dot);
  }
  for (int64_t r = 0; r < row_count; ++r) {
    float* pr = buffers.probs + r * kTile;
    float* dsr = buffers.dscores + r * kTile;
    const float row_lse = keys_are_rows ? 0.0f : backward_lse(grad.lse[i0 + r]);
    const float row_dot = keys_are_rows ? 0.0f : grad.row_dot[i0 + r];
#pragma omp simd
    for (int64_t lane = 0; lane < kTile; ++lane) {
      pr[lane] = exp_approx((pr[lane] - row_lse) - buffers.lane_lse[lane]);
      dsr[lane] = scale * pr[lane] * ((dsr[lane] - row_dot) - buffers.lane_dot[lane]);
    }
  }
  // Element (query i, key j) of P and dS sits at [i * i_stride + j * j_stride].
  const int64_t i_stride = keys_are_rows ? 1 : kTile, j_stride = keys_are_rows ? kTile : 1;
  if (grad.dq != nullptr) {
    rank_update_rows(grad.dq + i0 * qs, qs, rows, buffers.dscores, j_stride, i_stride, k_rows, kvs, cols, d,
                     masked);
  }
  if (grad.dk != nullptr) {
    rank_update_rows(grad.dv + j0 * kvs, kvs, cols, buffers.probs, i_stride, j_stride, dout_rows, qs, rows, d,
                     masked);
    rank_update_rows(grad.dk + j0 * kvs, kvs, cols, buffers.dscores, i_stride, j_stride, q_rows, qs, rows, d,
                     masked);
  }
}

// Forward over a query set and a key / value set: one task per (batch, query head, query tile).
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
  // Later query tiles see more keys under a causal mask: hand them out first so dynamic scheduling ends
  // with the cheap ones.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t tile = query_tiles - 1 - task % query_tiles;
    const int64_t bh = task / query_tiles, b = bh / H, h = bh % H;
    const HeadView view = head_view(q, k, v, sets, b, h, H, K, d);
    const int64_t i0 = tile * kTile;
    forward_query_tile(out + (b * Sq * H + h) * d, lse + bh * Sq, view, i0, std::min(Sq - i0, kTile), scale,
                       accumulate);
  }
}

// Backward over a query set and a key / value set; with `accumulate` dq, dk, dv are added to, else written.
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

  // Gradient views of (b, h); the null members select which side backward_pair writes.
  const auto grad_view = [&](int64_t b, int64_t h, bool want_dq, bool want_dkdv) {
    const int64_t g = h / group;
    return GradView{want_dq ? dq + (b * Sq * H + h) * d : nullptr,
                    want_dkdv ? dk + (b * Skv * K + g) * d : nullptr,
                    want_dkdv ? dv + (b * Skv * K + g) * d : nullptr,
                    dout + (b * Sq * H + h) * d,
                    lse + (b * H + h) * Sq,
                    row_dot + (b * H + h) * Sq};
  };
  // All query tiles of the group's heads against key tile [j0, j0 + cols) (layout: key tile packed once).
  const auto key_tile = [&](BackwardBuffers& buffers, int64_t b, int64_t g, int64_t j0, int64_t cols,
                            bool want_dq) {
    if (!accumulate) {
      zero_rows(dk + ((b * Skv + j0) * K + g) * d, K * d, cols, d);
      zero_rows(dv + ((b * Skv + j0) * K + g) * d, K * d, cols, d);
    }
    const TileBounds key_bounds =
        tile_bounds(sets.kv_positions + b * Skv,
                    sets.kv_segment_ids == nullptr ? nullptr : sets.kv_segment_ids + b * Skv, j0, j0 + cols);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const HeadView view = head_view(q, k, v, sets, b, h, H, K, d);
      const GradView grad = grad_view(b, h, want_dq, true);
      for (int64_t i0 = 0; i0 < Sq; i0 += kTile) {
        const int64_t rows = std::min(Sq - i0, kTile);
        const TileBounds query_bounds = tile_bounds(view.q_positions, view.q_segment_ids, i0, i0 + rows);
        if (fully_masked(query_bounds, key_bounds)) continue;
        backward_pair(buffers, view, grad, i0, rows, j0, cols, !fully_visible(query_bounds, key_bounds),
                      false, scale);
      }
    }
  };

  // Owner schedule when B*K tasks fill at least 3/4 of the thread-rounds they need (the split schedule
  // costs ~1.4x the flops, so it only pays when the owners would leave more than that idle).
  const int64_t threads = omp_get_max_threads();
  const int64_t owners = B * K;
  const int64_t rounds = (owners + threads - 1) / threads;
  if (4 * owners >= 3 * rounds * threads) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t owner = 0; owner < owners; ++owner) {
      BackwardBuffers buffers;
      const int64_t b = owner / K, g = owner % K;
      if (!accumulate) {
        for (int64_t h = g * group; h < (g + 1) * group; ++h)
          zero_rows(dq + (b * Sq * H + h) * d, H * d, Sq, d);
      }
      for (int64_t j0 = 0; j0 < Skv; j0 += kTile)
        key_tile(buffers, b, g, j0, std::min(Skv - j0, kTile), true);
    }
    return;
  }

  // Split schedule, pass 1: dk, dv per (batch, kv head, key tile); early key tiles are seen by more
  // queries, so they go first.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < B * K * key_tiles; ++task) {
    BackwardBuffers buffers;
    const int64_t j0 = (task % key_tiles) * kTile, owner = task / key_tiles;
    key_tile(buffers, owner / K, owner % K, j0, std::min(Skv - j0, kTile), false);
  }
  // Pass 2: dq per (batch, query head, query tile), key tiles ascending as in the owner schedule, layout
  // with the query tile packed once.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < B * H * query_tiles; ++task) {
    BackwardBuffers buffers;
    const int64_t tile = query_tiles - 1 - task % query_tiles, bh = task / query_tiles, b = bh / H,
                  h = bh % H;
    const int64_t i0 = tile * kTile, rows = std::min(Sq - i0, kTile);
    const HeadView view = head_view(q, k, v, sets, b, h, H, K, d);
    const GradView grad = grad_view(b, h, true, false);
    if (!accumulate) zero_rows(grad.dq + i0 * H * d, H * d, rows, d);
    const TileBounds query_bounds = tile_bounds(view.q_positions, view.q_segment_ids, i0, i0 + rows);
    for (int64_t j0 = 0; j0 < Skv; j0 += kTile) {
      const int64_t cols = std::min(Skv - j0, kTile);
      const TileBounds key_bounds = tile_bounds(view.kv_positions, view.kv_segment_ids, j0, j0 + cols);
      if (fully_masked(query_bounds, key_bounds)) continue;
      backward_pair(buffers, view, grad, i0, rows, j0, cols, !fully_visible(query_bounds, key_bounds), true,
                    scale);
    }
  }
}

}  // namespace

int64_t attention_forward_scratch_floats(int64_t, int64_t, int64_t, int64_t, int64_t, int) {
  return 0;
}

int64_t attention_backward_scratch_floats(int64_t B, int64_t S, int64_t H, int64_t, int64_t, int) {
  return B * H * S;
}

// Self-attention is the case where the query set is the key / value set.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S, int64_t H,
                       int64_t K, int64_t d) {
  forward_sets(out, lse, q, k, v, TokenSets{positions, segment_ids, positions, segment_ids, S, S}, B, H, K, d,
               false);
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S, int64_t H,
                        int64_t K, int64_t d, float* scratch) {
  backward_sets(dq, dk, dv, dout, out, lse, q, k, v,
                TokenSets{positions, segment_ids, positions, segment_ids, S, S}, B, H, K, d, false, scratch);
}

void context_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                               const int32_t* q_positions, const int32_t* q_segment_ids,
                               const int32_t* kv_positions, const int32_t* kv_segment_ids, int64_t B,
                               int64_t Sq, int64_t Skv, int64_t H, int64_t K, int64_t d, bool accumulate) {
  forward_sets(out, lse, q, k, v,
               TokenSets{q_positions, q_segment_ids, kv_positions, kv_segment_ids, Sq, Skv}, B, H, K, d,
               accumulate);
}

void context_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                const float* lse, const float* q, const float* k, const float* v,
                                const int32_t* q_positions, const int32_t* q_segment_ids,
                                const int32_t* kv_positions, const int32_t* kv_segment_ids, int64_t B,
                                int64_t Sq, int64_t Skv, int64_t H, int64_t K, int64_t d, bool accumulate,
                                float* scratch) {
  backward_sets(dq, dk, dv, dout, out, lse, q, k, v,
                TokenSets{q_positions, q_segment_ids, kv_positions, kv_segment_ids, Sq, Skv}, B, H, K, d,
                accumulate, scratch);
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
