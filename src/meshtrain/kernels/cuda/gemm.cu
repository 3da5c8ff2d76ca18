// The cuda kernels' one GEMM seam (gemm.h) through cuBLASLt: row-major float32 or bf16 operands, float32
// accumulation and output, and the bf16 rounding every bf16 GEMM input goes through.
// Legend: M, N output rows and columns, K the reduced dimension; count elements of round_to_bf16.
//
// Row-major to column-major. cuBLASLt is column-major, and a row-major [r, c] buffer read column-major is
// its transpose: an r x c row-major matrix X is the c x r column-major matrix X^T with leading dimension c.
// So our C [M, N] is, to cuBLASLt, C^T (N x M, ld N), and C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T: cuBLASLt's first operand ("A" below, Lt-A) is our B, its second (Lt-B) our A, with
// m = N, n = M, k = K, and each transpose flag passed through unchanged:
//   Lt-A = our B  stored [K, N] (B as is):       layout N x K, ld N, op N: N x K = op(B)^T
//                 stored [N, K] (transposed_b):  layout K x N, ld K, op T: (K x N)^T = N x K = op(B)^T
//   Lt-B = our A  stored [M, K] (A as is):       layout K x M, ld K, op N: K x M = op(A)^T
//                 stored [K, M] (transposed_a):  layout M x K, ld M, op T: (M x K)^T = K x M = op(A)^T
//   Lt-C = Lt-D = our C [M, N]:                  layout N x M, ld N, float32
// i.e. a stored row-major [r, c] operand is the layout c x r with ld c, and the op flag is ours.
// C and D are the same buffer: beta 1 accumulates, beta 0 overwrites (BLAS semantics: C is not read).
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

#include "meshtrain/core/error.h"
#include "meshtrain/kernels/cuda/bf16.cuh"
#include "meshtrain/kernels/cuda/device.h"
#include "meshtrain/kernels/cuda/gemm.h"

namespace meshtrain::kernels::cuda {
namespace {

// The one cuBLASLt workspace of the process: 32 MiB, cudaMalloc'd once at the first GEMM and kept for the
// process (NVIDIA's recommended size for Hopper; split-K and stream-K algorithms use it). Every GEMM runs on
// the one stream, so they take turns with it. This is the library workspace the plan lists beside the arena.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail_call(
      "cuBLASLt", call, file, line,
      std::string(cublasLtGetStatusName(status)) + ": " + cublasLtGetStatusString(status),
      "check the driver and the CUDA toolkit's cuBLAS with nvidia-smi; CUBLAS_STATUS_NOT_SUPPORTED names "
      "a shape or alignment cuBLASLt has no kernel for (a bug in meshtrain: report it)");
}

#define MT_CUBLAS(call) check_cublas((call), #call, __FILE__, __LINE__)

// What selects a cached GEMM: the shape, the layouts, the operand type, beta, and the operands' pointer
// alignments (the heuristic assumes 256-byte aligned buffers unless told less; arena offsets and the bf16
// scratch split are often aligned less, so the alignment is part of the key).
struct PlanKey {
  int64_t M = 0, N = 0, K = 0;
  bool transposed_a = false, transposed_b = false, bf16 = false, accumulate = false;
  uint32_t align_a = 0, align_b = 0, align_c = 0;  // bytes, powers of two <= 256
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    size_t hash = 0;
    const auto mix = [&hash](uint64_t value) {
      hash ^= std::hash<uint64_t>{}(value) + 0x9e3779b97f4a7c15ull + (hash << 6) + (hash >> 2);
    };
    mix(static_cast<uint64_t>(key.M));
    mix(static_cast<uint64_t>(key.N));
    mix(static_cast<uint64_t>(key.K));
    mix((key.transposed_a ? 1u : 0u) | (key.transposed_b ? 2u : 0u) | (key.bf16 ? 4u : 0u) |
        (key.accumulate ? 8u : 0u));
    mix((uint64_t{key.align_a} << 32) | (uint64_t{key.align_b} << 16) | key.align_c);
    return hash;
  }
};

// A GEMM ready to run: the operation, the three layouts (see the mapping at the top) and the algorithm the
// heuristic chose for them, kept for the process.
struct Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr;  // our B
  cublasLtMatrixLayout_t lt_b = nullptr;  // our A
  cublasLtMatrixLayout_t lt_c = nullptr;  // our C (also D)
  cublasLtMatmulAlgo_t algo{};
};

// The handle, the workspace and the plan cache. Created at first use and never destroyed: tearing cuBLASLt
// down from a static destructor may run after the CUDA runtime has unloaded.
struct Library {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // [kWorkspaceBytes] bytes, device
  std::mutex mutex;           // guards plans (the kernel table may be called from more than one thread)
  std::unordered_map<PlanKey, Plan, PlanKeyHash> plans;
};

Library& library() {
  static Library* created = [] {
    stream();  // selects the device
    auto* made = new Library;
    MT_CUBLAS(cublasLtCreate(&made->handle));
    MT_CUDA(cudaMalloc(&made->workspace, kWorkspaceBytes));
    return made;
  }();
  return *created;
}

// The largest power of two (up to 256) that divides the address.
uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

void set_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, int64_t rows, int64_t cols) {
  // Column-major rows x cols, packed: the leading dimension is rows.
  MT_CUBLAS(cublasLtMatrixLayoutCreate(layout, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols),
                                       rows));
}

