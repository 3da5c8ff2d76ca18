// Fused unembedding + softmax cross-entropy on the GPU, C tokens at a time (GEMMs through gemm.h, one block
// per row for the softmax), and plain logits for decoding. Semantics as kernels/cpu/cross_entropy.h.
// Legend: N tokens, D width, V vocab (padded), C chunk of tokens (chunk_tokens), vv = vocab_valid.
// Every GEMM spans the padded vocabulary V in both layouts, never the vv valid columns: the model pads V to a
// multiple of 128 (model/spec.h, padded_vocab_size), so every operand's leading dimension (V or D) is a
// multiple of 8 elements (16-byte aligned rows) and cuBLASLt can pick its Hopper kernels. With vv = 50,257
// the table layout's leading dimension was odd and cuBLASLt fell back to Turing-era kernels (docs/gpus.md).
// Padding columns cost (V - vv) / V more GEMM work (0.09% for GPT-2) and are ignored by the softmax.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cuda/bf16.cuh"
#include "meshtrain/kernels/cuda/cross_entropy.h"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/gemm.h"

namespace meshtrain::kernels::cuda {
namespace {

// Threads of the per-row softmax block and of the one-block per-chunk loss sum (multiples of 32). Fixed, so
// every reduction runs in the same order on every call: the loss and the gradients are bitwise
// reproducible.
constexpr int kRowThreads = 512;
constexpr int kSumThreads = 256;
constexpr int kFillThreads = 256;

// The call's loss sum and count of counted tokens, accumulated on the device over the chunks (in scratch).
// valid_count == kBadTarget: a counted token's target was outside [0, vocab_valid).
struct Totals {
  double loss_sum;
  long long valid_count;
};
static_assert(sizeof(Totals) == 2 * sizeof(double), "Totals is two 8-byte words");
constexpr long long kBadTarget = LLONG_MIN;

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// The reduction of every thread's `value` over the block (blockDim.x a multiple of 32, at most 1024),
// returned to every thread. A fixed tree: within each warp by shuffles, then the warps' results by warp 0 in
// order. shared: [32] of T, free for reuse when this returns.
template <class T, class Op>
__device__ T block_reduce(T value, Op op, T identity, T* shared) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  for (int offset = 16; offset > 0; offset /= 2)
    value = op(value, __shfl_down_sync(0xffffffffu, value, offset));
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < warps ? shared[lane] : identity;
    for (int offset = 16; offset > 0; offset /= 2)
      value = op(value, __shfl_down_sync(0xffffffffu, value, offset));
    if (lane == 0) shared[0] = value;
  }
  __syncthreads();
  const T result = shared[0];
  __syncthreads();  // every thread has read shared[0] before the next reduction writes it
  return result;
}

