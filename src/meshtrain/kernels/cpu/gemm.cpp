#include "meshtrain/kernels/cpu/gemm.h"

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/error.h"

namespace meshtrain::kernels {
namespace {

// The oneDNN C functions the engine calls, looked up in the library loaded at run time. The header gives
// their exact types; the soname (libdnnl.so.2) pins the 2.x interface the header describes.
// clang-format off: it lays this list out differently on every pass
#define MESHTRAIN_ONEDNN_FUNCTIONS(X) \
  X(dnnl_version)                     \
  X(dnnl_get_effective_cpu_isa)       \
  X(dnnl_sgemm)                       \
  X(dnnl_engine_create)               \
  X(dnnl_stream_create)               \
  X(dnnl_stream_wait)                 \
  X(dnnl_memory_desc_init_by_strides) \
  X(dnnl_matmul_desc_init)            \
  X(dnnl_primitive_attr_create)       \
  X(dnnl_primitive_attr_destroy)      \
  X(dnnl_post_ops_create)             \
  X(dnnl_post_ops_destroy)            \
  X(dnnl_post_ops_append_sum)         \
  X(dnnl_primitive_attr_set_post_ops) \
  X(dnnl_primitive_desc_create)       \
  X(dnnl_primitive_desc_destroy)      \
  X(dnnl_primitive_create)            \
  X(dnnl_memory_create)               \
  X(dnnl_memory_destroy)              \
  X(dnnl_primitive_execute)           \
  X(dnnl_primitive_desc_query)        \
  X(dnnl_memory_desc_init_by_tag)     \
  X(dnnl_primitive_desc_query_md)     \
  X(dnnl_memory_desc_get_size)        \
  X(dnnl_reorder_primitive_desc_create)
// clang-format on

// A bf16 matmul whose B arrives in float32: one reorder rounds B into the layout the matmul's kernel reads
// (format_tag any: oneDNN's blocked, VNNI-interleaved weights), so the product copies nothing of B itself.
struct PackedBMatmul {
  dnnl_primitive_t reorder = nullptr;  // float32 B (its strides) -> bf16 in the matmul's layout
  dnnl_primitive_t matmul = nullptr;
  dnnl_memory_desc_t src{}, b_float32{}, b_packed{}, dst{}, bias{};  // bias: [1, N] f32, when it has one
  size_t packed_bytes = 0;
};

struct OneDnn {
#define MESHTRAIN_DECLARE(name) decltype(&::name) name = nullptr;
  MESHTRAIN_ONEDNN_FUNCTIONS(MESHTRAIN_DECLARE)
#undef MESHTRAIN_DECLARE
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  // One matmul primitive per (input type, M, N, K, lda, ldb, ldc, accumulate), created on first use; the
  // packed-B ones (input type bf16) also by whether they add a bias, and their entry is empty where oneDNN
  // has no such product.
  using MatmulKey = std::tuple<dnnl_data_type_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>;
  std::map<MatmulKey, dnnl_primitive_t> matmuls;
  std::map<std::pair<MatmulKey, bool>, std::optional<PackedBMatmul>> packed_b_matmuls;
  std::mutex matmul_mutex;  // guards the cache and the stream (tests call kernels from several threads)
};

std::string onednn_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "isa 0x" + [&] {
        char hex[16];
        std::snprintf(hex, sizeof hex, "%x", static_cast<unsigned>(isa));
        return std::string(hex);
      }();
  }
}

void check_onednn(dnnl_status_t status, const char* what) {
  MT_CHECK(status == dnnl_success, std::string("oneDNN ") + what + " failed with status " + to_text(status));
}

// Loads oneDNN; nullptr (and `why`) when it cannot be loaded or lacks a function.
OneDnn* load_onednn(std::string& why) {
  const char* requested = std::getenv("MESHTRAIN_ONEDNN_LIBRARY");
  const std::string file = requested != nullptr && *requested != '\0' ? requested : "libdnnl.so.2";
  void* library = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    why = "oneDNN could not be loaded (" + std::string(error != nullptr ? error : file) + ")";
    return nullptr;
  }
  auto onednn = std::make_unique<OneDnn>();
