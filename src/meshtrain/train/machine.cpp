#include "meshtrain/train/machine.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/arena.h"
#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/metrics/trace.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/runtime/engine.h"
// The machine report times and names the host GEMM itself, so it is cpu-specific by nature and reads
// kernels/cpu/gemm.h (and the host memory its operands live in) directly rather than the backend table
// (kernels/backend.h) the model's ops go through.
#include "meshtrain/kernels/cpu/gemm.h"
#include "meshtrain/kernels/cpu/memory.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A square GEMM (n = 1024, best of `calls` calls) in float32, or with bfloat16 inputs (f32 accumulation). The
// plain reference GEMM (no oneDNN) is about a hundred times slower: it is timed on n = 256, which keeps a
// run without oneDNN from spending a minute here (over 100 s in the sanitizer build) for a figure that only
// scales its MFU. The operands are in an arena, aligned as the step's are: AMX tile loads from rows that
// straddle cache lines ran this product at 1,480-1,740 GFLOP/s against 2,300-2,490 aligned (bench/README.md).
double measure_gemm_peak(bool bf16, int calls) {
  const int64_t n = kernels::gemm_backend().name == "reference" ? 256 : 1024;
  // A, B, C in float32 and A, B in bf16, each at an aligned offset of one arena in host memory.
  const size_t floats = align_up(static_cast<size_t>(n * n) * sizeof(float));
  const size_t halves = align_up(static_cast<size_t>(n * n) * sizeof(uint16_t));
  const Arena operands(3 * floats + (bf16 ? 2 * halves : 0),
                       ArenaMemory{kernels::host_memory_allocate, kernels::host_memory_free, "host memory"});
  float* a = reinterpret_cast<float*>(operands.at(0));
  float* b = reinterpret_cast<float*>(operands.at(floats));
  float* c = reinterpret_cast<float*>(operands.at(2 * floats));
  uint16_t* a_bf16 = bf16 ? reinterpret_cast<uint16_t*>(operands.at(3 * floats)) : nullptr;
  uint16_t* b_bf16 = bf16 ? reinterpret_cast<uint16_t*>(operands.at(3 * floats + halves)) : nullptr;
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
    b[i] = static_cast<float>(i % 5) * 0.5f - 1.0f;
  }
  if (bf16) {
    round_to_bfloat16(a, n, n, n, a_bf16);
    round_to_bfloat16(b, n, n, n, b_bf16);
  }
  const auto call = [&] {
    if (bf16) {
      kernels::gemm_bf16(false, false, n, n, n, a_bf16, n, b_bf16, n, false, c, n);
    } else {
      kernels::gemm(false, false, n, n, n, a, n, b, n, false, c, n);
    }
  };
  call();  // warm-up: page faults, oneDNN's first-call set-up
  double best_seconds = 1e30;
  for (int i = 0; i < calls; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    best_seconds = std::min(best_seconds, seconds_since(start));
  }
  return 2.0 * static_cast<double>(n * n * n) / best_seconds;
}

fs::path cache_folder() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return fs::path(xdg) / "meshtrain";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return fs::path(home) / ".cache" / "meshtrain";
  return {};
}

}  // namespace

std::string MachineReport::describe() const {
  char peak[160];
  std::snprintf(peak, sizeof peak, "float32 GEMM peak %.0f GFLOP/s", gemm_peak_flops / 1e9);
  std::string text =
      "machine: " + cpu + "; " + std::to_string(threads) + " thread(s); matmuls: " + gemm + "; " + peak;
  if (gemm_bf16_peak_flops > 0.0) {
    std::snprintf(peak, sizeof peak, ", bf16 %.0f GFLOP/s (%.2fx)", gemm_bf16_peak_flops / 1e9,
                  gemm_bf16_peak_flops / gemm_peak_flops);
    text += peak;
  }
  return text + " (" + peak_source + ")";
}

nlohmann::json MachineReport::to_json() const {
  return {{"cpu", cpu},
          {"gemm_backend", gemm},
          {"gemm_warning", gemm_warning},
          {"threads", threads},
          {"gemm_peak_flops", gemm_peak_flops},
          {"gemm_bf16_peak_flops", gemm_bf16_peak_flops},
          {"gemm_peak_source", peak_source},
          {"gemm_peak_calls", peak_calls}};
}

