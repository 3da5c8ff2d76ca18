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

#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
// The machine report times and names the host GEMM itself, so it is cpu-specific by nature and reads
// kernels/cpu/gemm.h directly rather than the backend table (kernels/backend.h) the model's ops go through.
#include "meshtrain/kernels/cpu/gemm.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double measure_gemm_peak() {
  constexpr int64_t n = 1024;
  constexpr int kCalls = 40;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
    b[i] = static_cast<float>(i % 5) * 0.5f - 1.0f;
  }
  const auto call = [&] {
    kernels::gemm(false, false, n, n, n, a.data(), n, b.data(), n, false, c.data(), n);
  };
  call();  // warm-up: page faults, oneDNN's first-call set-up
  double best_seconds = 1e30;
  for (int i = 0; i < kCalls; ++i) {
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
  char peak[64];
  std::snprintf(peak, sizeof peak, "%.0f GFLOP/s", gemm_peak_flops / 1e9);
  return "machine: " + cpu + "; " + std::to_string(threads) + " thread(s); matmuls: " + gemm +
         "; float32 GEMM peak " + peak + " (" + peak_source + ")";
}

nlohmann::json MachineReport::to_json() const {
  return {{"cpu", cpu},
          {"gemm_backend", gemm},
          {"gemm_warning", gemm_warning},
          {"threads", threads},
          {"gemm_peak_flops", gemm_peak_flops},
          {"gemm_peak_source", peak_source}};
}

MachineReport measure_machine() {
  MachineReport report;
  const kernels::GemmBackend& backend = kernels::gemm_backend();
  report.cpu = cpu_features().describe();
  report.gemm = backend.describe();
  report.gemm_warning = backend.warning;
  report.threads = omp_get_max_threads();
  report.gemm_peak_flops = measure_gemm_peak();
  report.peak_source = "measured now";

  const fs::path folder = cache_folder();
  if (folder.empty()) return report;
  const std::string key = report.cpu + "|" + report.gemm + "|" + std::to_string(report.threads);
  char name[64];
  std::snprintf(name, sizeof name, "gemm_peak_%08x.json", crc32c(key.data(), key.size()));
  const fs::path file = folder / name;
  double cached = 0.0;
  if (std::ifstream in(file); in) {
    const nlohmann::json saved = nlohmann::json::parse(in, nullptr, false);
    if (saved.is_object() && saved.value("key", "") == key) cached = saved.value("gemm_peak_flops", 0.0);
  }
  if (cached >= report.gemm_peak_flops) {
    report.gemm_peak_flops = cached;
    report.peak_source = "best measured on this machine, " + file.string();
    return report;
  }
  try {  // a better figure replaces the cached one; a cache that cannot be written is not an error
    fs::create_directories(folder);
    write_file_atomically(
        file.string(),
        nlohmann::json{{"key", key}, {"gemm_peak_flops", report.gemm_peak_flops}}.dump() + "\n");
  } catch (const std::exception&) {
  }
  return report;
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
  return 2.0 * static_cast<double>(kFloats) * sizeof(float) / best_seconds;
}

}  // namespace meshtrain
