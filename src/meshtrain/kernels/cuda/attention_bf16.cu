// Causal grouped-query attention with bf16 products on the tensor cores (dtype=bfloat16), flash-attention-2
// style: a forward keeping the log-sum-exp, and a deterministic backward (no atomics) that recomputes the
// scores, one kernel for dk, dv per key tile and one for dq per query tile, as the float32 attention.cu does.
// Legend: B batch, S sequence, H query heads, K kv heads (H divisible by K), d head width, D the width
// bucket d is zero-padded to (64 or 128), Br / Bc query / key tile rows. Shapes as attention.cu's.
//
// Rounding points are the cpu bf16 kernels' (kernels/cpu/attention.cpp, "bf16 products"): q, k, v and dout
// are rounded to bf16 (nearest even) when staged in shared memory; P is rounded for out = P v and dv = P^T
// dout, dS for dq = dS k and dk = dS^T q; every product accumulates in float32; the softmax statistics, lse,
// rowsum(dout * out) and the scaling stay float32 (P and dS are formed from float32 scores). One difference
// the cpu cannot have: an mma adds its products to the accumulator with the tensor core's own alignment and
// rounding, not one IEEE float32 addition at a time; that is float32-level error, which the tests' bound
// allows for (tests/unit/kernels/attention_bf16_bound.h: 2^-18 of the magnitudes).
//
// Products: mma.sync.aligned.m16n8k16 (bf16 x bf16 + float32, sm_80 and later) in inline PTX rather than
// nvcuda::wmma: the PTX ISA documents which thread holds which element of each fragment, so the scores'
// accumulator fragment is masked element by element and reused, as bf16 pairs, as the A operand of the next
// product (P v, dS k) without a trip through shared memory; wmma's fragment layout is unspecified.
// Fragments of m16n8k16 (lane = 4 group + quad; a .b32 register holds two bf16, the lower index low):
//   A [16 x 16] row-major: a0 (row group, columns 2 quad, +1), a1 (row group + 8, same columns),
//                          a2 (row group, columns 8 + 2 quad, +1), a3 (row group + 8, those columns);
//   B [16 x 8]: b0 (rows 2 quad, +1 of column group), b1 (rows 8 + 2 quad, +1 of column group);
//   C [16 x 8] float32: c0, c1 (row group, columns 2 quad, +1), c2, c3 (row group + 8, same columns).
// B is read from a shared tile stored [n][k] (k contiguous), so both of its bf16 are one 32-bit word: the
// tiles a product reduces over tokens (v, dout, q, k for P v, P^T dout, dS^T q, dS k) are also staged
// transposed. Shared rows are padded by 8 bf16 (16 bytes) so the fragment reads of the 8 groups of a warp
// hit distinct banks.
//
// Each warp owns 16 rows of the block's tile (queries in the forward and dq kernels, keys in dk / dv), so
// row reductions are two shuffles among the 4 threads of a group. Every sum runs in a fixed order.
// Masking and the tile skip as attention.cu (attention_tiles.cuh).
#include <cuda_bf16.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cuda/attention.h"
#include "meshtrain/kernels/cuda/attention_tiles.cuh"
#include "meshtrain/kernels/cuda/device.h"

namespace meshtrain::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kBf16Threads = 32 * kWarps;
constexpr int kWarpRows = 16;                 // rows of a tile per warp (the m of m16n8k16)
constexpr int kOwnRows = kWarpRows * kWarps;  // 64: the tile each block owns (queries or keys)
constexpr int kVisitedRows = 32;              // the tile the backward kernels loop over
constexpr int kPad = 8;                       // bf16 of padding per shared row
constexpr int kMaxTensorCoreWidth = 128;      // wider heads run the float32 kernels (see the entries)

// A shared tile of R rows of `width` bf16, row stride width + kPad; word(r, w) is the 32-bit pair of bf16
// at columns 2w, 2w + 1 of row r.
struct SharedTile {
  __nv_bfloat16* data;
  int stride;
  __device__ uint32_t word(int r, int w) const {
    return *reinterpret_cast<const uint32_t*>(data + r * stride + 2 * w);
  }
};