// One block per row of the chunk: the row's loss (max + log sum exp - target logit, in double; 0 for an
// uncounted row) and, with gradients, dlogits = softmax - onehot(target) written over the row (Out = float,
// dlogits = logits) or rounded once to bf16 into the bf16 GEMMs' input (Out = uint16_t) over the
// valid columns, 0 in padding columns [vv, V) and in every column of an uncounted row (so the padding rows
// of dE and columns of dW get += 0, and dh takes nothing from the padding rows of W). The maximum and the
// sum of exponentials (in double) run over the valid columns only. A counted row whose target is out of
// range gets a NaN loss and no onehot (the host then fails the call; the per-chunk sum flags it).
template <class Out>
__global__ void softmax_rows_kernel(const float* logits,       // [rows, V]
                                    Out* dlogits,              // [rows, V], written with gradients only
                                    double* row_loss,          // [rows]
                                    const int32_t* targets,    // [rows] the chunk's
                                    const uint8_t* loss_mask,  // [rows] the chunk's, or nullptr
                                    int64_t V, int64_t vocab_valid, bool want_gradients) {
  __shared__ float shared_max[32];
  __shared__ double shared_sum[32];
  const int64_t r = blockIdx.x;
  const float* row = logits + r * V;
  Out* gradient_row = dlogits + r * V;  // may be row itself: each thread reads [v] before it writes [v]
  const int64_t first = threadIdx.x, step = blockDim.x;
  const bool counts = loss_mask == nullptr || loss_mask[r] != 0;
  if (!counts) {  // uniform over the block: no thread reaches a barrier
    if (want_gradients) {
      for (int64_t v = first; v < V; v += step) store_output(gradient_row, v, 0.0f);
    }
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    return;
  }
  const int32_t target = targets[r];
  const bool target_valid = target >= 0 && target < vocab_valid;
  // Read before any thread overwrites the row (the reductions below are barriers).
  const float target_logit = threadIdx.x == 0 && target_valid ? row[target] : 0.0f;

  float local_max = -INFINITY;
  for (int64_t v = first; v < vocab_valid; v += step) local_max = fmaxf(local_max, row[v]);
  const float max_logit = block_reduce(local_max, MaxOp{}, -INFINITY, shared_max);
  double local_sum = 0.0;
  for (int64_t v = first; v < vocab_valid; v += step)
    local_sum += static_cast<double>(expf(row[v] - max_logit));
  const double sum_exp = block_reduce(local_sum, SumOp{}, 0.0, shared_sum);

  if (threadIdx.x == 0) {
    row_loss[r] = target_valid
                      ? static_cast<double>(max_logit) + log(sum_exp) - static_cast<double>(target_logit)
                      : static_cast<double>(NAN);
  }
  if (want_gradients) {
    const float scale = static_cast<float>(1.0 / sum_exp);
    for (int64_t v = first; v < vocab_valid; v += step) {
      const float softmax = expf(row[v] - max_logit) * scale;
      store_output(gradient_row, v, v == target ? softmax - 1.0f : softmax);
    }
    for (int64_t v = vocab_valid + first; v < V; v += step) store_output(gradient_row, v, 0.0f);
  }
}

// One block: adds the chunk's counted row losses and its count of counted rows to the totals (first chunk:
// writes them), in a fixed order. A counted row with a target outside [0, vocab_valid) sets the count to
// kBadTarget for the rest of the call.
__global__ void sum_chunk_kernel(Totals* totals,
                                 const double* row_loss,    // [rows]
                                 const int32_t* targets,    // [rows] the chunk's
                                 const uint8_t* loss_mask,  // [rows] the chunk's, or nullptr
                                 int64_t rows, int64_t vocab_valid, bool first_chunk) {
  __shared__ double shared_sum[32];
  __shared__ long long shared_count[32];
  double loss = 0.0;
  long long count = 0, bad = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (loss_mask != nullptr && loss_mask[r] == 0) continue;
    loss += row_loss[r];
    count += 1;
    if (targets[r] < 0 || targets[r] >= vocab_valid) bad += 1;
  }
  loss = block_reduce(loss, SumOp{}, 0.0, shared_sum);
  count = block_reduce(count, SumOp{}, 0LL, shared_count);
  bad = block_reduce(bad, SumOp{}, 0LL, shared_count);
  if (threadIdx.x == 0) {
    Totals sums = first_chunk ? Totals{0.0, 0} : *totals;
    sums.loss_sum += loss;
    sums.valid_count = sums.valid_count < 0 || bad > 0 ? kBadTarget : sums.valid_count + count;
    *totals = sums;
  }
}

// out[n, v] = -inf for the padding columns v in [vocab_valid, V) of every row.
__global__ void fill_padding_kernel(float* out,  // [N, V]
                                    int64_t N, int64_t V, int64_t vocab_valid) {
  const int64_t padding = V - vocab_valid;
  const int64_t count = N * padding;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[(i / padding) * V + vocab_valid + i % padding] = -INFINITY;
  }
}

// C (+)= op(A) @ op(B) in float32 or with bf16 inputs, by the type of the operands.
void product(float* c, const float* a, const float* b, int64_t M, int64_t N, int64_t K, bool transposed_a,
             bool transposed_b, bool accumulate) {
  gemm_f32(c, a, b, M, N, K, transposed_a, transposed_b, accumulate);
}
void product(float* c, const uint16_t* a, const uint16_t* b, int64_t M, int64_t N, int64_t K,
             bool transposed_a, bool transposed_b, bool accumulate) {
  gemm_bf16(c, a, b, M, N, K, transposed_a, transposed_b, accumulate);
}