#define MESHTRAIN_LOOK_UP(name)                                                            \
  onednn->name = reinterpret_cast<decltype(&::name)>(dlsym(library, #name));               \
  if (onednn->name == nullptr) {                                                           \
    why = file + " has no function " #name " (expected oneDNN 2.x, the libdnnl2 package)"; \
    return nullptr;                                                                        \
  }
  MESHTRAIN_ONEDNN_FUNCTIONS(MESHTRAIN_LOOK_UP)
#undef MESHTRAIN_LOOK_UP
  if (onednn->dnnl_engine_create(&onednn->engine, dnnl_cpu, 0) != dnnl_success ||
      onednn->dnnl_stream_create(&onednn->stream, onednn->engine, dnnl_stream_default_flags) !=
          dnnl_success) {
    why = file + " could not create a CPU engine and stream";
    return nullptr;
  }
  return onednn.release();  // lives as long as the process, like the library
}

OneDnn* g_onednn = nullptr;
bool g_onednn_bf16 = false;      // oneDNN's bf16 matmul runs and agrees with the reference
bool g_onednn_packed_b = false;  // and so does its packed-B form (onednn_matmul_packed_b)

// A matmul's attributes: with `accumulate`, a sum post-op (C += the product). The caller destroys them.
dnnl_primitive_attr_t matmul_attributes(OneDnn& dnn, bool accumulate) {
  dnnl_primitive_attr_t attr = nullptr;
  check_onednn(dnn.dnnl_primitive_attr_create(&attr), "attr");
  if (accumulate) {
    dnnl_post_ops_t post_ops = nullptr;
    check_onednn(dnn.dnnl_post_ops_create(&post_ops), "post ops");
    check_onednn(dnn.dnnl_post_ops_append_sum(post_ops, 1.0f), "sum post op");
    check_onednn(dnn.dnnl_primitive_attr_set_post_ops(attr, post_ops), "set post ops");
    dnn.dnnl_post_ops_destroy(post_ops);
  }
  return attr;
}

// The matmul primitive for these inputs (f32 or bf16; the output is f32), created on first use; nullptr when
// oneDNN has no implementation (bf16 on a CPU without bf16 instructions). `implementation`, when given, gets
// oneDNN's name for the kernel it chose.
dnnl_primitive_t onednn_matmul_primitive(OneDnn& dnn, dnnl_data_type_t input_type, bool transpose_a,
                                         bool transpose_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                                         int64_t ldb, bool accumulate, int64_t ldc, dnnl_memory_desc_t* descs,
                                         std::string* implementation = nullptr) {
  const auto key = std::make_tuple(input_type, M, N, K, transpose_a ? -lda : lda, transpose_b ? -ldb : ldb,
                                   ldc, accumulate);
  dnnl_memory_desc_t& src = descs[0];
  dnnl_memory_desc_t& weights = descs[1];
  dnnl_memory_desc_t& dst = descs[2];
  const dnnl_dims_t src_dims = {M, K}, weight_dims = {K, N}, dst_dims = {M, N};
  const dnnl_dims_t src_strides = {transpose_a ? 1 : lda, transpose_a ? lda : 1};
  const dnnl_dims_t weight_strides = {transpose_b ? 1 : ldb, transpose_b ? ldb : 1};
  const dnnl_dims_t dst_strides = {ldc, 1};
  check_onednn(dnn.dnnl_memory_desc_init_by_strides(&src, 2, src_dims, input_type, src_strides), "src desc");
  check_onednn(dnn.dnnl_memory_desc_init_by_strides(&weights, 2, weight_dims, input_type, weight_strides),
               "weights desc");
  check_onednn(dnn.dnnl_memory_desc_init_by_strides(&dst, 2, dst_dims, dnnl_f32, dst_strides), "dst desc");
  const auto cached = dnn.matmuls.find(key);
  if (cached != dnn.matmuls.end() && implementation == nullptr) return cached->second;
  dnnl_matmul_desc_t desc{};
  check_onednn(dnn.dnnl_matmul_desc_init(&desc, &src, &weights, nullptr, &dst), "matmul desc");
  dnnl_primitive_attr_t attr = matmul_attributes(dnn, accumulate);
  dnnl_primitive_desc_t primitive_desc = nullptr;
  const dnnl_status_t status =
      dnn.dnnl_primitive_desc_create(&primitive_desc, &desc, attr, dnn.engine, nullptr);
  dnn.dnnl_primitive_attr_destroy(attr);
  if (status == dnnl_unimplemented) return nullptr;
  check_onednn(status, "matmul primitive desc");
  if (implementation != nullptr) {
    const char* name = nullptr;
    check_onednn(dnn.dnnl_primitive_desc_query(primitive_desc, dnnl_query_impl_info_str, 0, &name), "impl");
    *implementation = name != nullptr ? name : "unnamed";
  }
  dnnl_primitive_t& primitive = dnn.matmuls[key];
  if (primitive == nullptr)
    check_onednn(dnn.dnnl_primitive_create(&primitive, primitive_desc), "matmul primitive");
  dnn.dnnl_primitive_desc_destroy(primitive_desc);
  return primitive;
}

// out = op(A) op(B) through oneDNN's matmul primitive (strides describe the transposes; no copies). A and B
// are float or bfloat16 bits as input_type says. False (nothing written) when oneDNN has no implementation.
bool onednn_matmul(OneDnn& dnn, dnnl_data_type_t input_type, bool transpose_a, bool transpose_b, int64_t M,
                   int64_t N, int64_t K, const void* A, int64_t lda, const void* B, int64_t ldb,
                   bool accumulate, float* C, int64_t ldc) {
  std::lock_guard<std::mutex> lock(dnn.matmul_mutex);
  dnnl_memory_desc_t descs[3] = {};
  dnnl_primitive_t primitive = onednn_matmul_primitive(dnn, input_type, transpose_a, transpose_b, M, N, K,
                                                       lda, ldb, accumulate, ldc, descs);
  if (primitive == nullptr) return false;  // no implementation for these inputs here: the caller falls back
  const dnnl_memory_desc_t& src = descs[0];
  const dnnl_memory_desc_t& weights = descs[1];
  const dnnl_memory_desc_t& dst = descs[2];
  dnnl_memory_t memories[3] = {};
  check_onednn(dnn.dnnl_memory_create(&memories[0], &src, dnn.engine, const_cast<void*>(A)), "src memory");
  check_onednn(dnn.dnnl_memory_create(&memories[1], &weights, dnn.engine, const_cast<void*>(B)),
               "weights memory");
  check_onednn(dnn.dnnl_memory_create(&memories[2], &dst, dnn.engine, C), "dst memory");
  const dnnl_exec_arg_t arguments[3] = {
      {DNNL_ARG_SRC, memories[0]}, {DNNL_ARG_WEIGHTS, memories[1]}, {DNNL_ARG_DST, memories[2]}};
  check_onednn(dnn.dnnl_primitive_execute(primitive, dnn.stream, 3, arguments), "matmul execute");
  check_onednn(dnn.dnnl_stream_wait(dnn.stream), "stream wait");
  for (dnnl_memory_t memory : memories) dnn.dnnl_memory_destroy(memory);
  return true;
}

// The packed-B matmul for this shape, created on first use; nullptr when oneDNN has none (no bf16 kernel
// for this CPU or shape, or no reorder into its layout).
const PackedBMatmul* onednn_packed_b_matmul(OneDnn& dnn, bool transpose_a, bool transpose_b, int64_t M,
                                            int64_t N, int64_t K, int64_t lda, int64_t ldb, bool accumulate,
                                            int64_t ldc, bool with_bias) {
  const std::pair key{OneDnn::MatmulKey{dnnl_bf16, M, N, K, transpose_a ? -lda : lda,
                                        transpose_b ? -ldb : ldb, ldc, accumulate},
                      with_bias};
  if (const auto cached = dnn.packed_b_matmuls.find(key); cached != dnn.packed_b_matmuls.end())
    return cached->second ? &*cached->second : nullptr;
  std::optional<PackedBMatmul>& entry = dnn.packed_b_matmuls[key];
  PackedBMatmul packed;
  const dnnl_dims_t src_dims = {M, K}, weight_dims = {K, N}, dst_dims = {M, N};
  const dnnl_dims_t src_strides = {transpose_a ? 1 : lda, transpose_a ? lda : 1};
  const dnnl_dims_t weight_strides = {transpose_b ? 1 : ldb, transpose_b ? ldb : 1};
  const dnnl_dims_t dst_strides = {ldc, 1};
  dnnl_memory_desc_t weights_any{};
  check_onednn(dnn.dnnl_memory_desc_init_by_strides(&packed.src, 2, src_dims, dnnl_bf16, src_strides), "src");
  check_onednn(
      dnn.dnnl_memory_desc_init_by_strides(&packed.b_float32, 2, weight_dims, dnnl_f32, weight_strides), "B");
  check_onednn(dnn.dnnl_memory_desc_init_by_tag(&weights_any, 2, weight_dims, dnnl_bf16, dnnl_format_tag_any),
               "weights any");
  check_onednn(dnn.dnnl_memory_desc_init_by_strides(&packed.dst, 2, dst_dims, dnnl_f32, dst_strides), "dst");
  if (with_bias) {
    const dnnl_dims_t bias_dims = {1, N}, bias_strides = {N, 1};
    check_onednn(dnn.dnnl_memory_desc_init_by_strides(&packed.bias, 2, bias_dims, dnnl_f32, bias_strides),
                 "bias");
  }
  dnnl_matmul_desc_t desc{};
  check_onednn(dnn.dnnl_matmul_desc_init(&desc, &packed.src, &weights_any, with_bias ? &packed.bias : nullptr,
                                         &packed.dst),
               "matmul");
  dnnl_primitive_attr_t attr = matmul_attributes(dnn, accumulate);
  dnnl_primitive_desc_t matmul_desc = nullptr;
  const dnnl_status_t status = dnn.dnnl_primitive_desc_create(&matmul_desc, &desc, attr, dnn.engine, nullptr);
  dnn.dnnl_primitive_attr_destroy(attr);
  if (status == dnnl_unimplemented) return nullptr;
  check_onednn(status, "packed-B matmul primitive desc");
  packed.b_packed = *dnn.dnnl_primitive_desc_query_md(matmul_desc, dnnl_query_weights_md, 0);
  packed.packed_bytes = dnn.dnnl_memory_desc_get_size(&packed.b_packed);
  dnnl_primitive_desc_t reorder_desc = nullptr;
  const dnnl_status_t reorder_status = dnn.dnnl_reorder_primitive_desc_create(
      &reorder_desc, &packed.b_float32, dnn.engine, &packed.b_packed, dnn.engine, nullptr);
  if (reorder_status != dnnl_success) {
    dnn.dnnl_primitive_desc_destroy(matmul_desc);
    if (reorder_status == dnnl_unimplemented) return nullptr;
    check_onednn(reorder_status, "reorder primitive desc");
  }
  check_onednn(dnn.dnnl_primitive_create(&packed.matmul, matmul_desc), "packed-B matmul primitive");
  check_onednn(dnn.dnnl_primitive_create(&packed.reorder, reorder_desc), "reorder primitive");
  dnn.dnnl_primitive_desc_destroy(matmul_desc);
  dnn.dnnl_primitive_desc_destroy(reorder_desc);
  entry = packed;
  return &*entry;
}

// C = op(A) op(B) with A in bf16 and B in float32, B rounded by oneDNN's reorder into `b_scratch` in the
// matmul's layout. False (nothing written) when oneDNN has no such product or its layout needs more than
// `b_scratch_bytes`.
bool onednn_matmul_packed_b(OneDnn& dnn, bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K,
                            const uint16_t* A, int64_t lda, const float* B, int64_t ldb, bool accumulate,
                            float* C, int64_t ldc, uint16_t* b_scratch, size_t b_scratch_bytes,
                            const float* bias) {
  std::lock_guard<std::mutex> lock(dnn.matmul_mutex);
  const PackedBMatmul* packed = onednn_packed_b_matmul(dnn, transpose_a, transpose_b, M, N, K, lda, ldb,
                                                       accumulate, ldc, bias != nullptr);
  if (packed == nullptr || packed->packed_bytes > b_scratch_bytes) return false;
  dnnl_memory_t b_float32 = nullptr, b_packed = nullptr, src = nullptr, dst = nullptr, bias_memory = nullptr;
  check_onednn(dnn.dnnl_memory_create(&b_float32, &packed->b_float32, dnn.engine, const_cast<float*>(B)),
               "B");
  check_onednn(dnn.dnnl_memory_create(&b_packed, &packed->b_packed, dnn.engine, b_scratch), "packed B");
  check_onednn(dnn.dnnl_memory_create(&src, &packed->src, dnn.engine, const_cast<uint16_t*>(A)), "src");
  check_onednn(dnn.dnnl_memory_create(&dst, &packed->dst, dnn.engine, C), "dst");
  if (bias != nullptr)
    check_onednn(dnn.dnnl_memory_create(&bias_memory, &packed->bias, dnn.engine, const_cast<float*>(bias)),
                 "bias");
  const dnnl_exec_arg_t reorder_arguments[2] = {{DNNL_ARG_FROM, b_float32}, {DNNL_ARG_TO, b_packed}};
  check_onednn(dnn.dnnl_primitive_execute(packed->reorder, dnn.stream, 2, reorder_arguments), "reorder");
  const dnnl_exec_arg_t matmul_arguments[4] = {
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, b_packed}, {DNNL_ARG_DST, dst}, {DNNL_ARG_BIAS, bias_memory}};
  check_onednn(
      dnn.dnnl_primitive_execute(packed->matmul, dnn.stream, bias != nullptr ? 4 : 3, matmul_arguments),
      "packed matmul");
  check_onednn(dnn.dnnl_stream_wait(dnn.stream), "stream wait");
  for (dnnl_memory_t memory : {b_float32, b_packed, src, dst, bias_memory})
    if (memory != nullptr) dnn.dnnl_memory_destroy(memory);
  return true;
}