// Rows [0, count) x columns [0, d) of a strided float32 source, rounded to bf16 (nearest even), into
// `rows` [R][width] and / or `columns` [width][R] (its transpose), each when given; rows >= count and
// columns >= d are 0, so padding adds exact zeros to every product.
__device__ void stage_tokens(const SharedTile* rows, const SharedTile* columns, const float* __restrict__ src,
                             int64_t stride, int count, int d, int R, int width) {
  for (int index = static_cast<int>(threadIdx.x); index < R * width; index += kBf16Threads) {
    const int r = index / width, x = index % width;
    const __nv_bfloat16 value = __float2bfloat16_rn(r < count && x < d ? src[r * stride + x] : 0.0f);
    if (rows != nullptr) rows->data[r * rows->stride + x] = value;
    if (columns != nullptr) columns->data[x * columns->stride + r] = value;
  }
}

// The positions and segment ids of tokens [first, first + count) into shared arrays of R; padding tokens get
// `padding_position` (INT_MIN for a query: it sees no key; INT_MAX for a key: no query sees it).
__device__ void stage_token_ids(int* positions, int* segments, const int32_t* sequence_positions,
                                const int32_t* sequence_segments, int first, int count, int R,
                                int padding_position) {
  for (int t = static_cast<int>(threadIdx.x); t < R; t += kBf16Threads) {
    positions[t] = t < count ? sequence_positions[first + t] : padding_position;
    segments[t] = t < count && sequence_segments != nullptr ? sequence_segments[first + t] : 0;
  }
}

// c += a b on the tensor cores: one m16n8k16 bf16 product with float32 accumulation.
__device__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // Never launched below sm_80 (tensor_cores_available); the trap makes a mistake loud, not wrong.
  static_cast<void>(c), static_cast<void>(a), static_cast<void>(b0), static_cast<void>(b1);
  __trap();
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two floats as one register of bf16 (nearest even), the first in the low half.
__device__ uint32_t pack_bf16(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// scores [N][4] (C fragments, 16 rows x 8 N columns) = rows r0.. of `a` times rows 0.. of `b`, both tiles
// [.][Width] in row layout: score(r, n) = sum over the width of a(r0 + r, x) b(n, x).
template <int N, int Width>
__device__ void product_rows(float (&scores)[N][4], SharedTile a, int r0, SharedTile b, int group, int quad) {
#pragma unroll
  for (int n = 0; n < N; ++n) scores[n][0] = scores[n][1] = scores[n][2] = scores[n][3] = 0.0f;
#pragma unroll
  for (int chunk = 0; chunk < Width / 16; ++chunk) {
    const uint32_t fragment[4] = {
        a.word(r0 + group, 8 * chunk + quad), a.word(r0 + group + 8, 8 * chunk + quad),
        a.word(r0 + group, 8 * chunk + 4 + quad), a.word(r0 + group + 8, 8 * chunk + 4 + quad)};
#pragma unroll
    for (int n = 0; n < N; ++n) {
      mma_bf16(scores[n], fragment, b.word(8 * n + group, 8 * chunk + quad),
               b.word(8 * n + group, 8 * chunk + 4 + quad));
    }
  }
}

// accumulator [Width / 8][4] (C fragments, 16 rows x Width columns) += coefficients [16 x 8 N] (C
// fragments, rounded to bf16 here) times the first 8 N tokens of `columns` (a transposed tile
// [Width][tokens]).
template <int N, int Width>
__device__ void accumulate_product(float (&accumulator)[Width / 8][4], const float (&coefficients)[N][4],
                                   SharedTile columns, int group, int quad) {
  static_assert(N % 2 == 0, "tokens are reduced 16 at a time");
#pragma unroll
  for (int chunk = 0; chunk < N / 2; ++chunk) {
    // Two n-tiles of C fragments are one A fragment: keys 16 chunk + 2 quad (+1) and 16 chunk + 8 + 2 quad.
    const uint32_t fragment[4] = {pack_bf16(coefficients[2 * chunk][0], coefficients[2 * chunk][1]),
                                  pack_bf16(coefficients[2 * chunk][2], coefficients[2 * chunk][3]),
                                  pack_bf16(coefficients[2 * chunk + 1][0], coefficients[2 * chunk + 1][1]),
                                  pack_bf16(coefficients[2 * chunk + 1][2], coefficients[2 * chunk + 1][3])};
    const int word = 8 * chunk;  // tokens 16 chunk..
#pragma unroll
    for (int x = 0; x < Width / 8; ++x) {
      mma_bf16(accumulator[x], fragment, columns.word(8 * x + group, word + quad),
               columns.word(8 * x + group, word + 4 + quad));
    }
  }
}

// Sum and max over the 4 threads of a group (one row of a C fragment).
__device__ float group_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}
__device__ float group_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

// The lse the backward subtracts: a query that saw no key (lse -inf) gets +inf, so each of its probabilities
// is exactly 0 (as the cpu kernels' backward_lse).
__device__ float backward_lse(float lse) {
  return lse == -INFINITY ? INFINITY : lse;
}

