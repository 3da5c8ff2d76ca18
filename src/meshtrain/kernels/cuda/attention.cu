// Causal grouped-query attention in float32, flash-attention-2 style: a forward with an online softmax over
// key tiles staged in shared memory, and a deterministic backward (no atomics) that recomputes P from q, k
// and lse. Legend: B batch, S sequence, H query heads, K kv heads (H divisible by K), d head width (1..256),
// D the width bucket d is zero-padded to in shared memory (32, 64, 128, 256), Br / Bc query / key tile rows.
// Shapes (attention.h's): q, out, dout, dq [B, S, H, d]; k, v, dk, dv [B, S, K, d]; lse, row_dot [B, H, S];
// positions, segment_ids [B, S] (segment_ids nullptr: one segment).
//
// Every block has 256 threads as a 16 x 16 grid, tx = thread % 16, ty = thread / 16. A score tile [Br, Bc]
// is held as Br / 16 x Bc / 16 values per thread: query rows ty + 16 m, key columns tx + 16 n (the 16 threads
// of a query row are one half-warp, so row reductions are four shuffles). An output tile [rows, D] is held
// as rows / 16 x D / 16 values per thread: rows ty + 16 m, columns tx + 16 x. Shared rows are padded by one
// float (D + 1, Bc + 1) so the column reads of both layouts hit distinct banks.
//
// Masking follows kernels/cpu/attention.h: query i sees key j iff segment_ids[b, j] == segment_ids[b, i]
// (when given) and positions[b, j] <= positions[b, i]. A (query tile, key tile) pair is skipped only when
// the tiles' position and segment bounds prove every pair masked (token order in memory is free).
#include <climits>
#include <cmath>
#include <string>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cuda/attention.h"
#include "meshtrain/kernels/cuda/attention_tiles.cuh"
#include "meshtrain/kernels/cuda/device.h"

namespace meshtrain::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // 16 x 16
constexpr int kSide = 16;

// Rows [0, rows) x columns [0, d) of a strided tile into dst [R, D + 1]; rows >= rows and columns >= d
// (up to D) are zero, so padded columns add nothing to dot products.
template <int D, int R>
__device__ void load_tile(float* __restrict__ dst,        // [R, D + 1] shared
                          const float* __restrict__ src,  // row r at src + r * stride, d floats
                          int64_t stride, int rows, int d) {
  for (int index = static_cast<int>(threadIdx.x); index < R * D; index += kThreads) {
    const int r = index / D, x = index % D;
    dst[r * (D + 1) + x] = (r < rows && x < d) ? src[r * stride + x] : 0.0f;
  }
}