// oneDNN's two entry points differ by layout (bench/run_gemm.sh, 2 threads, AMD Zen 5): dnnl_sgemm reaches
// 0.63x of the best library when B is transposed (256x768x3072) but is the fastest with B as stored; the
// matmul primitive is within 0.97x of the best with B transposed and 0.68x with B as stored (256x768x50304).
void onednn_gemm(OneDnn& dnn, bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K,
                 const float* A, int64_t lda, const float* B, int64_t ldb, bool accumulate, float* C,
                 int64_t ldc) {
  if (transpose_b && !transpose_a) {
    MT_CHECK(
        onednn_matmul(dnn, dnnl_f32, transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc),
        "oneDNN has a float32 matmul for every shape");
    return;
  }
  check_onednn(dnn.dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb,
                              accumulate ? 1.0f : 0.0f, C, ldc),
               "sgemm");
}

template <class In>
void reference_gemm_threaded(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, const In* A,
                             int64_t lda, const In* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  constexpr int64_t kRowsPerTask = 4;
  const int64_t tasks = (M + kRowsPerTask - 1) / kRowsPerTask;
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t begin = task * kRowsPerTask;
    gemm_reference_rows<float, In>(transpose_a, transpose_b, N, K, A, lda, B, ldb, accumulate, C, ldc, begin,
                                   std::min(M, begin + kRowsPerTask));
  }
}