// The chunk's logits [rows, V] = h_chunk [rows, D] @ W, every column of W [D, V] (kernel_DV) or every row of
// E = W [V, D] (table_VD); the padding columns are computed and then ignored.
template <class In>
void chunk_logits(float* logits, const In* h_chunk, const In* w, UnembedLayout layout, int64_t rows,
                  int64_t D, int64_t V) {
  product(logits, h_chunk, w, rows, V, D, false, layout == UnembedLayout::table_VD, false);
}

// One chunk's gradients from its dlogits [rows, V] (zero in padding columns and uncounted rows): dh's rows
// [rows, D] written, dw accumulated. The padding columns of dW / rows of dE get += 0 (left as they were).
template <class In>
void backward_chunk(float* dh_chunk, float* dw, const In* h_chunk, const In* w, const In* dlogits,
                    UnembedLayout layout, int64_t rows, int64_t D, int64_t V) {
  const bool kernel_dv = layout == UnembedLayout::kernel_DV;
  if (dh_chunk != nullptr) {
    // kernel_DV: dh [rows, D] = dlogits [rows, V] @ W [D, V]^T; table_VD: dlogits [rows, V] @ E [V, D]
    product(dh_chunk, dlogits, w, rows, D, V, false, kernel_dv, false);
  }
  if (dw != nullptr) {
    if (kernel_dv) {
      // dW [D, V] += h_chunk^T [D, rows] @ dlogits [rows, V]
      product(dw, h_chunk, dlogits, D, V, rows, true, false, true);
    } else {
      // dE [V, D] += dlogits^T [V, rows] @ h_chunk [rows, D]
      product(dw, dlogits, h_chunk, V, D, rows, true, false, true);
    }
  }
}

}  // namespace