// Where one block works and this thread's place in its warp.
struct Place {
  int warp, group, quad;  // warp of the block; lane = 4 group + quad
  int b, g;               // batch, kv head
  int64_t q_stride, kv_stride;
  const int32_t* sequence_positions;  // [S] of this sequence
  const int32_t* sequence_segments;   // [S] of this sequence, or nullptr
};

__device__ Place place_of(int b, int g, const int32_t* positions, const int32_t* segment_ids, int S, int H,
                          int K, int d) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  return Place{static_cast<int>(threadIdx.x) / 32,
               lane / 4,
               lane % 4,
               b,
               g,
               static_cast<int64_t>(H) * d,
               static_cast<int64_t>(K) * d,
               positions + static_cast<int64_t>(b) * S,
               segment_ids == nullptr ? nullptr : segment_ids + static_cast<int64_t>(b) * S};
}

// A block of the forward or dq kernel: query tile `blockIdx.x` (later tiles first: they see more keys) of Br
// rows of query head h = blockIdx.y of sequence b = blockIdx.z.
struct QueryTilePlace {
  Place at;
  int h, i0, rows;    // query head, the tile's first row and its number of rows
  int64_t q_offset;   // q row i0 of head h
  int64_t kv_offset;  // k / v row 0 of this sequence's kv head
};

__device__ QueryTilePlace query_tile_place(int Br, const int32_t* positions, const int32_t* segment_ids,
                                           int S, int H, int K, int d) {
  const int h = static_cast<int>(blockIdx.y);
  const Place at = place_of(static_cast<int>(blockIdx.z), h / (H / K), positions, segment_ids, S, H, K, d);
  const int i0 = static_cast<int>(gridDim.x - 1 - blockIdx.x) * Br;
  return QueryTilePlace{at,
                        h,
                        i0,
                        min(Br, S - i0),
                        ((static_cast<int64_t>(at.b) * S + i0) * H + h) * d,
                        (static_cast<int64_t>(at.b) * S * K + at.g) * d};
}

// Shared rows and transposed tiles, in bf16 elements.
constexpr int row_stride(int width) {
  return width + kPad;
}
constexpr int column_stride(int tokens) {
  return tokens + kPad;
}

// This warp's 16 rows of a C-fragment accumulator [Width / 8][4] (rows 16 warp + group + 8 half, columns
// 8 x + 2 quad (+1)), each row times factor[half], into rows of dst (stride `stride`): rows below `count` and
// columns below d only.
template <int Width>
__device__ void store_rows(float* __restrict__ dst, int64_t stride, const float (&accumulator)[Width / 8][4],
                           const float (&factor)[2], int count, int d, const Place& at) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = kWarpRows * at.warp + at.group + 8 * half;
    if (r >= count) continue;
#pragma unroll
    for (int x = 0; x < Width / 8; ++x) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int column = 8 * x + 2 * at.quad + e;
        if (column < d) dst[r * stride + column] = accumulator[x][2 * half + e] * factor[half];
      }
    }
  }
}

// ---- forward ----

// Shared memory of the forward: q rows [Br][D], k rows [Bc][D], v transposed [D][Bc], key ids [2 Bc].
template <int D>
constexpr size_t forward_shared_bytes() {
  return sizeof(__nv_bfloat16) * (2 * kOwnRows * row_stride(D) + D * column_stride(kOwnRows)) +
         sizeof(int) * 2 * kOwnRows;
}