// A small product with exact small-integer sums (exact in bfloat16 too), through every layout: a library that
// computes wrong results on this CPU is not used. With bf16, through the bf16 matmul primitive (whose kernel
// name goes to `bf16_implementation`); false when it has none. `packed_b_agrees` (bf16 only) is set to
// whether the packed-B product (onednn_matmul_packed_b) exists and agrees too.
bool onednn_agrees_with_reference(OneDnn& dnn, bool bf16, std::string* bf16_implementation = nullptr,
                                  bool* packed_b_agrees = nullptr) {
  if (packed_b_agrees != nullptr) *packed_b_agrees = true;
  constexpr int64_t M = 19, N = 23, K = 37;
  std::vector<float> a(M * K), b(K * N), expected(M * N), found(M * N);
  for (int64_t i = 0; i < M * K; ++i) a[i] = static_cast<float>((i * 7) % 11) - 5.0f;
  for (int64_t i = 0; i < K * N; ++i) b[i] = static_cast<float>((i * 5) % 13) - 6.0f;
  std::vector<uint16_t> a_bf16(bf16 ? a.size() : 0), b_bf16(bf16 ? b.size() : 0);
  if (bf16) {
    round_to_bfloat16(a.data(), 1, M * K, M * K, a_bf16.data());
    round_to_bfloat16(b.data(), 1, K * N, K * N, b_bf16.data());
    // The kernel name is the one a training-sized shape gets (a 19 x 23 product may get another).
    dnnl_memory_desc_t descs[3] = {};
    if (onednn_matmul_primitive(dnn, dnnl_bf16, false, true, 256, 768, 768, 768, 768, false, 768, descs,
                                bf16_implementation) == nullptr) {
      return false;
    }
  }
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      for (const bool accumulate : {false, true}) {
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        for (int64_t i = 0; i < M * N; ++i) expected[i] = found[i] = static_cast<float>(i % 3);
        gemm_reference(ta, tb, M, N, K, a.data(), lda, b.data(), ldb, accumulate, expected.data(), N);
        if (!bf16) {
          onednn_gemm(dnn, ta, tb, M, N, K, a.data(), lda, b.data(), ldb, accumulate, found.data(), N);
          if (expected != found) return false;
          continue;
        }
        if (!onednn_matmul(dnn, dnnl_bf16, ta, tb, M, N, K, a_bf16.data(), lda, b_bf16.data(), ldb,
                           accumulate, found.data(), N) ||
            expected != found)
          return false;
        if (packed_b_agrees != nullptr && *packed_b_agrees) {
          // The packed-B product (B in float32, rounded by oneDNN's reorder), with a scratch large enough for
          // any padding of its layout at this small shape.
          for (int64_t i = 0; i < M * N; ++i) found[i] = static_cast<float>(i % 3);
          std::vector<uint16_t> b_scratch(4 * (K + 64) * (N + 64));
          *packed_b_agrees = onednn_matmul_packed_b(dnn, ta, tb, M, N, K, a_bf16.data(), lda, b.data(), ldb,
                                                    accumulate, found.data(), N, b_scratch.data(),
                                                    b_scratch.size() * sizeof(uint16_t), nullptr) &&
                             expected == found;
        }
      }
    }
  }
  return true;
}

