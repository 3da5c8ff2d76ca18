// GEMM throughput benchmark: one source, one executable per BLAS library (OpenBLAS and BLIS both export
// cblas_sgemm, so they can never share a process). The backend is chosen at compile time:
//   MESHTRAIN_GEMM_OPENBLAS  -> bench_gemm_openblas  (cblas_sgemm, Debian's OpenMP build of OpenBLAS)
//   MESHTRAIN_GEMM_BLIS      -> bench_gemm_blis      (cblas_sgemm, Debian's OpenMP build of BLIS)
//   MESHTRAIN_GEMM_ONEDNN    -> bench_gemm_onednn    (dnnl_sgemm; matmul primitive in f32; matmul primitive
//                                                     with bf16 inputs and f32 output)
//   MESHTRAIN_GEMM_ENGINE    -> bench_gemm_engine    (meshtrain's own kernels::gemm: the backend and entry
//   point
//                                                     the engine picks per layout, as training runs it)
//
// Every GEMM is row-major C[M,N] = op(A) op(B) (+ C for the weight-gradient shapes, which accumulate like the
// engine's parameter gradients). Per shape: one checked call (sampled entries against a double-precision dot
// product), warm-up, then timed calls until MESHTRAIN_BENCH_SECONDS (default 0.5 s) and at least 5 calls have
// run. One line per shape: median GFLOP/s over the calls, min..max, and % of an assumed theoretical peak.
// Each line also says how much CPU other processes took meanwhile; a disturbed measurement is retried.
// Threads: OMP_NUM_THREADS (all three libraries run on the same libgomp runtime).
// Usage: bench_gemm_<lib> [shape-name-substring ...]   (no argument: every shape)

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#if defined(MESHTRAIN_GEMM_OPENBLAS)
#include <cblas.h>
#elif defined(MESHTRAIN_GEMM_BLIS)
#include <blis.h>
#elif defined(MESHTRAIN_GEMM_ONEDNN)
#include <oneapi/dnnl/dnnl.h>

#include <oneapi/dnnl/dnnl.hpp>
#elif defined(MESHTRAIN_GEMM_ENGINE)
#include "meshtrain/core/cpu_features.h"
#include "meshtrain/kernels/cpu/gemm.h"
#else
#error \
    "define one of MESHTRAIN_GEMM_OPENBLAS, MESHTRAIN_GEMM_BLIS, MESHTRAIN_GEMM_ONEDNN, MESHTRAIN_GEMM_ENGINE"
#endif

namespace {

struct Shape {
  const char* name;
  bool trans_a;  // A stored [K,M] instead of [M,K]
  bool trans_b;  // B stored [N,K] instead of [K,N]
  std::int64_t m, n, k;
  bool accumulate;  // beta = 1 (parameter gradients accumulate)
};

// Weights are stored [out, in] (see shared/specs/layers-and-checkpoints.md), 256 tokens per micro-batch,
// GPT-2 small widths (D = 768, F = 3072, V = 50304):
//   forward   Y[T,O]  = X[T,I] W[O,I]^T     -> NT
//   backward  dX[T,I] = dY[T,O] W[O,I]      -> NN
//             dW[O,I] += dY[T,O]^T X[T,I]   -> TN
constexpr Shape kShapes[] = {
    {"square256", false, false, 256, 256, 256, false},
    {"square512", false, false, 512, 512, 512, false},
    {"square1024", false, false, 1024, 1024, 1024, false},
    {"square2048", false, false, 2048, 2048, 2048, false},
    {"fwd_fc1", false, true, 256, 3072, 768, false},           // X @ W_up^T
    {"fwd_fc2", false, true, 256, 768, 3072, false},           // H @ W_down^T
    {"fwd_unembed", false, true, 256, 50304, 768, false},      // X @ E^T (logits)
    {"bwd_dx_fc1", false, false, 256, 768, 3072, false},       // dH @ W_up
    {"bwd_dw_fc1", true, false, 3072, 768, 256, true},         // dW_up += dH^T X
    {"bwd_dw_xtdy", true, false, 768, 3072, 256, true},        // dW[in,out] += X^T dY (768x256 @ 256x3072)
    {"bwd_dx_unembed", false, false, 256, 768, 50304, false},  // dLogits @ E
    {"bwd_dw_unembed", true, false, 50304, 768, 256, true},    // dE += dLogits^T X
};

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using Buffer = std::unique_ptr<T[], AlignedFree>;

template <typename T>
Buffer<T> allocate(std::size_t count) {
  std::size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
  auto* p = static_cast<T*>(std::aligned_alloc(64, bytes));
  if (p == nullptr) {
    std::fprintf(stderr, "allocation of %zu bytes failed\n", bytes);
    std::exit(2);
  }
  return Buffer<T>(p);
}

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  return (end != v && d > 0) ? d : fallback;
}