// One block per (query tile of Br = 64, query head, batch): grid (query tiles, H, B), later tiles first.
// Warp w owns query rows 16 w.. of the tile; key tiles of Bc = 64.
template <int D>
__global__ void __launch_bounds__(kBf16Threads)
    forward_kernel(float* __restrict__ out, float* __restrict__ lse, const float* __restrict__ q,
                   const float* __restrict__ k, const float* __restrict__ v,
                   const int32_t* __restrict__ positions, const int32_t* __restrict__ segment_ids, int S,
                   int H, int K, int d, float scale) {
  constexpr int Br = kOwnRows, Bc = kOwnRows, N = Bc / 8, X = D / 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  auto* shared = reinterpret_cast<__nv_bfloat16*>(shared_bytes);
  const SharedTile q_rows{shared, row_stride(D)};                                       // [Br][D]
  const SharedTile k_rows{q_rows.data + Br * row_stride(D), row_stride(D)};             // [Bc][D]
  const SharedTile v_columns{k_rows.data + Bc * row_stride(D), column_stride(Bc)};      // [D][Bc]
  int* key_positions = reinterpret_cast<int*>(v_columns.data + D * column_stride(Bc));  // [Bc]
  int* key_segments = key_positions + Bc;                                               // [Bc]

  const auto [at, h, i0, rows, q_offset, kv_offset] =
      query_tile_place(Br, positions, segment_ids, S, H, K, d);
  stage_tokens(&q_rows, nullptr, q + q_offset, at.q_stride, rows, d, Br, D);

  // This thread's two query rows: r = 16 warp + group + 8 half.
  int row_position[2], row_segment[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = kWarpRows * at.warp + at.group + 8 * half;
    row_position[half] = r < rows ? at.sequence_positions[i0 + r] : INT_MIN;
    row_segment[half] = r < rows && at.sequence_segments != nullptr ? at.sequence_segments[i0 + r] : 0;
  }
  const Bounds query_bounds = tile_bounds(at.sequence_positions, at.sequence_segments, i0, rows);

  float accumulator[X][4];  // out rows x columns 8 x + 2 quad (+1), unnormalised
#pragma unroll
  for (int x = 0; x < X; ++x)
    accumulator[x][0] = accumulator[x][1] = accumulator[x][2] = accumulator[x][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  const int key_tiles = (S + Bc - 1) / Bc;
  for (int key_tile = 0; key_tile < key_tiles; ++key_tile) {
    const int j0 = key_tile * Bc, cols = min(Bc, S - j0);
    if (fully_masked(query_bounds, tile_bounds(at.sequence_positions, at.sequence_segments, j0, cols)))
      continue;
    __syncthreads();  // the previous tile's reads of k_rows, v_columns and the key ids are done
    stage_tokens(&k_rows, nullptr, k + kv_offset + j0 * at.kv_stride, at.kv_stride, cols, d, Bc, D);
    stage_tokens(nullptr, &v_columns, v + kv_offset + j0 * at.kv_stride, at.kv_stride, cols, d, Bc, D);
    stage_token_ids(key_positions, key_segments, at.sequence_positions, at.sequence_segments, j0, cols, Bc,
                    INT_MAX);
    __syncthreads();  // tiles (and, the first time, q_rows) staged

    float scores[N][4];
    product_rows<N, D>(scores, q_rows, kWarpRows * at.warp, k_rows, at.group, at.quad);

    // Online softmax per query row: mask, new running max, rescale what earlier tiles accumulated.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < N; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * n + 2 * at.quad + e;  // padding keys have position INT_MAX: never visible
          const bool visible = key_positions[c] <= row_position[half] && key_segments[c] == row_segment[half];
          float& score = scores[n][2 * half + e];
          score = visible ? score * scale : -INFINITY;
          tile_max = fmaxf(tile_max, score);
        }
      }
      const float new_max = fmaxf(row_max[half], group_max(tile_max));
      const float shift = new_max == -INFINITY ? 0.0f : new_max;  // no visible key yet: sums stay 0
      const float alpha = expf(row_max[half] - shift);            // 1 when the max did not move
      row_max[half] = new_max;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < N; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& p = scores[n][2 * half + e];
          p = expf(p - shift);  // masked: exp(-inf) = 0
          sum += p;
        }
      }
      row_sum[half] = row_sum[half] * alpha + group_sum(sum);
#pragma unroll
      for (int x = 0; x < X; ++x) {
        accumulator[x][2 * half] *= alpha;
        accumulator[x][2 * half + 1] *= alpha;
      }
    }
    // out += P v (P rounded to bf16).
    accumulate_product<N, D>(accumulator, scores, v_columns, at.group, at.quad);
  }

  // row_sum == 0 only for a query that sees no key (never in self-attention): out 0, lse -inf.
  float inverse[2];
  float* lse_row = lse + (static_cast<int64_t>(at.b) * H + h) * S + i0;  // [rows]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = kWarpRows * at.warp + at.group + 8 * half;
    const bool seen = row_sum[half] > 0.0f;
    inverse[half] = seen ? 1.0f / row_sum[half] : 0.0f;
    if (r < rows && at.quad == 0) lse_row[r] = seen ? row_max[half] + logf(row_sum[half]) : -INFINITY;
  }
  store_rows<D>(out + q_offset, at.q_stride, accumulator, inverse, rows, d, at);
}

// ---- backward ----