CrossEntropySums unembed_cross_entropy(float* dh, float* dw, const float* h, const float* w,
                                       UnembedLayout layout, const int32_t* targets, const uint8_t* loss_mask,
                                       int64_t N, int64_t D, int64_t V, int64_t vocab_valid,
                                       double z_loss_multiplier, int64_t chunk_tokens, float* scratch,
                                       const VocabParallel* vocab_parallel, uint16_t* bf16_inputs) {
  // The z-loss has not run on a GPU: a run with z_loss_multiplier > 0 on an NVIDIA topology is refused before
  // any step (runtime/engine.cpp, check_plan_runs_here), so it never reaches this kernel.
  MT_CHECK(z_loss_multiplier == 0.0,
           "the z-loss (z_loss_multiplier > 0) is not implemented on the cuda backend");
  MT_CHECK(vocab_parallel == nullptr,
           "vocab-parallel (tensor-parallel) cross-entropy is not implemented on the cuda backend; the plan "
           "must not shard the vocabulary over tensor ranks on NVIDIA devices");
  MT_CHECK(N >= 0 && D >= 1 && V >= 1 && chunk_tokens >= 1, "N >= 0, D >= 1, V >= 1, chunk_tokens >= 1");
  MT_CHECK(vocab_valid >= 1 && vocab_valid <= V, "vocab_valid must be in [1, V]");
  MT_CHECK(N == 0 || (h != nullptr && w != nullptr && targets != nullptr && scratch != nullptr),
           "h, w, targets and scratch are required");
  if (N == 0) return CrossEntropySums{};

  const int64_t C = chunk_tokens;
  const bool want_gradients = dh != nullptr || dw != nullptr;
  // Scratch (cross_entropy_scratch_floats(C, V) = C V + 7 C + 1 floats): the chunk's logits [C, V], then
  // at the next 8-byte boundary (at most one float on) the per-row losses [C] doubles and the Totals (two
  // 8-byte words): at most C V + 1 + 2 C + 4 <= C V + 7 C + 1 floats for every C >= 1.
  float* logits = scratch;  // [rows, V]
  uintptr_t address = reinterpret_cast<uintptr_t>(scratch + C * V);
  address = (address + alignof(double) - 1) & ~static_cast<uintptr_t>(alignof(double) - 1);
  double* row_loss = reinterpret_cast<double*>(address);  // [C]
  Totals* totals = reinterpret_cast<Totals*>(row_loss + C);

  // bf16 inputs (cross_entropy_bf16_scratch_elements(N, C, D, V) >= D V + C D + C V): W rounded once per call
  // (all of it, padding included: the GEMMs span V), each chunk's h [rows, D], and its dlogits [rows, V]
  // as the row kernel writes them (rounded on the store: no separate pass over them).
  uint16_t* w_bf16 = nullptr;        // layout of w: [D, V] or [V, D]
  uint16_t* h_chunk_bf16 = nullptr;  // [C, D]
  uint16_t* dlogits_bf16 = nullptr;  // [C, V]
  if (bf16_inputs != nullptr) {
    w_bf16 = bf16_inputs;
    h_chunk_bf16 = bf16_inputs + D * V;
    dlogits_bf16 = h_chunk_bf16 + C * D;
    round_to_bf16(w_bf16, w, D * V);
  }

  for (int64_t start = 0; start < N; start += C) {
    const int64_t rows = std::min(C, N - start);
    const float* h_chunk = h + start * D;                                            // [rows, D]
    const uint8_t* mask_chunk = loss_mask == nullptr ? nullptr : loss_mask + start;  // [rows]
    if (w_bf16 != nullptr) {
      round_to_bf16(h_chunk_bf16, h_chunk, rows * D);
      chunk_logits<uint16_t>(logits, h_chunk_bf16, w_bf16, layout, rows, D, V);
    } else {
      chunk_logits<float>(logits, h_chunk, w, layout, rows, D, V);
    }
    if (w_bf16 != nullptr) {
      softmax_rows_kernel<uint16_t><<<static_cast<unsigned>(rows), kRowThreads, 0, stream()>>>(
          logits, dlogits_bf16, row_loss, targets + start, mask_chunk, V, vocab_valid, want_gradients);
    } else {
      softmax_rows_kernel<float><<<static_cast<unsigned>(rows), kRowThreads, 0, stream()>>>(
          logits, logits, row_loss, targets + start, mask_chunk, V, vocab_valid, want_gradients);
    }
    MT_CUDA_LAUNCHED("softmax_rows_kernel");
    sum_chunk_kernel<<<1, kSumThreads, 0, stream()>>>(totals, row_loss, targets + start, mask_chunk, rows,
                                                      vocab_valid, start == 0);
    MT_CUDA_LAUNCHED("sum_chunk_kernel");
    if (!want_gradients) continue;
    float* dh_chunk = dh == nullptr ? nullptr : dh + start * D;  // [rows, D]
    if (w_bf16 != nullptr) {
      backward_chunk<uint16_t>(dh_chunk, dw, h_chunk_bf16, w_bf16, dlogits_bf16, layout, rows, D, V);
    } else {
      backward_chunk<float>(dh_chunk, dw, h_chunk, w, logits, layout, rows, D, V);
    }
  }

  Totals host{};
  memory_copy_out(&host, totals, sizeof host);  // waits for the stream
  MT_CHECK(host.valid_count != kBadTarget, "a counted token's target is out of [0, vocab_valid)");
  return CrossEntropySums{host.loss_sum, static_cast<int64_t>(host.valid_count), 0.0};
}

void unembed_logits(float* out, const float* h, const float* w, UnembedLayout layout, int64_t N, int64_t D,
                    int64_t V, int64_t vocab_valid) {
  MT_CHECK(N >= 0 && D >= 1, "N >= 0, D >= 1");
  MT_CHECK(vocab_valid >= 1 && vocab_valid <= V, "vocab_valid must be in [1, V]");
  if (N == 0) return;
  // out [N, V] = h [N, D] @ W [D, V] (kernel_DV) or h @ E^T (table_VD, E [V, D]); padding columns are then
  // overwritten with -inf so they can never be sampled.
  gemm_f32(out, h, w, N, V, D, false, layout == UnembedLayout::table_VD, false);
  if (vocab_valid == V) return;
  const unsigned blocks = std::min(blocks_for(N * (V - vocab_valid), kFillThreads), 65536u);
  fill_padding_kernel<<<blocks, kFillThreads, 0, stream()>>>(out, N, V, vocab_valid);
  MT_CUDA_LAUNCHED("fill_padding_kernel");
}

}  // namespace meshtrain::kernels::cuda