int env_count(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return (end != v && n >= 0 && n <= 100) ? static_cast<int>(n) : fallback;
}

// bf16 <-> f32 by bit manipulation (round to nearest even; inputs here are finite).
std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float from_bf16(std::uint16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Operands of one shape in f32 (A, B, C). A element (i,p) and B element (p,j) of the LOGICAL matrices op(A),
// op(B) are read through these helpers for the reference check.
struct Operands {
  const Shape& s;
  Buffer<float> a, b, c;
  std::int64_t lda, ldb, ldc;

  explicit Operands(const Shape& shape)
      : s(shape),
        a(allocate<float>(static_cast<std::size_t>(shape.m * shape.k))),
        b(allocate<float>(static_cast<std::size_t>(shape.k * shape.n))),
        c(allocate<float>(static_cast<std::size_t>(shape.m * shape.n))),
        lda(shape.trans_a ? shape.m : shape.k),
        ldb(shape.trans_b ? shape.k : shape.n),
        ldc(shape.n) {
    std::mt19937 rng(12345);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (std::int64_t i = 0; i < s.m * s.k; ++i) a[static_cast<std::size_t>(i)] = dist(rng);
    for (std::int64_t i = 0; i < s.k * s.n; ++i) b[static_cast<std::size_t>(i)] = dist(rng);
    std::fill_n(c.get(), s.m * s.n, 0.0f);
  }
  float a_at(std::int64_t i, std::int64_t p) const {
    return s.trans_a ? a[static_cast<std::size_t>(p * lda + i)] : a[static_cast<std::size_t>(i * lda + p)];
  }
  float b_at(std::int64_t p, std::int64_t j) const {
    return s.trans_b ? b[static_cast<std::size_t>(j * ldb + p)] : b[static_cast<std::size_t>(p * ldb + j)];
  }
};

// Compares sampled entries of C (computed with beta = 0) with a double-precision dot product over the
// operands as the backend saw them (rounded to bf16 when round_bf16). Returns the worst relative error.
double check_sampled(const Operands& op, bool round_bf16) {
  std::mt19937 rng(777);
  std::uniform_int_distribution<std::int64_t> row(0, op.s.m - 1), col(0, op.s.n - 1);
  double worst = 0.0;
  for (int t = 0; t < 64; ++t) {
    std::int64_t i = row(rng), j = col(rng);
    double sum = 0.0, mag = 0.0;
    for (std::int64_t p = 0; p < op.s.k; ++p) {
      float x = op.a_at(i, p), y = op.b_at(p, j);
      if (round_bf16) {
        x = from_bf16(to_bf16(x));
        y = from_bf16(to_bf16(y));
      }
      sum += static_cast<double>(x) * static_cast<double>(y);
      mag += std::fabs(static_cast<double>(x) * static_cast<double>(y));
    }
    double got = op.c[static_cast<std::size_t>(i * op.ldc + j)];
    worst = std::max(worst, std::fabs(got - sum) / std::max(mag, 1e-30));
  }
  return worst;
}

struct Stats {
  double median, min, max;
  int reps;
  double other_load;  // % of all CPUs busy with OTHER processes during the timed window (-1: unknown)
};

// System-wide busy CPU seconds (all CPUs, /proc/stat) and this process's CPU seconds (all its threads): their
// difference over a window is what other processes took from the machine while we measured.
double system_busy_seconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  unsigned long long v[8] = {};
  if (!(f >> cpu) || cpu != "cpu") return -1.0;
  for (auto& x : v) f >> x;
  const unsigned long long busy =
      v[0] + v[1] + v[2] + v[5] + v[6] + v[7];  // user nice system irq softirq steal
  return static_cast<double>(busy) / static_cast<double>(sysconf(_SC_CLK_TCK));
}
double own_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