// P = exp(scale s - lse) and dS = scale P (dp - row_dot) of one C fragment element, 0 where masked.
__device__ void probability_and_gradient(float& score, float& dprob, bool visible, float query_lse,
                                         float query_dot, float scale) {
  const float p = visible ? expf(score * scale - query_lse) : 0.0f;
  dprob = scale * p * (dprob - query_dot);
  score = p;
}

// Shared memory of the dk / dv kernel: k, v rows [Bc][D]; q, dout rows [Br][D]; q, dout transposed
// [D][Br]; the query tile's positions, segments, lse and row_dot [Br] each.
template <int D>
constexpr size_t dkdv_shared_bytes() {
  return sizeof(__nv_bfloat16) * (2 * kOwnRows * row_stride(D) + 2 * kVisitedRows * row_stride(D) +
                                  2 * D * column_stride(kVisitedRows)) +
         4 * sizeof(float) * kVisitedRows;
}

// dk, dv of one key tile (Bc = 64) of one kv head: one block per (key tile, kv head, batch); warp w owns key
// rows 16 w.. of the tile. Loops over the group's query heads in order and, for each, over the query tiles
// (Br = 32) in order: a fixed summation order, deterministic.
template <int D>
__global__ void __launch_bounds__(kBf16Threads)
    dkdv_kernel(float* __restrict__ dk, float* __restrict__ dv, const float* __restrict__ dout,
                const float* __restrict__ lse, const float* __restrict__ row_dot, const float* __restrict__ q,
                const float* __restrict__ k, const float* __restrict__ v,
                const int32_t* __restrict__ positions, const int32_t* __restrict__ segment_ids, int S, int H,
                int K, int d, float scale) {
  constexpr int Bc = kOwnRows, Br = kVisitedRows, N = Br / 8, X = D / 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  auto* shared = reinterpret_cast<__nv_bfloat16*>(shared_bytes);
  const SharedTile k_rows{shared, row_stride(D)};                                            // [Bc][D]
  const SharedTile v_rows{k_rows.data + Bc * row_stride(D), row_stride(D)};                  // [Bc][D]
  const SharedTile q_rows{v_rows.data + Bc * row_stride(D), row_stride(D)};                  // [Br][D]
  const SharedTile dout_rows{q_rows.data + Br * row_stride(D), row_stride(D)};               // [Br][D]
  const SharedTile q_columns{dout_rows.data + Br * row_stride(D), column_stride(Br)};        // [D][Br]
  const SharedTile dout_columns{q_columns.data + D * column_stride(Br), column_stride(Br)};  // [D][Br]
  float* query_lse = reinterpret_cast<float*>(dout_columns.data + D * column_stride(Br));    // [Br]
  float* query_dot = query_lse + Br;                                                         // [Br]
  int* query_positions = reinterpret_cast<int*>(query_dot + Br);                             // [Br]
  int* query_segments = query_positions + Br;                                                // [Br]

  const Place at = place_of(static_cast<int>(blockIdx.z), static_cast<int>(blockIdx.y), positions,
                            segment_ids, S, H, K, d);
  const int group_size = H / K;
  const int j0 = static_cast<int>(blockIdx.x) * Bc, cols = min(Bc, S - j0);          // early key tiles first
  const int64_t kv_offset = ((static_cast<int64_t>(at.b) * S + j0) * K + at.g) * d;  // key row j0, head g
  stage_tokens(&k_rows, nullptr, k + kv_offset, at.kv_stride, cols, d, Bc, D);
  stage_tokens(&v_rows, nullptr, v + kv_offset, at.kv_stride, cols, d, Bc, D);
  // This thread's two key rows: c = 16 warp + group + 8 half.
  int key_position[2], key_segment[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int c = kWarpRows * at.warp + at.group + 8 * half;
    key_position[half] = c < cols ? at.sequence_positions[j0 + c] : INT_MAX;
    key_segment[half] = c < cols && at.sequence_segments != nullptr ? at.sequence_segments[j0 + c] : 0;
  }
  const Bounds key_bounds = tile_bounds(at.sequence_positions, at.sequence_segments, j0, cols);

  float dk_sum[X][4], dv_sum[X][4];  // key rows x columns 8 x + 2 quad (+1)
#pragma unroll
  for (int x = 0; x < X; ++x) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_sum[x][e] = dv_sum[x][e] = 0.0f;
  }

  const int query_tiles = (S + Br - 1) / Br;
  for (int h = at.g * group_size; h < (at.g + 1) * group_size; ++h) {
    const float* head_lse = lse + (static_cast<int64_t>(at.b) * H + h) * S;      // [S]
    const float* head_dot = row_dot + (static_cast<int64_t>(at.b) * H + h) * S;  // [S]
    for (int query_tile = 0; query_tile < query_tiles; ++query_tile) {
      const int i0 = query_tile * Br, rows = min(Br, S - i0);
      if (fully_masked(tile_bounds(at.sequence_positions, at.sequence_segments, i0, rows), key_bounds))
        continue;
      __syncthreads();  // the previous pair's reads of the query tiles and ids are done
      const int64_t q_offset = ((static_cast<int64_t>(at.b) * S + i0) * H + h) * d;  // query row i0, head h
      stage_tokens(&q_rows, &q_columns, q + q_offset, at.q_stride, rows, d, Br, D);
      stage_tokens(&dout_rows, &dout_columns, dout + q_offset, at.q_stride, rows, d, Br, D);
      stage_token_ids(query_positions, query_segments, at.sequence_positions, at.sequence_segments, i0, rows,
                      Br, INT_MIN);
      for (int r = static_cast<int>(threadIdx.x); r < Br; r += kBf16Threads) {
        query_lse[r] = r < rows ? backward_lse(head_lse[i0 + r]) : INFINITY;
        query_dot[r] = r < rows ? head_dot[i0 + r] : 0.0f;
      }
      __syncthreads();  // query tiles (and, the first time, k_rows and v_rows) staged

      // S^T = k q^T and dP^T = v dout^T: key rows x query columns.
      float probs[N][4], dscores[N][4];
      product_rows<N, D>(probs, k_rows, kWarpRows * at.warp, q_rows, at.group, at.quad);
      product_rows<N, D>(dscores, v_rows, kWarpRows * at.warp, dout_rows, at.group, at.quad);
#pragma unroll
      for (int n = 0; n < N; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e / 2, r = 8 * n + 2 * at.quad + e % 2;  // padding queries: position INT_MIN
          const bool visible =
              key_position[half] <= query_positions[r] && key_segment[half] == query_segments[r];
          probability_and_gradient(probs[n][e], dscores[n][e], visible, query_lse[r], query_dot[r], scale);
        }
      }
      // dv += P^T dout, dk += dS^T q (P, dS rounded to bf16).
      accumulate_product<N, D>(dv_sum, probs, dout_columns, at.group, at.quad);
      accumulate_product<N, D>(dk_sum, dscores, q_columns, at.group, at.quad);
    }
  }

  // Written (=) for every key of the tile, 0 where no query sees it.
  constexpr float kOnes[2] = {1.0f, 1.0f};
  store_rows<D>(dk + kv_offset, at.kv_stride, dk_sum, kOnes, cols, d, at);
  store_rows<D>(dv + kv_offset, at.kv_stride, dv_sum, kOnes, cols, d, at);
}