// Sum over the 16 threads of a half-warp (one score row).
__device__ float row_sum16(float value) {
  for (int offset = kSide / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ float row_max16(float value) {
  for (int offset = kSide / 2; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Where a block of the forward and dq kernels works: one block per (query tile, query head, batch), later
// query tiles first (they see more keys).
struct QueryTileBlock {
  int tx, ty;                         // this thread's column and row in the 16 x 16 grid
  int h, b, g;                        // query head, batch, kv head
  int i0, rows;                       // the tile's first query row and its number of rows
  int64_t q_stride, kv_stride;        // floats from one token to the next in q (H d) and in k, v (K d)
  int64_t q_offset, kv_offset;        // q row i0 of head h; k / v row 0 of this sequence's kv head g
  const int32_t* sequence_positions;  // [S] of this sequence
  const int32_t* sequence_segments;   // [S] of this sequence, or nullptr
};

template <int Br>
__device__ QueryTileBlock query_tile_block(const int32_t* positions, const int32_t* segment_ids, int S, int H,
                                           int K, int d) {
  QueryTileBlock block;
  block.tx = static_cast<int>(threadIdx.x) % kSide;
  block.ty = static_cast<int>(threadIdx.x) / kSide;
  const int tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  block.h = static_cast<int>(blockIdx.y);
  block.b = static_cast<int>(blockIdx.z);
  block.g = block.h / (H / K);
  block.i0 = tile * Br;
  block.rows = min(Br, S - block.i0);
  block.q_stride = static_cast<int64_t>(H) * d;
  block.kv_stride = static_cast<int64_t>(K) * d;
  block.q_offset = ((static_cast<int64_t>(block.b) * S + block.i0) * H + block.h) * d;
  block.kv_offset = (static_cast<int64_t>(block.b) * S * K + block.g) * d;
  block.sequence_positions = positions + static_cast<int64_t>(block.b) * S;
  block.sequence_segments = segment_ids == nullptr ? nullptr : segment_ids + int64_t{block.b} * S;
  return block;
}

// This thread's tokens lane + 16 m of a tile of `count` tokens from `first` (query rows: lane ty; key
// columns: lane tx): whether each is a real token, and its position and segment. A padding token gets
// `padding_position`: INT_MIN for a query (it sees no key), INT_MAX for a key (no query sees it).
template <int M>
__device__ void load_tile_tokens(bool (&valid)[M], int (&position)[M], int (&segment)[M],
                                 const int32_t* sequence_positions, const int32_t* sequence_segments,
                                 int first, int count, int lane, int padding_position) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int t = lane + kSide * m;
    valid[m] = t < count;
    position[m] = valid[m] ? sequence_positions[first + t] : padding_position;
    segment[m] = valid[m] && sequence_segments != nullptr ? sequence_segments[first + t] : 0;
  }
}

// The forward's and dq's staging of key tile [j0, j0 + cols): its k and v rows into shared tiles, and its
// keys' positions and segments (padding columns are masked by c < cols).
template <int D, int Bc>
__device__ void stage_key_tile(float* __restrict__ k_tile,  // [Bc, D + 1] shared
                               float* __restrict__ v_tile,  // [Bc, D + 1] shared
                               int* key_positions,          // [Bc] shared
                               int* key_segments,           // [Bc] shared
                               const float* k_rows, const float* v_rows, int64_t kv_stride, int j0, int cols,
                               int d, const int32_t* sequence_positions, const int32_t* sequence_segments) {
  load_tile<D, Bc>(k_tile, k_rows + j0 * kv_stride, kv_stride, cols, d);
  load_tile<D, Bc>(v_tile, v_rows + j0 * kv_stride, kv_stride, cols, d);
  for (int c = static_cast<int>(threadIdx.x); c < Bc; c += kThreads) {
    key_positions[c] = c < cols ? sequence_positions[j0 + c] : 0;
    key_segments[c] = c < cols && sequence_segments != nullptr ? sequence_segments[j0 + c] : 0;
  }
}

// Shared memory of the forward: q tile, k tile, v tile, probabilities, key positions and segments.
template <int D, int Br, int Bc>
constexpr size_t forward_shared_bytes() {
  return sizeof(float) * (Br * (D + 1) + 2 * Bc * (D + 1) + Br * (Bc + 1)) + sizeof(int) * 2 * Bc;
}

// One block per (query tile, query head, batch): grid (query tiles, H, B), later query tiles first.
template <int D, int Br, int Bc>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(float* __restrict__ out, float* __restrict__ lse, const float* __restrict__ q,
                   const float* __restrict__ k, const float* __restrict__ v,
                   const int32_t* __restrict__ positions, const int32_t* __restrict__ segment_ids, int S,
                   int H, int K, int d, float scale) {
  constexpr int M = Br / kSide, N = Bc / kSide, X = D / kSide, P = D + 1, PB = Bc + 1;
  extern __shared__ float shared[];
  float* q_tile = shared;                                        // [Br, D + 1]
  float* k_tile = q_tile + Br * P;                               // [Bc, D + 1]
  float* v_tile = k_tile + Bc * P;                               // [Bc, D + 1]
  float* probs = v_tile + Bc * P;                                // [Br, Bc + 1]
  int* key_positions = reinterpret_cast<int*>(probs + Br * PB);  // [Bc]
  int* key_segments = key_positions + Bc;                        // [Bc]

  const auto [tx, ty, h, b, g, i0, rows, q_stride, kv_stride, q_offset, kv_offset, sequence_positions,
              sequence_segments] = query_tile_block<Br>(positions, segment_ids, S, H, K, d);
  const float* k_rows = k + kv_offset;  // row j at + j * kv_stride
  const float* v_rows = v + kv_offset;  // row j at + j * kv_stride

  load_tile<D, Br>(q_tile, q + q_offset, q_stride, rows, d);
  bool row_valid[M];
  int row_position[M], row_segment[M];
  load_tile_tokens<M>(row_valid, row_position, row_segment, sequence_positions, sequence_segments, i0, rows,
                      ty, INT_MIN);
  const Bounds query_bounds = tile_bounds(sequence_positions, sequence_segments, i0, rows);

  float accumulator[M][X];
  float row_max[M], row_sum[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    row_max[m] = -INFINITY;
    row_sum[m] = 0.0f;
#pragma unroll
    for (int x = 0; x < X; ++x) accumulator[m][x] = 0.0f;
  }

  const int key_tiles = (S + Bc - 1) / Bc;
  for (int key_tile = 0; key_tile < key_tiles; ++key_tile) {
    const int j0 = key_tile * Bc, cols = min(Bc, S - j0);
    if (fully_masked(query_bounds, tile_bounds(sequence_positions, sequence_segments, j0, cols))) continue;
    __syncthreads();  // the previous tile's reads of k_tile, v_tile, probs and key positions are done
    stage_key_tile<D, Bc>(k_tile, v_tile, key_positions, key_segments, k_rows, v_rows, kv_stride, j0, cols, d,
                          sequence_positions, sequence_segments);
    __syncthreads();  // tiles (and, the first time, q_tile) loaded

    float scores[M][N];
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int n = 0; n < N; ++n) scores[m][n] = 0.0f;
    }
#pragma unroll 4
    for (int x = 0; x < D; ++x) {
      float query[M], key[N];
#pragma unroll
      for (int m = 0; m < M; ++m) query[m] = q_tile[(ty + kSide * m) * P + x];
#pragma unroll
      for (int n = 0; n < N; ++n) key[n] = k_tile[(tx + kSide * n) * P + x];
#pragma unroll
      for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int n = 0; n < N; ++n) scores[m][n] = fmaf(query[m], key[n], scores[m][n]);
      }
    }

    // Online softmax per query row: mask, new running max, rescale what earlier tiles accumulated.
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const int c = tx + kSide * n;
        const bool visible = row_valid[m] && c < cols && key_positions[c] <= row_position[m] &&
                             key_segments[c] == row_segment[m];
        scores[m][n] = visible ? scores[m][n] * scale : -INFINITY;
        tile_max = fmaxf(tile_max, scores[m][n]);
      }
      const float new_max = fmaxf(row_max[m], row_max16(tile_max));
      const float shift = new_max == -INFINITY ? 0.0f : new_max;  // no visible key yet: sums stay 0
      const float alpha = expf(row_max[m] - shift);               // 1 when the max did not move
      row_max[m] = new_max;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const float p = expf(scores[m][n] - shift);  // masked: exp(-inf) = 0
        probs[(ty + kSide * m) * PB + tx + kSide * n] = p;
        sum += p;
      }
      row_sum[m] = row_sum[m] * alpha + row_sum16(sum);
