// Throughput of every CPU kernel at the training shapes of qwen3-tiny (B=16, S=128) and gpt2-124m (B=8,
// S=256), forward and backward, and the fast kernel against its plain reference (the speed-up); then
// attention at qwen3-0.6b's long-context shapes (S=2048, 4096).
//
//   build/bench/bench_kernels [filter...]        e.g. bench_kernels qwen3 matmul   (every word must match a
//   row)
//
// Environment: MESHTRAIN_BENCH_SECONDS (default 0.3, timing window per measurement), MESHTRAIN_BENCH_RETRIES
// (default 2: re-measure when other processes took >10% of the CPUs), MESHTRAIN_BENCH_NO_REFERENCE=1 (skip
// the references), MESHTRAIN_BENCH_DTYPE=bfloat16 (the matmuls, attention and the fused loss with bf16
// inputs, as dtype=bfloat16 runs them), OMP_NUM_THREADS (threads of the fast kernels; the references are
// plain single-threaded loops). Never fails: it prints a table and exits 0.
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "meshtrain/core/arena.h"
#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/kernels/cpu/adamw.h"
#include "meshtrain/kernels/cpu/attention.h"
#include "meshtrain/kernels/cpu/cross_entropy.h"
#include "meshtrain/kernels/cpu/embedding.h"
#include "meshtrain/kernels/cpu/gelu.h"
#include "meshtrain/kernels/cpu/gemm.h"
#include "meshtrain/kernels/cpu/layernorm.h"
#include "meshtrain/kernels/cpu/matmul.h"
#include "meshtrain/kernels/cpu/residual.h"
#include "meshtrain/kernels/cpu/rmsnorm.h"
#include "meshtrain/kernels/cpu/rope.h"
#include "meshtrain/kernels/cpu/swiglu.h"