// Shared memory of the dq kernel: q, dout rows [Br][D]; k, v rows [Bc][D]; k transposed [D][Bc]; the key
// tile's positions and segments [Bc] each.
template <int D>
constexpr size_t dq_shared_bytes() {
  return sizeof(__nv_bfloat16) * (2 * kOwnRows * row_stride(D) + 2 * kVisitedRows * row_stride(D) +
                                  D * column_stride(kVisitedRows)) +
         2 * sizeof(int) * kVisitedRows;
}

// dq of one query tile (Br = 64) of one query head: one block per (query tile, query head, batch), later
// tiles first; warp w owns query rows 16 w.. of the tile. Loops over the key tiles (Bc = 32) in order.
template <int D>
__global__ void __launch_bounds__(kBf16Threads)
    dq_kernel(float* __restrict__ dq, const float* __restrict__ dout, const float* __restrict__ lse,
              const float* __restrict__ row_dot, const float* __restrict__ q, const float* __restrict__ k,
              const float* __restrict__ v, const int32_t* __restrict__ positions,
              const int32_t* __restrict__ segment_ids, int S, int H, int K, int d, float scale) {
  constexpr int Br = kOwnRows, Bc = kVisitedRows, N = Bc / 8, X = D / 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  auto* shared = reinterpret_cast<__nv_bfloat16*>(shared_bytes);
  const SharedTile q_rows{shared, row_stride(D)};                                       // [Br][D]
  const SharedTile dout_rows{q_rows.data + Br * row_stride(D), row_stride(D)};          // [Br][D]
  const SharedTile k_rows{dout_rows.data + Br * row_stride(D), row_stride(D)};          // [Bc][D]
  const SharedTile v_rows{k_rows.data + Bc * row_stride(D), row_stride(D)};             // [Bc][D]
  const SharedTile k_columns{v_rows.data + Bc * row_stride(D), column_stride(Bc)};      // [D][Bc]
  int* key_positions = reinterpret_cast<int*>(k_columns.data + D * column_stride(Bc));  // [Bc]
  int* key_segments = key_positions + Bc;                                               // [Bc]

  const auto [at, h, i0, rows, q_offset, kv_offset] =
      query_tile_place(Br, positions, segment_ids, S, H, K, d);
  stage_tokens(&q_rows, nullptr, q + q_offset, at.q_stride, rows, d, Br, D);
  stage_tokens(&dout_rows, nullptr, dout + q_offset, at.q_stride, rows, d, Br, D);

  // This thread's two query rows: r = 16 warp + group + 8 half.
  int row_position[2], row_segment[2];
  float row_lse[2], row_dot_value[2];
  const float* head_lse = lse + (static_cast<int64_t>(at.b) * H + h) * S;      // [S]
  const float* head_dot = row_dot + (static_cast<int64_t>(at.b) * H + h) * S;  // [S]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = kWarpRows * at.warp + at.group + 8 * half;
    const bool valid = r < rows;
    row_position[half] = valid ? at.sequence_positions[i0 + r] : INT_MIN;
    row_segment[half] = valid && at.sequence_segments != nullptr ? at.sequence_segments[i0 + r] : 0;
    row_lse[half] = valid ? backward_lse(head_lse[i0 + r]) : INFINITY;
    row_dot_value[half] = valid ? head_dot[i0 + r] : 0.0f;
  }
  const Bounds query_bounds = tile_bounds(at.sequence_positions, at.sequence_segments, i0, rows);

  float dq_sum[X][4];  // query rows x columns 8 x + 2 quad (+1)