#pragma unroll
      for (int x = 0; x < X; ++x) accumulator[m][x] *= alpha;
    }
    __syncthreads();  // probs written

#pragma unroll 4
    for (int c = 0; c < Bc; ++c) {
      float p[M], value[X];
#pragma unroll
      for (int m = 0; m < M; ++m) p[m] = probs[(ty + kSide * m) * PB + c];
#pragma unroll
      for (int x = 0; x < X; ++x) value[x] = v_tile[c * P + tx + kSide * x];
#pragma unroll
      for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int x = 0; x < X; ++x) accumulator[m][x] = fmaf(p[m], value[x], accumulator[m][x]);
      }
    }
  }

  // row_sum == 0 only for a query that sees no key (never in self-attention): out 0, lse -inf.
  float* out_rows = out + q_offset;                                   // row i at + i * q_stride
  float* lse_row = lse + (static_cast<int64_t>(b) * H + h) * S + i0;  // [rows]
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int r = ty + kSide * m;
    if (r >= rows) continue;
    const bool seen = row_sum[m] > 0.0f;
    const float inverse = seen ? 1.0f / row_sum[m] : 0.0f;
#pragma unroll
    for (int x = 0; x < X; ++x) {
      const int column = tx + kSide * x;
      if (column < d) out_rows[r * q_stride + column] = accumulator[m][x] * inverse;
    }
    if (tx == 0) lse_row[r] = seen ? row_max[m] + logf(row_sum[m]) : -INFINITY;
  }
}