namespace {

// The file a figure measured under `key` is cached in: <stem>_<crc32c of key>.json in cache_folder() (empty
// when there is no such folder).
fs::path cache_file(const std::string& stem, const std::string& key) {
  const fs::path folder = cache_folder();
  if (folder.empty()) return {};
  char name[96];
  std::snprintf(name, sizeof name, "%s_%08x.json", stem.c_str(), crc32c(key.data(), key.size()));
  return folder / name;
}

// Field `field` of the figure cached under `key`, or 0 when none is.
double cached_figure(const std::string& stem, const std::string& field, const std::string& key) {
  const fs::path file = cache_file(stem, key);
  if (file.empty()) return 0.0;
  std::ifstream in(file);
  if (!in) return 0.0;
  const nlohmann::json saved = nlohmann::json::parse(in, nullptr, false);
  return saved.is_object() && saved.value("key", "") == key ? saved.value(field, 0.0) : 0.0;
}

// The best of `measured` and the figure cached under `key` (and the cache updated when `measured` is
// better); `source` says which it is.
double best_measured(const std::string& stem, const std::string& field, const std::string& key,
                     double measured, std::string& source) {
  source = "measured now";
  const fs::path file = cache_file(stem, key);
  if (file.empty()) return measured;
  if (const double cached = cached_figure(stem, field, key); cached >= measured) {
    source = "best measured on this machine, " + file.string();
    return cached;
  }
  try {  // a better figure replaces the cached one; a cache that cannot be written is not an error
    fs::create_directories(file.parent_path());
    write_file_atomically(file.string(), nlohmann::json{{"key", key}, {field, measured}}.dump() + "\n");
  } catch (const std::exception&) {
  }
  return measured;
}

// What a cached figure is of: this CPU, GEMM backend and thread count.
std::string machine_key() {
  return cpu_features().describe() + "|" + kernels::gemm_backend().describe() + "|" +
         std::to_string(omp_get_max_threads());
}

}  // namespace

MachineReport measure_machine(bool with_bf16, PeakTiming timing) {
  MachineReport report;
  const kernels::GemmBackend& backend = kernels::gemm_backend();
  report.cpu = cpu_features().describe();
  report.gemm = backend.describe();
  report.gemm_warning = backend.warning;
  report.threads = omp_get_max_threads();
  // The best of 40 calls where nothing is cached (or `full`), else a recheck of 5: enough to raise a figure
  // first measured under load, at an eighth of the time (40 calls are 1 s on a 2-core Zen 1, most of the
  // start of a small run, and every test run starts one).
  const auto calls = [&](const std::string& key) {
    return timing == PeakTiming::full || cached_figure("gemm_peak", "gemm_peak_flops", key) <= 0.0 ? 40 : 5;
  };
  const std::string key = machine_key();
  report.peak_calls = calls(key);
  report.gemm_peak_flops = best_measured("gemm_peak", "gemm_peak_flops", key,
                                         measure_gemm_peak(false, report.peak_calls), report.peak_source);
  if (with_bf16) {
    std::string bf16_source;
    report.gemm_bf16_peak_flops = best_measured("gemm_peak", "gemm_peak_flops", key + "|bf16",
                                                measure_gemm_peak(true, calls(key + "|bf16")), bf16_source);
  }
  return report;
}