template <typename Fn>
Stats time_gemm_once(const Shape& s, Fn& call, double seconds) {
  using clock = std::chrono::steady_clock;
  const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  // Warm-up: at least 2 calls and about 10% of the measuring window (threads spun up, pages touched, packing
  // buffers allocated).
  auto warm_start = clock::now();
  for (int i = 0; i < 2 || std::chrono::duration<double>(clock::now() - warm_start).count() < 0.1 * seconds;
       ++i) {
    call();
  }
  std::vector<double> rates;
  const double busy0 = system_busy_seconds(), own0 = own_cpu_seconds();
  auto start = clock::now();
  while (rates.size() < 5 ||
         (std::chrono::duration<double>(clock::now() - start).count() < seconds && rates.size() < 100000)) {
    auto t0 = clock::now();
    call();
    auto t1 = clock::now();
    rates.push_back(flops / std::chrono::duration<double>(t1 - t0).count() * 1e-9);
  }
  const double wall = std::chrono::duration<double>(clock::now() - start).count();
  const double busy1 = system_busy_seconds(), own1 = own_cpu_seconds();
  const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  double other = -1.0;
  if (busy0 >= 0 && busy1 >= 0 && ncpu > 0) {
    other = std::max(0.0, 100.0 * ((busy1 - busy0) - (own1 - own0)) / (wall * static_cast<double>(ncpu)));
  }
  std::sort(rates.begin(), rates.end());
  std::size_t n = rates.size();
  double median = n % 2 == 1 ? rates[n / 2] : 0.5 * (rates[n / 2 - 1] + rates[n / 2]);
  return {median, rates.front(), rates.back(), static_cast<int>(n), other};
}

// The machine is shared: when other processes took more than 10% of the CPUs during a measurement, wait a
// second and measure again (up to MESHTRAIN_BENCH_RETRIES more times, default 3); keep the least disturbed
// try.
template <typename Fn>
Stats time_gemm(const Shape& s, Fn&& call, double seconds) {
  const int retries = env_count("MESHTRAIN_BENCH_RETRIES", 3);
  Stats best = time_gemm_once(s, call, seconds);
  for (int r = 0; r < retries && best.other_load > 10.0; ++r) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    Stats again = time_gemm_once(s, call, seconds);
    if (again.other_load < best.other_load) best = again;
  }
  return best;
}

struct Context {
  int threads;
  double ghz;
  double seconds;
  double peak_f32;  // GFLOP/s for `threads` cores
};