// Scores s = q . k and dp = dout . v of a [Br, Bc] tile from shared tiles (score layout, see the top).
template <int D, int M, int N>
__device__ void score_pair(float (&scores)[M][N], float (&dprobs)[M][N],
                           const float* __restrict__ q_tile,     // [Br, D + 1]
                           const float* __restrict__ dout_tile,  // [Br, D + 1]
                           const float* __restrict__ k_tile,     // [Bc, D + 1]
                           const float* __restrict__ v_tile,     // [Bc, D + 1]
                           int tx, int ty) {
  constexpr int P = D + 1;
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int n = 0; n < N; ++n) scores[m][n] = dprobs[m][n] = 0.0f;
  }
#pragma unroll 4
  for (int x = 0; x < D; ++x) {
    float query[M], grad[M], key[N], value[N];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      query[m] = q_tile[(ty + kSide * m) * P + x];
      grad[m] = dout_tile[(ty + kSide * m) * P + x];
    }
#pragma unroll
    for (int n = 0; n < N; ++n) {
      key[n] = k_tile[(tx + kSide * n) * P + x];
      value[n] = v_tile[(tx + kSide * n) * P + x];
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int n = 0; n < N; ++n) {
        scores[m][n] = fmaf(query[m], key[n], scores[m][n]);
        dprobs[m][n] = fmaf(grad[m], value[n], dprobs[m][n]);
      }
    }
  }
}

// Shared memory of the dk / dv kernel: k, v, q, dout tiles, P and dS, and the query tile's positions,
// segments, lse and row_dot.
template <int D, int Br, int Bc>
constexpr size_t dkdv_shared_bytes() {
  return sizeof(float) * (2 * Bc * (D + 1) + 2 * Br * (D + 1) + 2 * Br * (Bc + 1) + 2 * Br) +
         sizeof(int) * 2 * Br;
}