// True when there is nothing to multiply: M or N is 0, or K is 0 (libraries reject a zero leading
// dimension), which leaves C (accumulate) or zeroes it.
bool empty_product(int64_t M, int64_t N, int64_t K, bool accumulate, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return true;
  if (K != 0) return false;
  if (!accumulate) {
    for (int64_t m = 0; m < M; ++m) std::fill(C + m * ldc, C + m * ldc + N, 0.0f);
  }
  return true;
}

const std::string kReferenceWarning = "matmuls run the plain reference GEMM, 10-50x slower than oneDNN";

GemmBackend choose_backend() {
  const CpuFeatures& cpu = cpu_features();
  GemmBackend backend;
  const char* forced = std::getenv("MESHTRAIN_GEMM_BACKEND");
  const std::string request = forced != nullptr ? forced : "";
  if (!request.empty() && request != "onednn" && request != "reference") {
    fail("environment variable MESHTRAIN_GEMM_BACKEND", "onednn or reference (or unset)",
         "'" + request + "'");
  }
  if (request == "reference") {
    backend = {"reference", "plain C++", "compiler target " + cpu.widest_float_isa(),
               kReferenceWarning + " (MESHTRAIN_GEMM_BACKEND=reference)", "reference"};
    return backend;
  }
  std::string why;
  OneDnn* dnn = load_onednn(why);
  if (dnn != nullptr && !onednn_agrees_with_reference(*dnn, false)) {
    why = "oneDNN's result differs from the reference GEMM on this CPU";
    dnn = nullptr;
  }
  if (dnn == nullptr) {
    if (request == "onednn")
      fail("MESHTRAIN_GEMM_BACKEND=onednn", "oneDNN loaded and correct", why,
           "install libdnnl2 (scripts/setup.sh does), or unset MESHTRAIN_GEMM_BACKEND");
    return {"reference", "plain C++", "compiler target " + cpu.widest_float_isa(),
            why + ": " + kReferenceWarning + "; install libdnnl2 (scripts/setup.sh does)", "reference"};
  }
  g_onednn = dnn;
  // bf16 inputs: oneDNN's kernel for them when it has one that agrees with the reference.
  g_onednn_bf16 = onednn_agrees_with_reference(*dnn, true, &backend.bf16_isa, &g_onednn_packed_b);
  g_onednn_packed_b = g_onednn_bf16 && g_onednn_packed_b;
  if (!g_onednn_bf16) backend.bf16_isa = "reference (oneDNN has no bf16 matmul for this CPU)";
  const dnnl_version_t* version = dnn->dnnl_version();
  const dnnl_cpu_isa_t isa = dnn->dnnl_get_effective_cpu_isa();
  backend.name = "onednn";
  backend.version = "oneDNN " + std::to_string(version->major) + "." + std::to_string(version->minor) + "." +
                    std::to_string(version->patch);
  backend.isa = onednn_isa_name(isa);
  // oneDNN's ISA values nest (each includes the bits of the ones below it): check against CPUID.
  const auto includes = [&](dnnl_cpu_isa_t wanted) {
    return (static_cast<unsigned>(isa) & static_cast<unsigned>(wanted)) == static_cast<unsigned>(wanted);
  };
  const std::string cpu_isa = cpu.widest_float_isa();
  if ((cpu_isa == "avx512" && !includes(dnnl_cpu_isa_avx512_core)) ||
      (cpu_isa == "avx2" && !includes(dnnl_cpu_isa_avx2))) {
    backend.warning = "this CPU has " + cpu_isa + " but oneDNN runs " + backend.isa +
                      " kernels (is ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA set?): matmuls run slower than "
                      "this CPU allows";
  } else if (cpu_isa == "avx" || cpu_isa == "sse") {
    backend.warning = "this CPU has no AVX2 and FMA: oneDNN runs its " + backend.isa +
                      " kernels, several times slower than on an AVX2 CPU of the same clock";
  }
  return backend;
}

}  // namespace