void print_row(const Context& ctx, const std::string& lib, const char* dtype, const Shape& s, const Stats& st,
               double peak, double err) {
  char op[3] = {s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', '\0'};
  std::printf(
      "%-20s %-5s %7d  %-15s %-2s %6lld %6lld %6lld  %8.1f  %8.1f %8.1f  %6.1f%%  %6d  %6.0f%%  %.1e\n",
      lib.c_str(), dtype, ctx.threads, s.name, op, static_cast<long long>(s.m), static_cast<long long>(s.n),
      static_cast<long long>(s.k), st.median, st.min, st.max, 100.0 * st.median / peak, st.reps,
      st.other_load, err);
  std::fflush(stdout);
}

void print_header() {
  std::printf("%-20s %-5s %7s  %-15s %-2s %6s %6s %6s  %8s  %8s %8s  %7s  %6s  %7s  %s\n", "# library",
              "dtype", "threads", "shape", "op", "M", "N", "K", "median", "min", "max", "%peak", "calls",
              "others", "relerr");
  std::printf(
      "# (median/min/max in GFLOP/s; others = CPU taken by other processes during the timing, %% of all "
      "CPUs; relerr = worst sampled relative error)\n");
}

bool selected(const Shape& s, const std::vector<std::string>& filters) {
  if (filters.empty()) return true;
  for (const auto& f : filters) {
    if (std::string_view(s.name).find(f) != std::string_view::npos) return true;
  }
  return false;
}

#if defined(MESHTRAIN_GEMM_OPENBLAS) || defined(MESHTRAIN_GEMM_BLIS)

// Library label with the kernel set the library picked at run time (both choose by CPUID, and both can be
// overridden by environment: OPENBLAS_CORETYPE, BLIS_ARCH_TYPE).
std::string library_label() {
  std::string core;
#if defined(MESHTRAIN_GEMM_OPENBLAS)
  core = openblas_get_corename();
  std::string label = "openblas:";
#else
  core = bli_arch_string(bli_arch_query_id());
  std::string label = "blis:";
#endif
  for (char& ch : core) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return label + core;
}

void print_library_info(const Context& ctx) {
#if defined(MESHTRAIN_GEMM_OPENBLAS)
  const int parallel = openblas_get_parallel();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf(
      "# OpenBLAS config: %s; core=%s (OPENBLAS_CORETYPE=%s); parallel=%s; openblas_get_num_threads()=%d\n",
      openblas_get_config(), openblas_get_corename(), coretype != nullptr ? coretype : "unset",
      parallel == 0 ? "sequential" : (parallel == 1 ? "pthreads" : "openmp"), openblas_get_num_threads());
  if (openblas_get_num_threads() != ctx.threads) {
    std::printf("# WARNING: OpenBLAS threads (%d) != OMP_NUM_THREADS (%d)\n", openblas_get_num_threads(),
                ctx.threads);
  }
#else
  long long blis_threads = static_cast<long long>(bli_thread_get_num_threads());
  const char* arch_env = std::getenv("BLIS_ARCH_TYPE");
  std::printf(
      "# BLIS %s; sub-configuration %s (BLIS_ARCH_TYPE=%s; 0 = skx); bli_thread_get_num_threads()=%lld\n",
      bli_info_get_version_str(), bli_arch_string(bli_arch_query_id()),
      arch_env != nullptr ? arch_env : "unset", blis_threads);
  if (blis_threads > 0 && blis_threads != ctx.threads) {
    std::printf("# WARNING: BLIS threads (%lld) != OMP_NUM_THREADS (%d)\n", blis_threads, ctx.threads);
  }
#endif
}

void run_shape(const Context& ctx, const Shape& s) {
  Operands op(s);
  auto call = [&](float beta) {
    cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, op.a.get(),
                static_cast<int>(op.lda), op.b.get(), static_cast<int>(op.ldb), beta, op.c.get(),
                static_cast<int>(op.ldc));
  };
  call(0.0f);
  double err = check_sampled(op, false);
  const float beta = s.accumulate ? 1.0f : 0.0f;
  Stats st = time_gemm(
      s, [&] { call(beta); }, ctx.seconds);
  print_row(ctx, library_label(), "f32", s, st, ctx.peak_f32, err);
  if (err > 1e-4) std::printf("# WARNING: %s result check failed (relative error %.2e)\n", s.name, err);
}

void run_all(const Context& ctx, const std::vector<std::string>& filters) {
  for (const auto& s : kShapes) {
    if (selected(s, filters)) run_shape(ctx, s);
  }
}

#elif defined(MESHTRAIN_GEMM_ENGINE)

void print_library_info(const Context&) {
  std::printf("# meshtrain kernels::gemm: %s; cpu %s\n",
              meshtrain::kernels::gemm_backend().describe().c_str(),
              meshtrain::cpu_features().describe().c_str());
}

void run_shape(const Context& ctx, const Shape& s) {
  Operands op(s);
  auto call = [&](bool accumulate) {
    meshtrain::kernels::gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, op.a.get(), op.lda, op.b.get(), op.ldb,
                             accumulate, op.c.get(), op.ldc);
  };
  call(false);
  double err = check_sampled(op, false);
  Stats st = time_gemm(
      s, [&] { call(s.accumulate); }, ctx.seconds);
  print_row(ctx, "meshtrain:" + meshtrain::kernels::gemm_backend().name, "f32", s, st, ctx.peak_f32, err);
  if (err > 1e-4) std::printf("# WARNING: %s result check failed (relative error %.2e)\n", s.name, err);
}

void run_all(const Context& ctx, const std::vector<std::string>& filters) {
  for (const auto& s : kShapes) {
    if (selected(s, filters)) run_shape(ctx, s);
  }
}

#else  // MESHTRAIN_GEMM_ONEDNN

void print_library_info(const Context&) {
  const dnnl_version_t* v = dnnl_version();
  std::printf("# oneDNN %d.%d.%d (%s); effective ISA id 0x%x (0xe7 = avx512_core_bf16)\n", v->major, v->minor,
              v->patch, v->hash, static_cast<unsigned>(dnnl_get_effective_cpu_isa()));
}