// dk, dv of one key tile of one kv head: one block per (key tile, kv head, batch), looping over the group's
// query heads in order and, for each, over the query tiles in order (a fixed summation order: deterministic).
template <int D, int Br, int Bc>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(float* __restrict__ dk, float* __restrict__ dv, const float* __restrict__ dout,
                const float* __restrict__ lse, const float* __restrict__ row_dot, const float* __restrict__ q,
                const float* __restrict__ k, const float* __restrict__ v,
                const int32_t* __restrict__ positions, const int32_t* __restrict__ segment_ids, int S, int H,
                int K, int d, float scale) {
  constexpr int M = Br / kSide, N = Bc / kSide, X = D / kSide, P = D + 1, PB = Bc + 1;
  extern __shared__ float shared[];
  float* k_tile = shared;                                         // [Bc, D + 1]
  float* v_tile = k_tile + Bc * P;                                // [Bc, D + 1]
  float* q_tile = v_tile + Bc * P;                                // [Br, D + 1]
  float* dout_tile = q_tile + Br * P;                             // [Br, D + 1]
  float* probs = dout_tile + Br * P;                              // [Br, Bc + 1]
  float* dscores = probs + Br * PB;                               // [Br, Bc + 1]
  float* query_lse = dscores + Br * PB;                           // [Br]
  float* query_dot = query_lse + Br;                              // [Br]
  int* query_positions = reinterpret_cast<int*>(query_dot + Br);  // [Br]
  int* query_segments = query_positions + Br;                     // [Br]

  const int tx = static_cast<int>(threadIdx.x) % kSide, ty = static_cast<int>(threadIdx.x) / kSide;
  const int tile = static_cast<int>(blockIdx.x);  // early key tiles are seen by more queries: first
  const int g = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const int group = H / K;
  const int j0 = tile * Bc, cols = min(Bc, S - j0);
  const int64_t q_stride = static_cast<int64_t>(H) * d, kv_stride = static_cast<int64_t>(K) * d;
  const int32_t* sequence_positions = positions + static_cast<int64_t>(b) * S;                         // [S]
  const int32_t* sequence_segments = segment_ids == nullptr ? nullptr : segment_ids + int64_t{b} * S;  // [S]
  const int64_t kv_offset = ((static_cast<int64_t>(b) * S + j0) * K + g) * d;  // key row j0, kv head g

  load_tile<D, Bc>(k_tile, k + kv_offset, kv_stride, cols, d);
  load_tile<D, Bc>(v_tile, v + kv_offset, kv_stride, cols, d);
  // This thread's key columns of the score layout.
  bool key_valid[N];
  int key_position[N], key_segment[N];
  load_tile_tokens<N>(key_valid, key_position, key_segment, sequence_positions, sequence_segments, j0, cols,
                      tx, INT_MAX);
  const Bounds key_bounds = tile_bounds(sequence_positions, sequence_segments, j0, cols);

  // Output layout: key rows ty + 16 n, columns tx + 16 x.
  float dk_sum[N][X], dv_sum[N][X];
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int x = 0; x < X; ++x) dk_sum[n][x] = dv_sum[n][x] = 0.0f;
  }

  const int query_tiles = (S + Br - 1) / Br;
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const float* head_lse = lse + (static_cast<int64_t>(b) * H + h) * S;      // [S]
    const float* head_dot = row_dot + (static_cast<int64_t>(b) * H + h) * S;  // [S]
    for (int query_tile = 0; query_tile < query_tiles; ++query_tile) {
      const int i0 = query_tile * Br, rows = min(Br, S - i0);
      if (fully_masked(tile_bounds(sequence_positions, sequence_segments, i0, rows), key_bounds)) continue;
      __syncthreads();  // the previous pair's reads of q_tile, dout_tile, probs, dscores, query_* are done
      const int64_t q_offset = ((static_cast<int64_t>(b) * S + i0) * H + h) * d;  // query row i0, head h
      load_tile<D, Br>(q_tile, q + q_offset, q_stride, rows, d);
      load_tile<D, Br>(dout_tile, dout + q_offset, q_stride, rows, d);
      for (int r = static_cast<int>(threadIdx.x); r < Br; r += kThreads) {
        const bool valid = r < rows;
        query_positions[r] = valid ? sequence_positions[i0 + r] : INT_MIN;
        query_segments[r] = valid && sequence_segments != nullptr ? sequence_segments[i0 + r] : 0;
        query_lse[r] = valid ? head_lse[i0 + r] : 0.0f;
        query_dot[r] = valid ? head_dot[i0 + r] : 0.0f;
      }
      __syncthreads();  // query tiles (and, the first time, k_tile and v_tile) loaded

      float scores[M][N], dprobs[M][N];
      score_pair<D, M, N>(scores, dprobs, q_tile, dout_tile, k_tile, v_tile, tx, ty);
      // P = exp(scale s - lse), dS = scale P (dp - row_dot); masked pairs (and padding rows) give 0.
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const int r = ty + kSide * m;
        const bool row_valid = r < rows;
        const int position = query_positions[r], segment = query_segments[r];
        const float row_lse = query_lse[r], dot = query_dot[r];
#pragma unroll
        for (int n = 0; n < N; ++n) {
          const bool visible =
              row_valid && key_valid[n] && key_position[n] <= position && key_segment[n] == segment;
          const float p = visible ? expf(scores[m][n] * scale - row_lse) : 0.0f;
          probs[r * PB + tx + kSide * n] = p;
          dscores[r * PB + tx + kSide * n] = scale * p * (dprobs[m][n] - dot);
        }
      }
      __syncthreads();  // probs and dscores written

      // dv_j += sum_i P_ij dout_i, dk_j += sum_i dS_ij q_i (padding rows hold P = dS = 0).