#pragma unroll
  for (int x = 0; x < X; ++x) dq_sum[x][0] = dq_sum[x][1] = dq_sum[x][2] = dq_sum[x][3] = 0.0f;

  const int key_tiles = (S + Bc - 1) / Bc;
  for (int key_tile = 0; key_tile < key_tiles; ++key_tile) {
    const int j0 = key_tile * Bc, cols = min(Bc, S - j0);
    if (fully_masked(query_bounds, tile_bounds(at.sequence_positions, at.sequence_segments, j0, cols)))
      continue;
    __syncthreads();  // the previous tile's reads of the key tiles and ids are done
    stage_tokens(&k_rows, &k_columns, k + kv_offset + j0 * at.kv_stride, at.kv_stride, cols, d, Bc, D);
    stage_tokens(&v_rows, nullptr, v + kv_offset + j0 * at.kv_stride, at.kv_stride, cols, d, Bc, D);
    stage_token_ids(key_positions, key_segments, at.sequence_positions, at.sequence_segments, j0, cols, Bc,
                    INT_MAX);
    __syncthreads();  // key tiles (and, the first time, q_rows and dout_rows) staged

    // S = q k^T and dP = dout v^T: query rows x key columns.
    float probs[N][4], dscores[N][4];
    product_rows<N, D>(probs, q_rows, kWarpRows * at.warp, k_rows, at.group, at.quad);
    product_rows<N, D>(dscores, dout_rows, kWarpRows * at.warp, v_rows, at.group, at.quad);
#pragma unroll
    for (int n = 0; n < N; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2, c = 8 * n + 2 * at.quad + e % 2;  // padding keys: position INT_MAX
        const bool visible = key_positions[c] <= row_position[half] && key_segments[c] == row_segment[half];
        probability_and_gradient(probs[n][e], dscores[n][e], visible, row_lse[half], row_dot_value[half],
                                 scale);
      }
    }
    // dq += dS k (dS rounded to bf16).
    accumulate_product<N, D>(dq_sum, dscores, k_columns, at.group, at.quad);
  }

  // Written (=) for every query row of the tile.
  constexpr float kOnes[2] = {1.0f, 1.0f};
  store_rows<D>(dq + q_offset, at.q_stride, dq_sum, kOnes, rows, d, at);
}

// ---- launches ----

// mma.sync with bf16 operands needs compute capability 8.0 (A100) or later; checked once per process.
bool tensor_cores_available() {
  static const bool available = [] {
    int device = 0, major = 0;
    MT_CUDA(cudaGetDevice(&device));
    MT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major >= 8;
  }();
  return available;
}