namespace {

namespace k = meshtrain::kernels;
using Clock = std::chrono::steady_clock;

double env_double(const char* name, double fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atof(value) : fallback;
}

// ---------------------------------------------------------------------------------------------------------------
// Timing (the same rules as bench_gemm.cpp): warm-up, then calls until at least 5 calls and the window have
// run; each call timed alone; median, min and max of the rate. `others`: the % of all CPUs that other
// processes took during the window (/proc/stat busy time minus this process's getrusage time).

struct Stats {
  double median = NAN, min = NAN, max = NAN, seconds_per_call = NAN;
  int calls = 0;
  double others = -1.0;
};

double system_busy_seconds() {
  std::ifstream file("/proc/stat");
  std::string cpu;
  unsigned long long v[8] = {};
  if (!(file >> cpu) || cpu != "cpu") return -1.0;
  for (auto& x : v) file >> x;
  const unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  return static_cast<double>(busy) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double own_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

Stats time_once(double work, const std::function<void()>& call, double window, int minimum_calls) {
  const auto warm_start = Clock::now();
  for (int i = 0; i < 1 || std::chrono::duration<double>(Clock::now() - warm_start).count() < 0.1 * window;
       ++i) {
    call();
  }
  std::vector<double> seconds;
  const double busy0 = system_busy_seconds(), own0 = own_cpu_seconds();
  const auto start = Clock::now();
  while (static_cast<int>(seconds.size()) < minimum_calls ||
         (std::chrono::duration<double>(Clock::now() - start).count() < window && seconds.size() < 100000)) {
    const auto t0 = Clock::now();
    call();
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const double busy1 = system_busy_seconds(), own1 = own_cpu_seconds();
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  Stats stats;
  if (busy0 >= 0 && busy1 >= 0 && cpus > 0) {
    stats.others =
        std::max(0.0, 100.0 * ((busy1 - busy0) - (own1 - own0)) / (wall * static_cast<double>(cpus)));
  }
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  const double median = n % 2 == 1 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  stats.seconds_per_call = median;
  stats.median = work / median;
  stats.min = work / seconds.back();
  stats.max = work / seconds.front();
  stats.calls = static_cast<int>(n);
  return stats;
}

Stats time_call(double work, const std::function<void()>& call, double window, int minimum_calls = 5) {
  const int retries = static_cast<int>(env_double("MESHTRAIN_BENCH_RETRIES", 2));
  Stats best = time_once(work, call, window, minimum_calls);
  for (int r = 0; r < retries && best.others > 10.0; ++r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const Stats again = time_once(work, call, window, minimum_calls);
    if (again.others < best.others) best = again;
  }
  return best;
}

// ---------------------------------------------------------------------------------------------------------------
// Data

std::vector<float> random_floats(int64_t count, uint64_t seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = distribution(generator);
  return values;
}

std::vector<int32_t> random_ids(int64_t count, int64_t limit, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::uniform_int_distribution<int32_t> distribution(0, static_cast<int32_t>(limit - 1));
  std::vector<int32_t> values(static_cast<size_t>(count));
  for (int32_t& value : values) value = distribution(generator);
  return values;
}

// The shapes of one training configuration.
struct Model {
  std::string name;
  int64_t B, S, D, H, K, d, F, V, V_valid, layers;
  bool gpt2;  // LayerNorm, GELU, biases, learned positions; else RMSNorm, SwiGLU, RoPE, q/k norms
  int64_t N() const { return B * S; }
  // Rows of logits per chunk, as the model sizes it.
  int64_t chunk() const { return k::cross_entropy_chunk_tokens(N(), V); }
};

// One row of the table. `work` is per call, in GFLOP (unit GFLOP/s) or GB (unit GB/s). The reference, when
// present, runs on `reference_work` (the same kernel on fewer tokens when the full shape would take too
// long).
struct Case {
  std::string kernel, pass, shape, unit;
  double work;
  int per_step;  // calls per training step (for the ms/step column)
  std::function<void()> fast;
  double reference_work = 0.0;
  std::function<void()> reference;
  std::string note;

  Case(std::string kernel_, std::string pass_, std::string shape_, std::string unit_, double work_,
       int per_step_, std::function<void()> fast_, double reference_work_, std::function<void()> reference_,
       std::string note_ = "")
      : kernel(std::move(kernel_)),
        pass(std::move(pass_)),
        shape(std::move(shape_)),
        unit(std::move(unit_)),
        work(work_),
        per_step(per_step_),
        fast(std::move(fast_)),
        reference_work(reference_work_),
        reference(std::move(reference_)),
        note(std::move(note_)) {}
};

// ---------------------------------------------------------------------------------------------------------------
// Cases. Buffers live in shared_ptrs captured by the lambdas, aligned as the engine's arena aligns its
// buffers (kArenaAlignment, a cache line): from std::vector's 16-byte alignment, oneDNN's AMX bf16 GEMM ran a
// 1024-cube at 1,480-1,740 GFLOP/s against 2,300-2,490 aligned (bench/README.md).

template <class T>
struct ArenaAlignedAllocator {
  using value_type = T;
  ArenaAlignedAllocator() = default;
  template <class U>
  explicit ArenaAlignedAllocator(const ArenaAlignedAllocator<U>&) {}
  T* allocate(size_t count) {
    void* memory =
        std::aligned_alloc(meshtrain::kArenaAlignment,
                           std::max(meshtrain::kArenaAlignment, meshtrain::align_up(count * sizeof(T))));
    if (memory == nullptr) throw std::bad_alloc();
    return static_cast<T*>(memory);
  }
  void deallocate(T* memory, size_t) { std::free(memory); }
  bool operator==(const ArenaAlignedAllocator&) const { return true; }
};
template <class T>
using Buffer = std::vector<T, ArenaAlignedAllocator<T>>;

template <class T>
std::shared_ptr<Buffer<T>> share(const std::vector<T>& values) {
  return std::make_shared<Buffer<T>>(values.begin(), values.end());
}

std::string dims(std::initializer_list<int64_t> values) {
  std::string text;
  for (int64_t value : values) text += (text.empty() ? "" : "x") + std::to_string(value);
  return text;
}

constexpr double kGiga = 1e9;

bool bench_bf16() {
  const char* dtype = std::getenv("MESHTRAIN_BENCH_DTYPE");
  return dtype != nullptr && std::string(dtype) == "bfloat16";
}

void add_matmul(std::vector<Case>& cases, const Model& m, const std::string& what, int64_t I, int64_t O,
                int per_step) {
  const int64_t N = m.N();
  const int64_t reference_rows = std::min<int64_t>(N, 128);
  auto x = share(random_floats(N * I, 1)), w = share(random_floats(I * O, 2, -0.05f, 0.05f));
  auto bias = share(random_floats(O, 3)), out = share(std::vector<float>(N * O));
  auto dout = share(random_floats(N * O, 4)), dx = share(std::vector<float>(N * I));
  auto dw = share(std::vector<float>(I * O)), dbias = share(std::vector<float>(O));
  // GPT-2's linears have biases; the shared_ptrs are captured (not only the pointers) so the buffers live.
  const bool has_bias = m.gpt2;
  const double flops = 2.0 * static_cast<double>(N * I * O) / kGiga;
  const double reference_flops = 2.0 * static_cast<double>(reference_rows * I * O) / kGiga;
  const std::string shape = dims({N, I, O});
  const std::string note = reference_rows < N ? "ref on " + std::to_string(reference_rows) + " rows" : "";
  // MESHTRAIN_BENCH_DTYPE=bfloat16: bf16 inputs (rounded in the call, as dtype=bfloat16 runs them).
  const bool bf16 = bench_bf16();
  auto scratch = share(std::vector<uint16_t>(bf16 ? k::matmul_bf16_scratch_elements(N, I, O, false) : 0));
  uint16_t* bf16_inputs = bf16 ? scratch->data() : nullptr;
  const std::string kernel = bf16 ? "matmul bf16 " + what : "matmul " + what;
  cases.push_back({kernel, "fwd", shape, "GFLOP/s", flops, per_step,
                   [=] {
                     (void)scratch;
                     k::matmul_forward(out->data(), x->data(), w->data(), has_bias ? bias->data() : nullptr,
                                       N, I, O, bf16_inputs);
                   },
                   reference_flops,
                   [=] {
                     k::matmul_reference_forward(out->data(), x->data(), w->data(),
                                                 has_bias ? bias->data() : nullptr, reference_rows, I, O);
                   },
                   note});
  cases.push_back({kernel, "bwd", shape, "GFLOP/s", 2.0 * flops, per_step,
                   [=] {
                     (void)scratch;
                     k::matmul_backward(dx->data(), dw->data(), has_bias ? dbias->data() : nullptr,
                                        dout->data(), x->data(), w->data(), N, I, O, false, bf16_inputs);
                   },
                   2.0 * reference_flops,
                   [=] {
                     k::matmul_reference_backward(dx->data(), dw->data(), has_bias ? dbias->data() : nullptr,
                                                  dout->data(), x->data(), w->data(), reference_rows, I, O,
                                                  false);
                   },
                   note});
  if (!bf16) return;
  // The same product with x stored in bf16 by its producer (a norm's output, the MLP's gated hidden): only
  // w and dout are rounded in the call. The difference to the rows above is the rounding of x.
  auto x_bf16 = share(std::vector<uint16_t>(static_cast<size_t>(N * I)));
  meshtrain::round_to_bfloat16(x->data(), N, I, I, x_bf16->data());
  const std::string stored = kernel + " x stored bf16";
  cases.push_back({stored, "fwd", shape, "GFLOP/s", flops, per_step,
                   [=] {
                     k::matmul_forward_bf16_x(out->data(), x_bf16->data(), w->data(),
                                              has_bias ? bias->data() : nullptr, N, I, O, scratch->data());
                   },
                   0.0, nullptr, "no reference (bitwise the row above: Matmul test)"});
  cases.push_back({stored, "bwd", shape, "GFLOP/s", 2.0 * flops, per_step,
                   [=] {
                     k::matmul_backward_bf16_x(dx->data(), dw->data(), has_bias ? dbias->data() : nullptr,
                                               dout->data(), x_bf16->data(), w->data(), N, I, O, false,
                                               scratch->data());
                   },
                   0.0, nullptr, "no reference (bitwise the row above: Matmul test)"});
}

// Causal attention, one sequence per batch row, positions 0..S-1. FLOPs counted causally (half of S^2) as
// the model spec does: forward 2 x 2 B H (S^2/2) d, backward 2.5 x forward. The plain reference runs on one
// sequence when `with_reference`.
void add_attention_kernel_cases(std::vector<Case>& cases, const std::string& kernel,
                                k::AttentionForward* forward, k::AttentionBackward* backward, int64_t B,
                                int64_t S, int64_t H, int64_t K, int64_t d, int layers, bool with_reference) {
  const int64_t reference_batch = 1;
  auto positions = std::make_shared<std::vector<int32_t>>(B * S);
  for (int64_t n = 0; n < B * S; ++n) (*positions)[n] = static_cast<int32_t>(n % S);
  auto q = share(random_floats(B * S * H * d, 18)), kk = share(random_floats(B * S * K * d, 19));
  auto v = share(random_floats(B * S * K * d, 20)), out = share(std::vector<float>(B * S * H * d));
  auto lse = share(std::vector<float>(B * H * S)), dout = share(random_floats(B * S * H * d, 21));
  auto dq = share(std::vector<float>(B * S * H * d)), dk = share(std::vector<float>(B * S * K * d));
  auto dv = share(std::vector<float>(B * S * K * d));
  auto scratch =
      share(std::vector<float>(k::attention_backward_scratch_floats(B, S, H, K, d, omp_get_max_threads())));
  forward(out->data(), lse->data(), q->data(), kk->data(), v->data(), positions->data(), nullptr, B, S, H, K,
          d);
  const auto flops = [&](int64_t batch) { return 2.0 * static_cast<double>(batch * H * S * S * d) / kGiga; };
  const std::string shape = "B" + std::to_string(B) + " S" + std::to_string(S) + " H" + std::to_string(H) +
                            " K" + std::to_string(K) + " d" + std::to_string(d);
  const std::string note = with_reference ? "ref on " + std::to_string(reference_batch) + " sequence" : "";
  Case forward_case{kernel,
                    "fwd",
                    shape,
                    "GFLOP/s",
                    flops(B),
                    layers,
                    [=] {
                      forward(out->data(), lse->data(), q->data(), kk->data(), v->data(), positions->data(),
                              nullptr, B, S, H, K, d);
                    },
                    flops(reference_batch),
                    nullptr,
                    note};
  Case backward_case{kernel,
                     "bwd",
                     shape,
                     "GFLOP/s",
                     2.5 * flops(B),
                     layers,
                     [=] {
                       backward(dq->data(), dk->data(), dv->data(), dout->data(), out->data(), lse->data(),
                                q->data(), kk->data(), v->data(), positions->data(), nullptr, B, S, H, K, d,
                                scratch->data());
                     },
                     2.5 * flops(reference_batch),
                     nullptr,
                     note};
  if (with_reference) {
    forward_case.reference = [=] {
      k::attention_reference_forward(out->data(), lse->data(), q->data(), kk->data(), v->data(),
                                     positions->data(), nullptr, reference_batch, S, H, K, d);
    };
    backward_case.reference = [=] {
      k::attention_reference_backward(dq->data(), dk->data(), dv->data(), dout->data(), out->data(),
                                      lse->data(), q->data(), kk->data(), v->data(), positions->data(),
                                      nullptr, reference_batch, S, H, K, d);
    };
  }
  cases.push_back(std::move(forward_case));
  cases.push_back(std::move(backward_case));
}

// The float32 kernel; under MESHTRAIN_BENCH_DTYPE=bfloat16 the bf16 ones this CPU runs instead: the
// AVX512-BF16 kernels ("attention bf16", vdpbf16ps products) and the AMX ones ("attention amx", tile
// products; what dtype=bfloat16 runs on a CPU with AMX), both where the CPU has them.
void add_attention_cases(std::vector<Case>& cases, int64_t B, int64_t S, int64_t H, int64_t K, int64_t d,
                         int layers, bool with_reference) {
  const auto& cpu = meshtrain::cpu_features();
  const bool bf16 = bench_bf16() && cpu.avx512_bf16;
  if (!bf16) {
    add_attention_kernel_cases(cases, "attention", k::attention_forward, k::attention_backward, B, S, H, K, d,
                               layers, with_reference);
    return;
  }
  const k::AttentionKernels avx512_bf16 = k::attention_kernels_with(k::AttentionProducts::avx512_bf16);
  add_attention_kernel_cases(cases, "attention bf16", avx512_bf16.forward, avx512_bf16.backward, B, S, H, K,
                             d, layers, with_reference);
  if (cpu.amx_bf16) {
    const k::AttentionKernels amx = k::attention_kernels_with(k::AttentionProducts::amx);
    add_attention_kernel_cases(cases, "attention amx", amx.forward, amx.backward, B, S, H, K, d, layers,
                               with_reference);
  }
}

std::vector<Case> model_cases(const Model& m) {
  std::vector<Case> cases;
  const int64_t N = m.N(), D = m.D, H = m.H, K = m.K, d = m.d, F = m.F, V = m.V, L = m.layers;
  const int layers = static_cast<int>(L);

  // Linear layers, each distinct shape once, with its calls per step.
  if (m.gpt2) {
    add_matmul(cases, m, "qkv/out", D, H * d, 4 * layers);
    add_matmul(cases, m, "fc1", D, F, layers);
    add_matmul(cases, m, "fc2", F, D, layers);
  } else {
    add_matmul(cases, m, "q/out", D, H * d, 2 * layers);
    add_matmul(cases, m, "k/v", D, K * d, 2 * layers);
    add_matmul(cases, m, "wi_0/wi_1", D, F, 2 * layers);
    add_matmul(cases, m, "wo", F, D, layers);
  }

  {  // Token embedding: gather rows, scatter-add their gradients.
    auto ids = share(random_ids(N, m.V_valid, 5));
    auto table = share(random_floats(V * D, 6)), out = share(std::vector<float>(N * D));
    auto dtable = share(std::vector<float>(V * D)), dout = share(random_floats(N * D, 7));
    const double bytes = 4.0 * static_cast<double>(N * D) / kGiga;
    cases.push_back(
        {"embedding", "fwd", dims({N, V, D}), "GB/s", 2.0 * bytes, 1,
         [=] { k::embedding_forward(out->data(), ids->data(), table->data(), N, V, D, false, 0, -1); },
         2.0 * bytes,
         [=] { k::embedding_reference_forward(out->data(), ids->data(), table->data(), N, V, D, false); }});
    cases.push_back(
        {"embedding", "bwd", dims({N, V, D}), "GB/s", 3.0 * bytes, 1,
         [=] { k::embedding_backward(dtable->data(), ids->data(), dout->data(), N, V, D, 0, -1); },
         3.0 * bytes,
         [=] { k::embedding_reference_backward(dtable->data(), ids->data(), dout->data(), N, V, D); }});
  }

  // Norms over rows of `width`: forward reads x and writes out, backward reads dout and x and writes dx.
  const auto add_norm = [&](const std::string& what, int64_t rows, int64_t width, int per_step) {
    auto x = share(random_floats(rows * width, 8)), w = share(random_floats(width, 9, 0.5f, 1.5f));
    auto bias = share(random_floats(width, 10)), out = share(std::vector<float>(rows * width));
    auto mean = share(std::vector<float>(rows)), rstd = share(std::vector<float>(rows));
    auto dout = share(random_floats(rows * width, 11)), dx = share(std::vector<float>(rows * width));
    auto dw = share(std::vector<float>(width)), db = share(std::vector<float>(width));
    const double bytes = 4.0 * static_cast<double>(rows * width) / kGiga;
    const std::string shape = dims({rows, width});
    if (m.gpt2) {
      k::layernorm_forward(out->data(), mean->data(), rstd->data(), x->data(), w->data(), bias->data(), rows,
                           width, 1e-5f);
      cases.push_back({"layernorm " + what, "fwd", shape, "GB/s", 2.0 * bytes, per_step,
                       [=] {
                         k::layernorm_forward(out->data(), mean->data(), rstd->data(), x->data(), w->data(),
                                              bias->data(), rows, width, 1e-5f);
                       },
                       2.0 * bytes,
                       [=] {
                         k::layernorm_reference_forward(out->data(), mean->data(), rstd->data(), x->data(),
                                                        w->data(), bias->data(), rows, width, 1e-5f);
                       }});
      cases.push_back({"layernorm " + what, "bwd", shape, "GB/s", 3.0 * bytes, per_step,
                       [=] {
                         k::layernorm_backward(dx->data(), dw->data(), db->data(), dout->data(), x->data(),
                                               w->data(), mean->data(), rstd->data(), rows, width, false);
                       },
                       3.0 * bytes,
                       [=] {
                         k::layernorm_reference_backward(dx->data(), dw->data(), db->data(), dout->data(),
                                                         x->data(), w->data(), mean->data(), rstd->data(),
                                                         rows, width, false);
                       }});
    } else {
      k::rmsnorm_forward(out->data(), rstd->data(), x->data(), w->data(), rows, width, 1e-6f);
      cases.push_back(
          {"rmsnorm " + what, "fwd", shape, "GB/s", 2.0 * bytes, per_step,
           [=] { k::rmsnorm_forward(out->data(), rstd->data(), x->data(), w->data(), rows, width, 1e-6f); },
           2.0 * bytes,
           [=] {
             k::rmsnorm_reference_forward(out->data(), rstd->data(), x->data(), w->data(), rows, width,
                                          1e-6f);
           }});
      cases.push_back({"rmsnorm " + what, "bwd", shape, "GB/s", 3.0 * bytes, per_step,
                       [=] {
                         k::rmsnorm_backward(dx->data(), dw->data(), dout->data(), x->data(), w->data(),
                                             rstd->data(), rows, width, false);
                       },
                       3.0 * bytes,
                       [=] {
                         k::rmsnorm_reference_backward(dx->data(), dw->data(), dout->data(), x->data(),
                                                       w->data(), rstd->data(), rows, width, false);
                       }});
    }
  };
  add_norm("D", N, D, 2 * layers + 1);
  if (!m.gpt2) {
    add_norm("q heads", N * H, d, layers);
    add_norm("k heads", N * K, d, layers);
  }

  if (!m.gpt2) {  // RoPE, in place on q [N, H, d] (k is the same at K heads), positions 0..S-1 per sequence.
    auto positions = std::make_shared<std::vector<int32_t>>(N);
    for (int64_t n = 0; n < N; ++n) (*positions)[n] = static_cast<int32_t>(n % m.S);
    auto q = share(random_floats(N * H * d, 12));
    const double bytes = 8.0 * static_cast<double>(N * H * d) / kGiga;
    const float theta = 1e6f;
    cases.push_back(
        {"rope q", "fwd", dims({N, H, d}), "GB/s", bytes, layers,
         [=] { k::rope_forward(q->data(), q->data(), positions->data(), N, H, d, theta); }, bytes,
         [=] { k::rope_reference_forward(q->data(), q->data(), positions->data(), N, H, d, theta); }});
    cases.push_back(
        {"rope q", "bwd", dims({N, H, d}), "GB/s", bytes, layers,
         [=] { k::rope_backward(q->data(), q->data(), positions->data(), N, H, d, theta); }, bytes,
         [=] { k::rope_reference_backward(q->data(), q->data(), positions->data(), N, H, d, theta); }});
  }

  {  // MLP activation.
    const int64_t count = N * F;
    auto a = share(random_floats(count, 13, -4.0f, 4.0f)), b = share(random_floats(count, 14));
    auto out = share(std::vector<float>(count)), dout = share(random_floats(count, 15));
    auto da = share(std::vector<float>(count)), db = share(std::vector<float>(count));
    const double bytes = 4.0 * static_cast<double>(count) / kGiga;
    if (m.gpt2) {
      cases.push_back({"gelu", "fwd", dims({N, F}), "GB/s", 2.0 * bytes, layers,
                       [=] { k::gelu_forward(out->data(), a->data(), count); }, 2.0 * bytes,
                       [=] { k::gelu_reference_forward(out->data(), a->data(), count); }});
      cases.push_back({"gelu", "bwd", dims({N, F}), "GB/s", 3.0 * bytes, layers,
                       [=] { k::gelu_backward(da->data(), dout->data(), a->data(), count); }, 3.0 * bytes,
                       [=] { k::gelu_reference_backward(da->data(), dout->data(), a->data(), count); }});
    } else {
      cases.push_back({"swiglu", "fwd", dims({N, F}), "GB/s", 3.0 * bytes, layers,
                       [=] { k::swiglu_forward(out->data(), a->data(), b->data(), count); }, 3.0 * bytes,
                       [=] { k::swiglu_reference_forward(out->data(), a->data(), b->data(), count); }});
      cases.push_back(
          {"swiglu", "bwd", dims({N, F}), "GB/s", 5.0 * bytes, layers,
           [=] { k::swiglu_backward(da->data(), db->data(), dout->data(), a->data(), b->data(), count); },
           5.0 * bytes,
           [=] {
             k::swiglu_reference_backward(da->data(), db->data(), dout->data(), a->data(), b->data(), count);
           }});
    }
  }

  {  // Residual add (2 per layer forward, the backward adds into the residual gradient through accumulate
     // flags).
    const int64_t count = N * D;
    auto out = share(random_floats(count, 16)), x = share(random_floats(count, 17));
    const double bytes = 12.0 * static_cast<double>(count) / kGiga;
    cases.push_back({"residual_add", "fwd", dims({N, D}), "GB/s", bytes, 2 * layers,
                     [=] { k::residual_add(out->data(), x->data(), count); }, bytes,
                     [=] { k::residual_reference_add(out->data(), x->data(), count); }});
  }

  add_attention_cases(cases, m.B, m.S, H, K, d, layers, true);

  {  // Fused unembedding + cross-entropy, tied table [V, D], chunked as the model does. FLOPs: the GEMMs (2 N
     // D V for the logits, 4 N D V for dh and dE). The reference materialises [N, V] logits with scalar dot
     // products: run on 16 tokens.
    const int64_t C = m.chunk(), reference_tokens = 16;
    auto h = share(random_floats(N * D, 22)), table = share(random_floats(V * D, 23, -0.05f, 0.05f));
    auto targets = share(random_ids(N, m.V_valid, 24));
    auto dh = share(std::vector<float>(N * D)), dtable = share(std::vector<float>(V * D));
    auto scratch = share(std::vector<float>(k::cross_entropy_scratch_floats(C, V)));
    const double gemm = 2.0 * static_cast<double>(N * D * m.V_valid) / kGiga;
    const double reference_gemm = 2.0 * static_cast<double>(reference_tokens * D * m.V_valid) / kGiga;
    const std::string shape = dims({N, D, m.V_valid}) + " C" + std::to_string(C);
    const std::string note = "ref on " + std::to_string(reference_tokens) + " tokens";
    const k::UnembedLayout layout = k::UnembedLayout::table_VD;
    const int64_t Vv = m.V_valid;
    const bool bf16 = bench_bf16();
    auto bf16_scratch =
        share(std::vector<uint16_t>(bf16 ? k::cross_entropy_bf16_scratch_elements(N, C, D, V) : 0));
    uint16_t* bf16_inputs = bf16 ? bf16_scratch->data() : nullptr;
    const std::string kernel = bf16 ? "cross_entropy bf16" : "cross_entropy";
    cases.push_back({kernel, "loss only", shape, "GFLOP/s", gemm, 0,
                     [=] {
                       (void)bf16_scratch;
                       k::unembed_cross_entropy(nullptr, nullptr, h->data(), table->data(), layout,
                                                targets->data(), nullptr, N, D, V, Vv, 0.0, C,
                                                scratch->data(), nullptr, bf16_inputs);
                     },
                     reference_gemm,
                     [=] {
                       k::unembed_cross_entropy_reference<float>(nullptr, nullptr, h->data(), table->data(),
                                                                 layout, targets->data(), nullptr,
                                                                 reference_tokens, D, V, Vv, 0.0);
                     },
                     note});
    cases.push_back({kernel, "fwd+bwd", shape, "GFLOP/s", 3.0 * gemm, 1,
                     [=] {
                       (void)bf16_scratch;
                       k::unembed_cross_entropy(dh->data(), dtable->data(), h->data(), table->data(), layout,
                                                targets->data(), nullptr, N, D, V, Vv, 0.0, C,
                                                scratch->data(), nullptr, bf16_inputs);
                     },
                     3.0 * reference_gemm,
                     [=] {
                       k::unembed_cross_entropy_reference<float>(dh->data(), dtable->data(), h->data(),
                                                                 table->data(), layout, targets->data(),
                                                                 nullptr, reference_tokens, D, V, Vv, 0.0);
                     },
                     note});
    // The same with 4x the chunk's rows (16M floats of logits, 64 MiB), when the model's chunk is smaller
    // than N: fewer passes over the [V, D] table and its gradient (not what the model runs today; for
    // comparison).
    const int64_t big = std::min(N, 4 * C);
    if (big > C) {
      auto big_scratch = share(std::vector<float>(k::cross_entropy_scratch_floats(big, V)));
      cases.push_back({"cross_entropy 4x chunk", "fwd+bwd",
                       dims({N, D, m.V_valid}) + " C" + std::to_string(big), "GFLOP/s", 3.0 * gemm, 0,
                       [=] {
                         k::unembed_cross_entropy(dh->data(), dtable->data(), h->data(), table->data(),
                                                  layout, targets->data(), nullptr, N, D, V, Vv, 0.0, big,
                                                  big_scratch->data(), nullptr, nullptr);
                       },
                       0.0, nullptr, "not in ms/step"});
    }
  }

  {  // Optimizer over every parameter as one tensor (the engine calls it per tensor): AdamW reads param,
     // grad, m, v and writes param, m, v; the gradient norm reads every gradient once.
    // Matrices only (norm scales and biases are <0.1%): q, k, v, out; 2 (GPT-2) or 3 (SwiGLU) MLP matrices;
    // the tied table; GPT-2's 1024 learned positions.
    int64_t count = V * D + L * (D * d * (2 * H + 2 * K) + (m.gpt2 ? 2 : 3) * D * F);
    if (m.gpt2) count += 1024 * D;
    auto param = share(random_floats(count, 25)), grad = share(random_floats(count, 26));
    auto mm = share(std::vector<float>(count)), vv = share(std::vector<float>(count));
    const k::AdamWStep step{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1e-3f};
    const double bytes = 4.0 * static_cast<double>(count) / kGiga;
    const std::string shape = std::to_string(count) + " params";
    cases.push_back(
        {"adamw", "update", shape, "GB/s", 7.0 * bytes, 1,
         [=] { k::adamw_update(param->data(), grad->data(), mm->data(), vv->data(), count, step, true); },
         7.0 * bytes,
         [=] {
           k::adamw_reference_update(param->data(), grad->data(), mm->data(), vv->data(), count, step, true);
         }});
    cases.push_back({"grad norm", "sum_of_squares", shape, "GB/s", bytes, 1,
                     [=] {
                       volatile double sink = k::sum_of_squares(grad->data(), count);
                       (void)sink;
                     },
                     0.0, nullptr});
  }
  return cases;
}

bool selected(const std::string& model, const Case& c, const std::vector<std::string>& filters) {
  const std::string text = model + " " + c.kernel + " " + c.pass;
  for (const std::string& filter : filters) {
    if (text.find(filter) == std::string::npos) return false;
  }
  return true;
}

std::string format_rate(double value) {
  char buffer[32];
  if (std::isnan(value)) return "-";
  std::snprintf(buffer, sizeof buffer, value >= 100.0 ? "%.0f" : value >= 10.0 ? "%.1f" : "%.2f", value);
  return buffer;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> filters(argv + 1, argv + argc);
  const double window = env_double("MESHTRAIN_BENCH_SECONDS", 0.3);
  const bool references = env_double("MESHTRAIN_BENCH_NO_REFERENCE", 0.0) == 0.0;
  std::printf("# bench_kernels: %d OpenMP threads (fast kernels); cpu %s; matmuls: %s\n",
              omp_get_max_threads(), meshtrain::cpu_features().describe().c_str(),
              k::gemm_backend().describe().c_str());
  std::printf(
      "# window %.2f s per measurement; median [min-max] over the calls; ms/step = median time x calls "
      "per training step;\n# ref = plain reference loops, 1 thread (same unit, on the rows noted); x = fast "
      "/ "
      "ref; others = %% of all CPUs taken by other processes while timing (* above 10%%)\n",
      window);

  const std::vector<Model> models = {
      {"qwen3-tiny", 16, 128, 384, 6, 2, 64, 1024, 8192, 8192, 6, false},
      {"gpt2-124m", 8, 256, 768, 12, 12, 64, 3072, 50304, 50257, 12, true},
  };
  std::printf("%-10s %-22s %-9s %-26s %-8s %8s %17s %9s %8s %8s %7s  %s\n", "model", "kernel", "pass",
              "shape", "unit", "median", "[min-max]", "ms/step", "ref", "x", "others", "note");
  // Rows of `cases` the filters select, and their sum of ms per step (labelled `name`).
  const auto run_rows = [&](const std::string& name, const std::vector<Case>& cases) {
    double step_ms = 0.0;
    for (const Case& c : cases) {
      if (!selected(name, c, filters)) continue;
      const Stats fast = time_call(c.work, c.fast, window);
      Stats reference;
      if (references && c.reference) {
        // Long references: a short window and at least 2 calls.
        reference = time_call(c.reference_work, c.reference, std::min(window, 0.2), 2);
      }
      const double ms = 1e3 * fast.seconds_per_call * c.per_step;
      step_ms += ms;
      const std::string spread = "[" + format_rate(fast.min) + "-" + format_rate(fast.max) + "]";
      char others[16];
      std::snprintf(others, sizeof others, "%.0f%s", fast.others, fast.others > 10.0 ? "*" : "");
      std::printf("%-10s %-22s %-9s %-26s %-8s %8s %17s %9.2f %8s %8s %7s  %s\n", name.c_str(),
                  c.kernel.c_str(), c.pass.c_str(), c.shape.c_str(), c.unit.c_str(),
                  format_rate(fast.median).c_str(), spread.c_str(), ms, format_rate(reference.median).c_str(),
                  std::isnan(reference.median) ? "-" : format_rate(fast.median / reference.median).c_str(),
                  others, c.note.c_str());
      std::fflush(stdout);
    }
    std::printf("%-10s sum of ms/step over the rows above: %.1f ms\n", name.c_str(), step_ms);
  };
  for (const Model& model : models) run_rows(model.name, model_cases(model));
  // Long context: qwen3-0.6b's attention (H=16, K=8, d=128, 28 layers) on one sequence of 2048 and of 4096
  // tokens, without the reference (minutes at these lengths).
  for (const int64_t S : {2048, 4096}) {
    std::vector<Case> cases;
    add_attention_cases(cases, 1, S, 16, 8, 128, 28, false);
    run_rows("qwen3-0.6b", cases);
  }
  return 0;
}