#pragma unroll 2
      for (int r = 0; r < Br; ++r) {
        float p[N], ds[N], grad[X], query[X];
#pragma unroll
        for (int n = 0; n < N; ++n) {
          p[n] = probs[r * PB + ty + kSide * n];
          ds[n] = dscores[r * PB + ty + kSide * n];
        }
#pragma unroll
        for (int x = 0; x < X; ++x) {
          grad[x] = dout_tile[r * P + tx + kSide * x];
          query[x] = q_tile[r * P + tx + kSide * x];
        }
#pragma unroll
        for (int n = 0; n < N; ++n) {
#pragma unroll
          for (int x = 0; x < X; ++x) {
            dv_sum[n][x] = fmaf(p[n], grad[x], dv_sum[n][x]);
            dk_sum[n][x] = fmaf(ds[n], query[x], dk_sum[n][x]);
          }
        }
      }
    }
  }

  // Written (=) for every key of the tile, 0 where no query sees it.
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int c = ty + kSide * n;
    if (c >= cols) continue;
#pragma unroll
    for (int x = 0; x < X; ++x) {
      const int column = tx + kSide * x;
      if (column >= d) continue;
      dk[kv_offset + c * kv_stride + column] = dk_sum[n][x];
      dv[kv_offset + c * kv_stride + column] = dv_sum[n][x];
    }
  }
}

// Shared memory of the dq kernel: q, dout, k, v tiles, dS, and the key tile's positions and segments.
template <int D, int Br, int Bc>
constexpr size_t dq_shared_bytes() {
  return sizeof(float) * (2 * Br * (D + 1) + 2 * Bc * (D + 1) + Br * (Bc + 1)) + sizeof(int) * 2 * Bc;
}

// dq of one query tile of one query head: one block per (query tile, query head, batch), later query tiles
// first, looping over the key tiles in order (deterministic).
template <int D, int Br, int Bc>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(float* __restrict__ dq, const float* __restrict__ dout, const float* __restrict__ lse,
              const float* __restrict__ row_dot, const float* __restrict__ q, const float* __restrict__ k,
              const float* __restrict__ v, const int32_t* __restrict__ positions,
              const int32_t* __restrict__ segment_ids, int S, int H, int K, int d, float scale) {
  constexpr int M = Br / kSide, N = Bc / kSide, X = D / kSide, P = D + 1, PB = Bc + 1;
  extern __shared__ float shared[];
  float* q_tile = shared;                                          // [Br, D + 1]
  float* dout_tile = q_tile + Br * P;                              // [Br, D + 1]
  float* k_tile = dout_tile + Br * P;                              // [Bc, D + 1]
  float* v_tile = k_tile + Bc * P;                                 // [Bc, D + 1]
  float* dscores = v_tile + Bc * P;                                // [Br, Bc + 1]
  int* key_positions = reinterpret_cast<int*>(dscores + Br * PB);  // [Bc]
  int* key_segments = key_positions + Bc;                          // [Bc]

  const auto [tx, ty, h, b, g, i0, rows, q_stride, kv_stride, q_offset, kv_offset, sequence_positions,
              sequence_segments] = query_tile_block<Br>(positions, segment_ids, S, H, K, d);
  const float* k_rows = k + kv_offset;                                      // row j at + j * kv_stride
  const float* v_rows = v + kv_offset;                                      // row j at + j * kv_stride
  const float* head_lse = lse + (static_cast<int64_t>(b) * H + h) * S;      // [S]
  const float* head_dot = row_dot + (static_cast<int64_t>(b) * H + h) * S;  // [S]

  load_tile<D, Br>(q_tile, q + q_offset, q_stride, rows, d);
  load_tile<D, Br>(dout_tile, dout + q_offset, q_stride, rows, d);
  bool row_valid[M];
  int row_position[M], row_segment[M];
  load_tile_tokens<M>(row_valid, row_position, row_segment, sequence_positions, sequence_segments, i0, rows,
                      ty, INT_MIN);
  float row_lse[M], row_dot_value[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int r = ty + kSide * m;
    row_lse[m] = row_valid[m] ? head_lse[i0 + r] : 0.0f;
    row_dot_value[m] = row_valid[m] ? head_dot[i0 + r] : 0.0f;
  }
  const Bounds query_bounds = tile_bounds(sequence_positions, sequence_segments, i0, rows);

  float dq_sum[M][X];
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int x = 0; x < X; ++x) dq_sum[m][x] = 0.0f;
  }

  const int key_tiles = (S + Bc - 1) / Bc;
  for (int key_tile = 0; key_tile < key_tiles; ++key_tile) {
    const int j0 = key_tile * Bc, cols = min(Bc, S - j0);
    if (fully_masked(query_bounds, tile_bounds(sequence_positions, sequence_segments, j0, cols))) continue;
    __syncthreads();  // the previous tile's reads of k_tile, v_tile, dscores and key positions are done
    stage_key_tile<D, Bc>(k_tile, v_tile, key_positions, key_segments, k_rows, v_rows, kv_stride, j0, cols, d,
                          sequence_positions, sequence_segments);
    __syncthreads();  // key tiles (and, the first time, q_tile and dout_tile) loaded

    float scores[M][N], dprobs[M][N];
    score_pair<D, M, N>(scores, dprobs, q_tile, dout_tile, k_tile, v_tile, tx, ty);
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const int c = tx + kSide * n;
        const bool visible = row_valid[m] && c < cols && key_positions[c] <= row_position[m] &&
                             key_segments[c] == row_segment[m];
        const float p = visible ? expf(scores[m][n] * scale - row_lse[m]) : 0.0f;
        dscores[(ty + kSide * m) * PB + c] = scale * p * (dprobs[m][n] - row_dot_value[m]);
      }
    }
    __syncthreads();  // dscores written

    // dq_i += sum_j dS_ij k_j (padding keys hold dS = 0 and zero k rows).