Plan make_plan(Library& lib, const PlanKey& key) {
  Plan plan;
  const cudaDataType_t input_type = key.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  // CUBLAS_COMPUTE_32F: products and sums in full float32, never TF32 (that is CUBLAS_COMPUTE_32F_FAST_TF32),
  // so gemm_f32 matches the cpu kernels to float32 rounding. For bf16 operands: float32 accumulation.
  MT_CUBLAS(cublasLtMatmulDescCreate(&plan.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = key.transposed_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // Lt-A is our B
  const cublasOperation_t op_b = key.transposed_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // Lt-B is our A
  MT_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  MT_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  // Stored row-major [r, c] = column-major c x r, ld c (the mapping at the top of the file).
  set_layout(&plan.lt_a, input_type, key.transposed_b ? key.K : key.N, key.transposed_b ? key.N : key.K);
  set_layout(&plan.lt_b, input_type, key.transposed_a ? key.M : key.K, key.transposed_a ? key.K : key.M);
  set_layout(&plan.lt_c, CUDA_R_32F, key.N, key.M);

  cublasLtMatmulPreference_t preference = nullptr;
  MT_CUBLAS(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace_bytes = kWorkspaceBytes;
  MT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace_bytes, sizeof(workspace_bytes)));
  // Lt-A is our B, Lt-B our A (the alignments are of the pointers this shape was first called with).
  MT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                 &key.align_b, sizeof(key.align_b)));
  MT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                 &key.align_a, sizeof(key.align_a)));
  MT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                 &key.align_c, sizeof(key.align_c)));
  MT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                 &key.align_c, sizeof(key.align_c)));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  MT_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lib.handle, plan.operation, plan.lt_a, plan.lt_b, plan.lt_c,
                                           plan.lt_c, preference, 1, &result, &returned));
  MT_CUBLAS(cublasLtMatmulPreferenceDestroy(preference));
  const std::string shape = std::string(key.bf16 ? "bf16" : "float32") + " GEMM M=" + std::to_string(key.M) +
                            " N=" + std::to_string(key.N) + " K=" + std::to_string(key.K) +
                            " transposed_a=" + std::to_string(key.transposed_a) +
                            " transposed_b=" + std::to_string(key.transposed_b) + " alignments A/B/C " +
                            std::to_string(key.align_a) + "/" + std::to_string(key.align_b) + "/" +
                            std::to_string(key.align_c) + " bytes";
  MT_CHECK(returned > 0, "cuBLASLt's heuristic has no algorithm for the " + shape);
  MT_CUBLAS(result.state);
  MT_CHECK(result.workspaceSize <= kWorkspaceBytes,
           "cuBLASLt chose more workspace than allowed for the " + shape);
  plan.algo = result.algo;
  return plan;
}

// C (+)= op(A) op(B) with A and B float32 or bf16 bits (bf16 says which).
void run_gemm(float* c, const void* a, const void* b, int64_t M, int64_t N, int64_t K, bool transposed_a,
              bool transposed_b, bool accumulate, bool bf16) {
  MT_CHECK(M >= 0 && N >= 0 && K >= 0, "GEMM dimensions are non-negative");
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: C is left (accumulate) or zeroed; cuBLASLt rejects k = 0 layouts
    if (!accumulate) MT_CUDA(cudaMemsetAsync(c, 0, static_cast<size_t>(M * N) * sizeof(float), stream()));
    return;
  }
  Library& lib = library();
  PlanKey key;
  key.M = M;
  key.N = N;
  key.K = K;
  key.transposed_a = transposed_a;
  key.transposed_b = transposed_b;
  key.bf16 = bf16;
  key.accumulate = accumulate;
  key.align_a = alignment_of(a);
  key.align_b = alignment_of(b);
  key.align_c = alignment_of(c);
  const Plan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(lib.mutex);
    auto found = lib.plans.find(key);
    if (found == lib.plans.end()) found = lib.plans.emplace(key, make_plan(lib, key)).first;
    plan = &found->second;  // unordered_map nodes do not move: the pointer stays valid
  }
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  // Host scalars (the default pointer mode): read during the call. Lt-A is our B, Lt-B our A.
  MT_CUBLAS(cublasLtMatmul(lib.handle, plan->operation, &alpha, b, plan->lt_a, a, plan->lt_b, &beta, c,
                           plan->lt_c, c, plan->lt_c, &plan->algo, lib.workspace, kWorkspaceBytes, stream()));
}

__global__ void round_kernel(uint16_t* out,    // [count]
                             const float* in,  // [count]
                             int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    out[i] = bf16_bits(in[i]);
  }
}

}  // namespace

size_t gemm_workspace_bytes() {
  return kWorkspaceBytes;
}

void gemm_f32(float* c, const float* a, const float* b, int64_t M, int64_t N, int64_t K, bool transposed_a,
              bool transposed_b, bool accumulate) {
  run_gemm(c, a, b, M, N, K, transposed_a, transposed_b, accumulate, false);
}

void gemm_bf16(float* c, const uint16_t* a, const uint16_t* b, int64_t M, int64_t N, int64_t K,
               bool transposed_a, bool transposed_b, bool accumulate) {
  run_gemm(c, a, b, M, N, K, transposed_a, transposed_b, accumulate, true);
}

void round_to_bf16(uint16_t* out, const float* in, int64_t count) {
  if (count <= 0) return;
  round_kernel<<<elementwise_blocks(count), kElementwiseThreads, 0, stream()>>>(out, in, count);
  MT_CUDA_LAUNCHED("gemm round_kernel (round_to_bf16)");
}

}  // namespace meshtrain::kernels::cuda