OpClassRates measure_op_class_rates(DType dtype) {
  constexpr int64_t kTimedSteps = 2;
  const Config config = load_config(
      "gpt2-124m", {"base_num_decoder_layers=1", "per_device_batch_size=4", "max_target_length=256",
                    "max_position_embeddings=256", "vocab_size=8192", "dataset_type=synthetic",
                    "tokenizer_path=", "dtype=" + dtype_config_name(dtype)});
  Engine engine(config);
  const ModelDims& dims = engine.spec().dims;
  // One document per row, every target counted.
  Batch batch;
  for (int64_t b = 0; b < dims.B; ++b) {
    for (int64_t s = 0; s < dims.S; ++s) {
      batch.tokens.push_back(static_cast<int32_t>((b * 7919 + s * 104729) % dims.V_valid));
      batch.targets.push_back(static_cast<int32_t>((b * 6007 + s * 7727 + 1) % dims.V_valid));
      batch.positions.push_back(static_cast<int32_t>(s));
      batch.segment_ids.push_back(0);
      batch.loss_mask.push_back(1);
    }
  }
  TraceRecorder trace({1, 2});
  engine.set_trace(&trace);
  for (int64_t step = 0; step <= kTimedSteps; ++step) {  // step 0 warms up (first-touch, oneDNN set-up)
    trace.begin_step(step);
    engine.fwd_bwd(batch);
  }
  engine.set_trace(nullptr);
  const std::map<std::pair<std::string, int64_t>, double> durations = trace.durations_us("op");
  // An op's time: its best step (other processes only ever add time).
  const auto seconds_of = [&](const PlanOp& op) {
    double best = 1e30;
    for (int64_t step = 1; step <= kTimedSteps; ++step) {
      const auto found = durations.find({op.op->name, step});
      if (found != durations.end()) best = std::min(best, found->second * 1e-6);
    }
    MT_CHECK(best < 1e30, "no trace event of op '" + op.op->name + "'");
    return best;
  };
  double matmul_flops = 0.0, matmul_seconds = 0.0, attention_flops = 0.0, attention_seconds = 0.0;
  double elementwise_bytes = 0.0, elementwise_seconds = 0.0;
  const TrainingPlan& plan = engine.plan();
  const std::vector<PlanOp>& ops = plan.kernel(KernelName::fwd_bwd).ops;
  for (const PlanOp& op : ops) {
    if (op.op->kind == OpKind::matmul) {
      matmul_flops += op.flops;
      matmul_seconds += seconds_of(op);
    }
    if (op.op->kind == OpKind::attention) {
      attention_flops += op.flops;
      attention_seconds += seconds_of(op);
    }
    if (op.op->kind == OpKind::elementwise) {
      elementwise_bytes += op.bytes_accessed;
      elementwise_seconds += seconds_of(op);
    }
  }
  MT_CHECK(matmul_seconds > 0.0 && attention_seconds > 0.0 && elementwise_seconds > 0.0,
           "no matmul, attention or elementwise op timed");
  const double matmul_rate = matmul_flops / matmul_seconds;
  double logit_passes = 0.0, softmax_seconds = 0.0;
  for (const PlanOp& op : ops) {
    if (const double passes = loss_softmax_logit_passes(plan.spec, op); passes > 0.0) {
      logit_passes += passes;
      // Where the loss's GEMMs ran faster than the layers' matmuls, the softmax keeps at least a tenth of the
      // op's time rather than none.
      const double seconds = seconds_of(op);
      softmax_seconds += std::max(seconds - op.flops / matmul_rate, 0.1 * seconds);
    }
  }
  MT_CHECK(softmax_seconds > 0.0, "no loss op timed");
  // As the peaks: the best figure measured on this machine, for this step (its shapes in the key).
  const std::string key = machine_key() + "|" + dtype_config_name(dtype) + "|gpt2-124m layer B4 S256 V8192|";
  std::string source;
  return {
      best_measured("op_rate", "rate", key + "matmul", matmul_rate, source),
      best_measured("op_rate", "rate", key + "attention", attention_flops / attention_seconds, source),
      best_measured("op_rate", "rate", key + "loss_softmax", logit_passes / softmax_seconds, source),
      best_measured("op_rate", "rate", key + "elementwise", elementwise_bytes / elementwise_seconds, source)};
}

double measure_memory_bandwidth() {
  // 128 MiB per array: far beyond the last-level cache of the CPUs here (32 MiB on Zen 3 / 4), so every pass
  // streams from DRAM. Each thread first touches the part it later streams (pages land on its node).
  constexpr int64_t kFloats = int64_t{32} << 20;
  constexpr int kPasses = 5;
  std::unique_ptr<float[]> source(new float[kFloats]), destination(new float[kFloats]);
  float* src = source.get();
  float* dst = destination.get();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < kFloats; ++i) {
    src[i] = static_cast<float>(i & 1023);
    dst[i] = 0.0f;
  }
  double best_seconds = 1e30;
  for (int pass = 0; pass < kPasses; ++pass) {
    const float scale = 1.0f + 0.001f * static_cast<float>(pass);
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < kFloats; ++i) dst[i] = src[i] * scale;
    best_seconds = std::min(best_seconds, seconds_since(start));
  }
  // As the peaks and rates the plan sets beside it: the best measured on this machine.
  std::string cached_or_now;
  return best_measured("memory_bandwidth", "bytes_per_second", machine_key(),
                       2.0 * static_cast<double>(kFloats) * sizeof(float) / best_seconds, cached_or_now);
}

}  // namespace meshtrain