// A oneDNN matmul primitive for one shape, created outside the timed loop (as the engine would cache it).
// Logical src [M,K], weights [K,N], dst [M,N] f32; transposed operands are described by strides, no copies.
struct Matmul {
  dnnl::matmul prim;
  dnnl::memory src, wei, dst;
  std::string impl;

  Matmul(dnnl::engine& eng, const Shape& s, dnnl::memory::data_type in_type, void* a, void* b, float* c,
         bool accumulate) {
    using dims = dnnl::memory::dims;
    dnnl::memory::desc src_md(dims{s.m, s.k}, in_type, s.trans_a ? dims{1, s.m} : dims{s.k, 1});
    dnnl::memory::desc wei_md(dims{s.k, s.n}, in_type, s.trans_b ? dims{1, s.k} : dims{s.n, 1});
    dnnl::memory::desc dst_md(dims{s.m, s.n}, dnnl::memory::data_type::f32, dims{s.n, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), attr, eng);
    impl = pd.impl_info_str();
    prim = dnnl::matmul(pd);
    src = dnnl::memory(src_md, eng, a);
    wei = dnnl::memory(wei_md, eng, b);
    dst = dnnl::memory(dst_md, eng, c);
  }
  void operator()(dnnl::stream& strm) {
    prim.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    strm.wait();
  }
};

// Whether this oneDNN build has a bf16 matmul for this CPU. oneDNN 2.6 has none on AVX2-only CPUs
// (Zen 3): creating the primitive descriptor throws, so the bench asks once and skips the bf16 rows.
bool bf16_matmul_available(dnnl::engine& eng) {
  using dims = dnnl::memory::dims;
  dnnl::memory::desc in_md(dims{16, 16}, dnnl::memory::data_type::bf16, dims{16, 1});
  dnnl::memory::desc out_md(dims{16, 16}, dnnl::memory::data_type::f32, dims{16, 1});
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(in_md, in_md, out_md), eng);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

void run_shape(const Context& ctx, const Shape& s, dnnl::engine& eng, dnnl::stream& strm, bool with_bf16) {
  Operands op(s);
  const float beta = s.accumulate ? 1.0f : 0.0f;

  // 1. dnnl_sgemm (row-major BLAS-like entry point).
  {
    auto call = [&](float b) {
      dnnl_status_t st = dnnl_sgemm(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f,
                                    op.a.get(), op.lda, op.b.get(), op.ldb, b, op.c.get(), op.ldc);
      if (st != dnnl_success) {
        std::fprintf(stderr, "dnnl_sgemm failed: %d\n", static_cast<int>(st));
        std::exit(2);
      }
    };
    call(0.0f);
    double err = check_sampled(op, false);
    Stats st = time_gemm(
        s, [&] { call(beta); }, ctx.seconds);
    print_row(ctx, "onednn:sgemm", "f32", s, st, ctx.peak_f32, err);
    if (err > 1e-4) std::printf("# WARNING: %s sgemm check failed (relative error %.2e)\n", s.name, err);
  }

  // 2. matmul primitive, f32 in / f32 out.
  {
    std::fill_n(op.c.get(), s.m * s.n, 0.0f);
    Matmul check(eng, s, dnnl::memory::data_type::f32, op.a.get(), op.b.get(), op.c.get(), false);
    check(strm);
    double err = check_sampled(op, false);
    Matmul mm(eng, s, dnnl::memory::data_type::f32, op.a.get(), op.b.get(), op.c.get(), s.accumulate);
    Stats st = time_gemm(
        s, [&] { mm(strm); }, ctx.seconds);
    print_row(ctx, "onednn:matmul", "f32", s, st, ctx.peak_f32, err);
    if (err > 1e-4) std::printf("# WARNING: %s f32 matmul check failed (relative error %.2e)\n", s.name, err);
  }

  // 3. matmul primitive, bf16 in / f32 out (fp32 accumulation). Inputs are converted once, outside the
  //    timing: this measures the GEMM only, not the f32 -> bf16 conversion of activations.
  if (with_bf16) {
    auto a16 = allocate<std::uint16_t>(static_cast<std::size_t>(s.m * s.k));
    auto b16 = allocate<std::uint16_t>(static_cast<std::size_t>(s.k * s.n));
    for (std::int64_t i = 0; i < s.m * s.k; ++i)
      a16[static_cast<std::size_t>(i)] = to_bf16(op.a[static_cast<std::size_t>(i)]);
    for (std::int64_t i = 0; i < s.k * s.n; ++i)
      b16[static_cast<std::size_t>(i)] = to_bf16(op.b[static_cast<std::size_t>(i)]);
    std::fill_n(op.c.get(), s.m * s.n, 0.0f);
    Matmul check(eng, s, dnnl::memory::data_type::bf16, a16.get(), b16.get(), op.c.get(), false);
    check(strm);
    double err = check_sampled(op, true);
    Matmul mm(eng, s, dnnl::memory::data_type::bf16, a16.get(), b16.get(), op.c.get(), s.accumulate);
    Stats st = time_gemm(
        s, [&] { mm(strm); }, ctx.seconds);
    print_row(ctx, "onednn:matmul", "bf16", s, st, 2.0 * ctx.peak_f32, err);
    std::printf("#   bf16 impl: %s\n", mm.impl.c_str());
    if (err > 1e-4)
      std::printf("# WARNING: %s bf16 matmul check failed (relative error %.2e)\n", s.name, err);
  }
}