#pragma unroll 4
    for (int c = 0; c < Bc; ++c) {
      float ds[M], key[X];
#pragma unroll
      for (int m = 0; m < M; ++m) ds[m] = dscores[(ty + kSide * m) * PB + c];
#pragma unroll
      for (int x = 0; x < X; ++x) key[x] = k_tile[c * P + tx + kSide * x];
#pragma unroll
      for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int x = 0; x < X; ++x) dq_sum[m][x] = fmaf(ds[m], key[x], dq_sum[m][x]);
      }
    }
  }

  // Written (=) for every query row of the tile.
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int r = ty + kSide * m;
    if (r >= rows) continue;
#pragma unroll
    for (int x = 0; x < X; ++x) {
      const int column = tx + kSide * x;
      if (column < d) dq[q_offset + r * q_stride + column] = dq_sum[m][x];
    }
  }
}

// Tile shapes per width bucket: the forward keeps Br = 64 and narrows Bc for wide heads, the backward uses
// 64 x 64 tiles up to D = 64 and 32 x 32 above, so shared memory stays within one H100 / H200 block's 227 KB
// (largest: D = 256, about 140 KB) and the per-thread accumulators within 64 registers.
template <int D>
struct Tiles {
  static constexpr int forward_rows = 64, forward_cols = D <= 64 ? 64 : 32;
  static constexpr int backward_rows = D <= 64 ? 64 : 32, backward_cols = D <= 64 ? 64 : 32;
};

template <int D>
void forward_launch(float* out, float* lse, const float* q, const float* k, const float* v,
                    const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S, int64_t H,
                    int64_t K, int64_t d) {
  constexpr int Br = Tiles<D>::forward_rows, Bc = Tiles<D>::forward_cols;
  constexpr size_t bytes = forward_shared_bytes<D, Br, Bc>();
  static const bool allowed = (allow_shared_memory(forward_kernel<D, Br, Bc>, bytes), true);
  static_cast<void>(allowed);
  const dim3 grid(static_cast<unsigned>((S + Br - 1) / Br), static_cast<unsigned>(H),
                  static_cast<unsigned>(B));
  forward_kernel<D, Br, Bc><<<grid, kThreads, bytes, stream()>>>(
      out, lse, q, k, v, positions, segment_ids, static_cast<int>(S), static_cast<int>(H),
      static_cast<int>(K), static_cast<int>(d), 1.0f / std::sqrt(static_cast<float>(d)));
  MT_CUDA_LAUNCHED("attention_forward");
}

