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
#include <tuple>
#include <vector>

#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/error.h"

namespace meshtrain::kernels {
namespace {

// The oneDNN C functions the engine calls, looked up in the library loaded at run time. The header gives
// their exact types; the soname (libdnnl.so.2) pins the 2.x interface the header describes.
#define MESHTRAIN_ONEDNN_FUNCTIONS(X)                                                                   \
  X(dnnl_version)                                                                                       \
  X(dnnl_get_effective_cpu_isa)                                                                         \
  X(dnnl_sgemm)                                                                                         \
  X(dnnl_engine_create)                                                                                 \
  X(dnnl_stream_create)                                                                                 \
  X(dnnl_stream_wait)                                                                                   \
  X(dnnl_memory_desc_init_by_strides) X(dnnl_matmul_desc_init) X(dnnl_primitive_attr_create)            \
      X(dnnl_primitive_attr_destroy) X(dnnl_post_ops_create) X(dnnl_post_ops_destroy)                   \
          X(dnnl_post_ops_append_sum) X(dnnl_primitive_attr_set_post_ops) X(dnnl_primitive_desc_create) \
              X(dnnl_primitive_desc_destroy) X(dnnl_primitive_create) X(dnnl_memory_create)             \
                  X(dnnl_memory_destroy) X(dnnl_primitive_execute) X(dnnl_primitive_desc_query)

struct OneDnn {
#define MESHTRAIN_DECLARE(name) decltype(&::name) name = nullptr;
  MESHTRAIN_ONEDNN_FUNCTIONS(MESHTRAIN_DECLARE)
#undef MESHTRAIN_DECLARE
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  // One matmul primitive per (input type, M, N, K, lda, ldb, ldc, accumulate), created on first use.
  std::map<std::tuple<dnnl_data_type_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>,
           dnnl_primitive_t>
      matmuls;
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
bool g_onednn_bf16 = false;  // oneDNN's bf16 matmul runs and agrees with the reference

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
  dnnl_primitive_attr_t attr = nullptr;
  check_onednn(dnn.dnnl_primitive_attr_create(&attr), "attr");
  if (accumulate) {  // C += : a sum post-op
    dnnl_post_ops_t post_ops = nullptr;
    check_onednn(dnn.dnnl_post_ops_create(&post_ops), "post ops");
    check_onednn(dnn.dnnl_post_ops_append_sum(post_ops, 1.0f), "sum post op");
    check_onednn(dnn.dnnl_primitive_attr_set_post_ops(attr, post_ops), "set post ops");
    dnn.dnnl_post_ops_destroy(post_ops);
  }
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
// name goes to `bf16_implementation`); false when it has none.
bool onednn_agrees_with_reference(OneDnn& dnn, bool bf16, std::string* bf16_implementation = nullptr) {
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
        if (bf16) {
          if (!onednn_matmul(dnn, dnnl_bf16, ta, tb, M, N, K, a_bf16.data(), lda, b_bf16.data(), ldb,
                             accumulate, found.data(), N))
            return false;
        } else {
          onednn_gemm(dnn, ta, tb, M, N, K, a.data(), lda, b.data(), ldb, accumulate, found.data(), N);
        }
        if (expected != found) return false;
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
  g_onednn_bf16 = onednn_agrees_with_reference(*dnn, true, &backend.bf16_isa);
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

}  // namespace meshtrain::kernels
