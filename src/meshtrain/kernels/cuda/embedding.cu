// Embedding lookup and its scatter-add gradient on the GPU (embedding.h; semantics of
// kernels/cpu/embedding.h), vocab-parallel: this rank holds global rows [vocab_offset, vocab_offset + R).
// Legend: N tokens, R table rows held here, D width; ids [N]; out, dout [N, D]; table, dtable [R, D].
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/embedding.h"

namespace meshtrain::kernels::cuda {
namespace {

// The backward: a block owns kColumnThreads columns (one per thread) of the table rows in one bucket
// (row % kBuckets == blockIdx.y). It walks all N tokens in order, kTile ids at a time staged in shared
// memory, and adds dout[n, j] to dtable[row, j] for the tokens whose row is in its bucket. Every element of
// dtable is so owned by one thread and summed in token order: deterministic, and the same float adds in the
// same order as the cpu kernel (bitwise equal to it).
constexpr int kColumnThreads = 128;
constexpr int kBuckets = 64;
constexpr int kTile = 1024;

// Flat over the N D elements: out[n, j] = table[ids[n] - vocab_offset, j], or += when accumulate; a token
// whose row is not held here gives 0 (written) or leaves out[n] as it is (accumulate).
__global__ void forward_kernel(float* out,          // [N, D]
                               const int32_t* ids,  // [N]
                               const float* table,  // [R, D]
                               int64_t N, int64_t R, int64_t D, bool accumulate, int64_t vocab_offset) {
  const int64_t total = N * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t n = i / D, j = i - n * D;
    const int64_t row = static_cast<int64_t>(ids[n]) - vocab_offset;
    if (row < 0 || row >= R) {
      if (!accumulate) out[i] = 0.0f;  // held by another vocab rank
      continue;
    }
    const float value = table[row * D + j];
    out[i] = accumulate ? out[i] + value : value;
  }
}

// Grid (ceil(D / kColumnThreads), kBuckets), block kColumnThreads: dtable[row, j] += dout[n, j] for every
// token n (in order) whose row = ids[n] - vocab_offset lies in [0, R) and in this block's bucket.
// Cost: every block reads all N ids (from L2, once per tile into shared memory) and each thread walks them
// (N shared-memory reads, mostly skipped); the adds are N D in all, spread over D x kBuckets threads when
// the ids spread over the buckets (one bucket's threads do them all when every token has the same id).
// N = 16k, D = 4096: 2048 blocks, 16k shared reads and ~256 read-add-writes per thread.
__global__ void backward_kernel(float* dtable,       // [R, D]
                                const int32_t* ids,  // [N]
                                const float* dout,   // [N, D]
                                int64_t N, int64_t R, int64_t D, int64_t vocab_offset) {
  __shared__ int64_t tile_rows[kTile];  // the tile's table rows, -1 where not this block's
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumnThreads + threadIdx.x;
  const int64_t bucket = blockIdx.y;
  for (int64_t begin = 0; begin < N; begin += kTile) {
    const int count = static_cast<int>(N - begin < kTile ? N - begin : kTile);
    for (int k = static_cast<int>(threadIdx.x); k < count; k += static_cast<int>(blockDim.x)) {
      const int64_t row = static_cast<int64_t>(ids[begin + k]) - vocab_offset;
      tile_rows[k] = row >= 0 && row < R && row % kBuckets == bucket ? row : -1;
    }
    __syncthreads();
    if (j < D) {
      for (int k = 0; k < count; ++k) {
        const int64_t row = tile_rows[k];
        if (row >= 0) dtable[row * D + j] += dout[(begin + k) * D + j];
      }
    }
    __syncthreads();  // the tile is read by every thread before the next one overwrites it
  }
}

// The cpu kernel's argument check (the ids themselves are not checked here: that would need a copy to
// the host and a synchronisation per call; an id outside [0, global_rows) acts as one of another rank).
void check_rows(int64_t R, int64_t D, int64_t vocab_offset, int64_t global_rows) {
  if (global_rows < 0) global_rows = vocab_offset + R;
  MT_CHECK(R >= 0 && D >= 0 && vocab_offset >= 0 && vocab_offset + R <= global_rows,
           "table rows [" + to_text(vocab_offset) + ", " + to_text(vocab_offset + R) + ") outside [0, " +
               to_text(global_rows) + ")");
}

}  // namespace

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t R, int64_t D,
                       bool accumulate, int64_t vocab_offset, int64_t global_rows) {
  check_rows(R, D, vocab_offset, global_rows);
  if (N <= 0 || D <= 0) return;
  forward_kernel<<<elementwise_blocks(N * D), kElementwiseThreads, 0, stream()>>>(out, ids, table, N, R, D,
                                                                                  accumulate, vocab_offset);
  MT_CUDA_LAUNCHED("embedding forward_kernel");
}

void embedding_backward(float* dtable, const int32_t* ids, const float* dout, int64_t N, int64_t R, int64_t D,
                        int64_t vocab_offset, int64_t global_rows) {
  check_rows(R, D, vocab_offset, global_rows);
  if (N <= 0 || D <= 0 || R <= 0) return;
  const dim3 grid(blocks_for(D, kColumnThreads), kBuckets);
  backward_kernel<<<grid, kColumnThreads, 0, stream()>>>(dtable, ids, dout, N, R, D, vocab_offset);
  MT_CUDA_LAUNCHED("embedding backward_kernel");
}

}  // namespace meshtrain::kernels::cuda