void run_all(const Context& ctx, const std::vector<std::string>& filters) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const bool with_bf16 = bf16_matmul_available(eng);
  if (!with_bf16)
    std::printf(
        "# bf16 matmul unsupported by this oneDNN on this CPU (no AVX512-BF16 / AMX / AVX512 core): "
        "bf16 rows skipped\n");
  for (const auto& s : kShapes) {
    if (selected(s, filters)) run_shape(ctx, s, eng, strm, with_bf16);
  }
}

#endif

// Rough core clock of the thread running main: a chain of dependent register adds retires one add per cycle.
// Best of 20 trials of 10^7 adds (a few ms each). Informational only; the peak uses MESHTRAIN_BENCH_GHZ.
double estimate_ghz() {
#if defined(__x86_64__)
  using clock = std::chrono::steady_clock;
  double best = 0.0;
  for (int trial = 0; trial < 20; ++trial) {
    std::uint64_t x = 0;
    auto t0 = clock::now();
    for (int i = 0; i < 10000; ++i) {
      asm volatile(".rept 1000\n\tadd $1, %0\n\t.endr" : "+r"(x));
    }
    auto t1 = clock::now();
    best = std::max(best, 1e-2 / std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
#else
  return 0.0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  Context ctx{};
  ctx.threads = omp_get_max_threads();
  ctx.ghz = env_double("MESHTRAIN_BENCH_GHZ", 3.6);
  ctx.seconds = env_double("MESHTRAIN_BENCH_SECONDS", 0.5);
  const double flop_per_cycle = env_double("MESHTRAIN_BENCH_FLOP_PER_CYCLE", 32.0);
  ctx.peak_f32 = flop_per_cycle * ctx.threads * ctx.ghz;
  std::vector<std::string> filters(argv + 1, argv + argc);

  const char* omp_env = std::getenv("OMP_NUM_THREADS");
  std::printf("# meshtrain GEMM benchmark: threads=%d (OMP_NUM_THREADS=%s)\n", ctx.threads,
              omp_env != nullptr ? omp_env : "unset -> all cores");
  std::printf(
      "# peak assumption: %.0f fp32 FLOP/cycle/core (MESHTRAIN_BENCH_FLOP_PER_CYCLE) x %d cores x %.2f GHz "
      "(MESHTRAIN_BENCH_GHZ) = %.1f GFLOP/s fp32, %.1f GFLOP/s bf16 (2x)\n",
      flop_per_cycle, ctx.threads, ctx.ghz, ctx.peak_f32, 2.0 * ctx.peak_f32);
  std::printf("# clock estimate (dependent-add chain, main thread): %.2f GHz\n", estimate_ghz());
  std::printf(
      "# timing: warm-up, then >= 5 calls and >= %.2f s per shape (MESHTRAIN_BENCH_SECONDS); "
      "GFLOP/s = 2MNK / call time; median, min, max over calls\n",
      ctx.seconds);
  print_library_info(ctx);
  print_header();
  run_all(ctx, filters);
  return 0;
}