std::string GemmBackend::describe() const {
  if (name == "onednn") return version + " (sgemm + matmul primitive), isa " + isa + ", bf16 " + bf16_isa;
  return "reference GEMM (" + version + ", " + isa + ")";
}

const GemmBackend& gemm_backend() {
  static const GemmBackend backend = [] {
    GemmBackend chosen = choose_backend();
    if (!chosen.warning.empty()) std::fprintf(stderr, "meshtrain: warning: %s\n", chosen.warning.c_str());
    return chosen;
  }();
  return backend;
}

void gemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  if (empty_product(M, N, K, accumulate, C, ldc)) return;
  gemm_backend();
  if (g_onednn != nullptr) {
    onednn_gemm(*g_onednn, transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
  } else {
    reference_gemm_threaded(transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
  }
}

void gemm_bf16(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  if (empty_product(M, N, K, accumulate, C, ldc)) return;
  gemm_backend();
  // oneDNN, unless it has no bf16 matmul for this CPU or (after its check passed) for this shape.
  if (g_onednn == nullptr || !g_onednn_bf16 ||
      !onednn_matmul(*g_onednn, dnnl_bf16, transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C,
                     ldc)) {
    reference_gemm_threaded(transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc);
  }
}

void gemm_bf16_float32_b(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K,
                         const uint16_t* A, int64_t lda, const float* B, int64_t ldb, bool accumulate,
                         float* C, int64_t ldc, uint16_t* b_scratch, const float* bias) {
  MT_CHECK(bias == nullptr || !accumulate, "gemm_bf16_float32_b adds a bias only to a product it writes");
  // C = the bias in every row: all of C when there is no product (K == 0), else where the fallback adds it.
  const auto start_with_bias = [&] {
    for (int64_t m = 0; m < M; ++m) std::copy(bias, bias + N, C + m * ldc);
  };
  if (bias != nullptr && K == 0) {
    start_with_bias();
    return;
  }
  if (empty_product(M, N, K, accumulate, C, ldc)) return;
  gemm_backend();
  if (g_onednn != nullptr && g_onednn_packed_b &&
      onednn_matmul_packed_b(*g_onednn, transpose_a, transpose_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc,
                             b_scratch, static_cast<size_t>(K * N) * sizeof(uint16_t), bias)) {
    return;
  }
  // Rounded as stored (row-major [K, N], or [N, K] when transposed), then the plain bf16 product added to the
  // bias rows.
  const int64_t rows = transpose_b ? N : K, cols = transpose_b ? K : N;
  round_to_bfloat16(B, rows, cols, ldb, b_scratch);
  if (bias != nullptr) start_with_bias();
  gemm_bf16(transpose_a, transpose_b, M, N, K, A, lda, b_scratch, cols, accumulate || bias != nullptr, C,
            ldc);
}

}  // namespace meshtrain::kernels