template <int D>
void backward_launch(float* dq, float* dk, float* dv, const float* dout, const float* lse,
                     const float* row_dot, const float* q, const float* k, const float* v,
                     const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S, int64_t H,
                     int64_t K, int64_t d) {
  constexpr int Br = Tiles<D>::backward_rows, Bc = Tiles<D>::backward_cols;
  constexpr size_t dkdv_bytes = dkdv_shared_bytes<D, Br, Bc>(), dq_bytes = dq_shared_bytes<D, Br, Bc>();
  static const bool allowed = (allow_shared_memory(dkdv_kernel<D, Br, Bc>, dkdv_bytes),
                               allow_shared_memory(dq_kernel<D, Br, Bc>, dq_bytes), true);
  static_cast<void>(allowed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const dim3 dkdv_grid(static_cast<unsigned>((S + Bc - 1) / Bc), static_cast<unsigned>(K),
                       static_cast<unsigned>(B));
  dkdv_kernel<D, Br, Bc><<<dkdv_grid, kThreads, dkdv_bytes, stream()>>>(
      dk, dv, dout, lse, row_dot, q, k, v, positions, segment_ids, static_cast<int>(S), static_cast<int>(H),
      static_cast<int>(K), static_cast<int>(d), scale);
  MT_CUDA_LAUNCHED("attention_backward (dk, dv)");
  const dim3 dq_grid(static_cast<unsigned>((S + Br - 1) / Br), static_cast<unsigned>(H),
                     static_cast<unsigned>(B));
  dq_kernel<D, Br, Bc><<<dq_grid, kThreads, dq_bytes, stream()>>>(
      dq, dout, lse, row_dot, q, k, v, positions, segment_ids, static_cast<int>(S), static_cast<int>(H),
      static_cast<int>(K), static_cast<int>(d), scale);
  MT_CUDA_LAUNCHED("attention_backward (dq)");
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S, int64_t H,
                       int64_t K, int64_t d) {
  check_shape(B, S, H, K, d);
  if (B == 0 || S == 0 || H == 0) return;
  if (d <= 32) {
    forward_launch<32>(out, lse, q, k, v, positions, segment_ids, B, S, H, K, d);
  } else if (d <= 64) {
    forward_launch<64>(out, lse, q, k, v, positions, segment_ids, B, S, H, K, d);
  } else if (d <= 128) {
    forward_launch<128>(out, lse, q, k, v, positions, segment_ids, B, S, H, K, d);
  } else {
    forward_launch<256>(out, lse, q, k, v, positions, segment_ids, B, S, H, K, d);
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S, int64_t H,
                        int64_t K, int64_t d, float* scratch) {
  check_shape(B, S, H, K, d);
  if (B == 0 || S == 0 || H == 0) return;
  // scratch [B, H, S] = rowsum(dout * out), the D_i of the softmax backward.
  float* row_dot = scratch;
  row_dot_launch(row_dot, dout, out, B, S, H, d);
  if (d <= 32) {
    backward_launch<32>(dq, dk, dv, dout, lse, row_dot, q, k, v, positions, segment_ids, B, S, H, K, d);
  } else if (d <= 64) {
    backward_launch<64>(dq, dk, dv, dout, lse, row_dot, q, k, v, positions, segment_ids, B, S, H, K, d);
  } else if (d <= 128) {
    backward_launch<128>(dq, dk, dv, dout, lse, row_dot, q, k, v, positions, segment_ids, B, S, H, K, d);
  } else {
    backward_launch<256>(dq, dk, dv, dout, lse, row_dot, q, k, v, positions, segment_ids, B, S, H, K, d);
  }
}

}  // namespace meshtrain::kernels::cuda