template <int D>
void forward_launch(float* out, float* lse, const float* q, const float* k, const float* v,
                    const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S, int64_t H,
                    int64_t K, int64_t d) {
  constexpr size_t bytes = forward_shared_bytes<D>();
  static const bool allowed = (allow_shared_memory(forward_kernel<D>, bytes), true);
  static_cast<void>(allowed);
  const dim3 grid(static_cast<unsigned>((S + kOwnRows - 1) / kOwnRows), static_cast<unsigned>(H),
                  static_cast<unsigned>(B));
  forward_kernel<D><<<grid, kBf16Threads, bytes, stream()>>>(
      out, lse, q, k, v, positions, segment_ids, static_cast<int>(S), static_cast<int>(H),
      static_cast<int>(K), static_cast<int>(d), 1.0f / std::sqrt(static_cast<float>(d)));
  MT_CUDA_LAUNCHED("attention_forward_bf16");
}

template <int D>
void backward_launch(float* dq, float* dk, float* dv, const float* dout, const float* lse,
                     const float* row_dot, const float* q, const float* k, const float* v,
                     const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S, int64_t H,
                     int64_t K, int64_t d) {
  constexpr size_t dkdv_bytes = dkdv_shared_bytes<D>(), dq_bytes = dq_shared_bytes<D>();
  static const bool allowed =
      (allow_shared_memory(dkdv_kernel<D>, dkdv_bytes), allow_shared_memory(dq_kernel<D>, dq_bytes), true);
  static_cast<void>(allowed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const unsigned own_tiles = static_cast<unsigned>((S + kOwnRows - 1) / kOwnRows);
  dkdv_kernel<D><<<dim3(own_tiles, static_cast<unsigned>(K), static_cast<unsigned>(B)), kBf16Threads,
                   dkdv_bytes, stream()>>>(dk, dv, dout, lse, row_dot, q, k, v, positions, segment_ids,
                                           static_cast<int>(S), static_cast<int>(H), static_cast<int>(K),
                                           static_cast<int>(d), scale);
  MT_CUDA_LAUNCHED("attention_backward_bf16 (dk, dv)");
  dq_kernel<D><<<dim3(own_tiles, static_cast<unsigned>(H), static_cast<unsigned>(B)), kBf16Threads, dq_bytes,
                 stream()>>>(dq, dout, lse, row_dot, q, k, v, positions, segment_ids, static_cast<int>(S),
                             static_cast<int>(H), static_cast<int>(K), static_cast<int>(d), scale);
  MT_CUDA_LAUNCHED("attention_backward_bf16 (dq)");
}

}  // namespace

// Heads wider than 128 (none of the models the cuda backend runs: gpt2 64, qwen3 128; MLA's 192 is refused
// on cuda) run the float32 kernels: a 256-wide bucket would hold 128 output floats per thread for each of
// dk and dv, past the register file, and needs tiles this file does not have. Likewise a GPU without bf16
// tensor cores (before sm_80).
void attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                            const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S,
                            int64_t H, int64_t K, int64_t d) {
  check_shape(B, S, H, K, d);
  if (B == 0 || S == 0 || H == 0) return;
  if (d > kMaxTensorCoreWidth || !tensor_cores_available()) {
    attention_forward(out, lse, q, k, v, positions, segment_ids, B, S, H, K, d);
  } else if (d <= 64) {
    forward_launch<64>(out, lse, q, k, v, positions, segment_ids, B, S, H, K, d);
  } else {
    forward_launch<128>(out, lse, q, k, v, positions, segment_ids, B, S, H, K, d);
  }
}

void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* out,
                             const float* lse, const float* q, const float* k, const float* v,
                             const int32_t* positions, const int32_t* segment_ids, int64_t B, int64_t S,
                             int64_t H, int64_t K, int64_t d, float* scratch) {
  check_shape(B, S, H, K, d);
  if (B == 0 || S == 0 || H == 0) return;
  if (d > kMaxTensorCoreWidth || !tensor_cores_available()) {
    attention_backward(dq, dk, dv, dout, out, lse, q, k, v, positions, segment_ids, B, S, H, K, d, scratch);
    return;
  }
  float* row_dot = scratch;  // [B, H, S] = rowsum(dout * out), float32 as on the cpu
  row_dot_launch(row_dot, dout, out, B, S, H, d);
  if (d <= 64) {
    backward_launch<64>(dq, dk, dv, dout, lse, row_dot, q, k, v, positions, segment_ids, B, S, H, K, d);
  } else {
    backward_launch<128>(dq, dk, dv, dout, lse, row_dot, q, k, v, positions, segment_ids, B, S, H, K, d);
  }
}

}  // namespace meshtrain::kernels::cuda
