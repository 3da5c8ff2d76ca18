// Planning time of `meshtrain compile` (shared/specs/aot-plan.md): plan_training for a 70B-class dense model
// (bench/configs/dense-70b.yaml) on 1024 H100s, and for qwen3-0.6b on a v6e-4 beside the reference system's
// ahead-of-time compile of the same model for the same 4 chips (38 s for fwd_bwd, fwd_bwd_accum and update,
// shared/seeds/aot-compile-training-engine.txt).
//
//   build/bench/bench_plan
//
// Environment: MESHTRAIN_BENCH_RUNS (default 9, timed runs per row after one warm-up). Each row reports the
// median and [min-max] wall time of plan_training alone, and of what `compile plan_out=...` does short of
// writing files (load the config, plan, serialize every kernel's plan). `others` = % of all CPUs other
// processes took while timing (* above 10%: the figures are noisy). Never fails: it prints a table and exits
// 0.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/plan/plan.h"

namespace {

using Clock = std::chrono::steady_clock;
using meshtrain::KernelName;

constexpr double kReferenceSeconds = 38.0;  // reference AOT compile, qwen3-0.6b, v6e-4, three kernels

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

struct Timing {
  double median = 0.0, min = 0.0, max = 0.0, others = -1.0;
  int runs = 0;
};

// One warm-up call (file caches, allocator), then `runs` timed calls.
Timing time_runs(const std::function<void()>& call, int runs) {
  call();
  std::vector<double> seconds;
  const double busy0 = system_busy_seconds(), own0 = own_cpu_seconds();
  const auto start = Clock::now();
  for (int i = 0; i < runs; ++i) {
    const auto t0 = Clock::now();
    call();
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const double busy1 = system_busy_seconds(), own1 = own_cpu_seconds();
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  Timing timing;
  if (busy0 >= 0 && busy1 >= 0 && cpus > 0 && wall > 0) {
    timing.others =
        std::max(0.0, 100.0 * ((busy1 - busy0) - (own1 - own0)) / (wall * static_cast<double>(cpus)));
  }
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  timing.median = n % 2 == 1 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  timing.min = seconds.front();
  timing.max = seconds.back();
  timing.runs = static_cast<int>(n);
  return timing;
}

struct Case {
  std::string name;
  std::string config;  // preset or YAML path
  std::vector<std::string> overrides;
  std::vector<KernelName> kernels;
  bool compare_with_reference;
};

std::string kernels_text(const std::vector<KernelName>& kernels) {
  std::string text;
  for (KernelName kernel : kernels)
    text += (text.empty() ? "" : ",") + std::string(meshtrain::kernel_name(kernel));
  return text;
}

void run_case(const Case& c, int runs) {
  meshtrain::PlanRequest request;
  request.config = meshtrain::load_config(c.config, c.overrides);
  request.kernels = c.kernels;
  // Context for the figures: the plan's size and whether it fits.
  const meshtrain::TrainingPlan sample = meshtrain::plan_training(request);
  size_t ops = 0;
  for (const meshtrain::KernelPlan& kernel : sample.kernels) ops += kernel.ops.size();
  std::printf("# %s: %s, mesh %s on %s, kernels %s: %zu ops, %zu buffers, arena %.2f of %.2f GiB (%s)\n",
              c.name.c_str(), c.config.c_str(), sample.mesh.to_string().c_str(), sample.topology.name.c_str(),
              kernels_text(c.kernels).c_str(), ops, sample.buffers.size(),
              static_cast<double>(sample.arena_bytes) / 1073741824.0,
              sample.device_memory_bytes / 1073741824.0, sample.fits() ? "fits" : "does not fit");

  const Timing plan_only = time_runs([&] { (void)meshtrain::plan_training(request); }, runs);
  size_t serialized_bytes = 0;
  const Timing end_to_end = time_runs(
      [&] {
        meshtrain::PlanRequest fresh;
        fresh.config = meshtrain::load_config(c.config, c.overrides);
        fresh.kernels = c.kernels;
        const meshtrain::TrainingPlan plan = meshtrain::plan_training(fresh);
        serialized_bytes = 0;
        for (KernelName kernel : c.kernels)
          serialized_bytes += meshtrain::serialize_kernel_plan(plan, kernel).size();
      },
      runs);
  for (const auto& [what, timing] :
       {std::pair{"plan_training", plan_only}, std::pair{"config+plan+serialize", end_to_end}}) {
    char others[16];
    std::snprintf(others, sizeof others, "%.0f%s", timing.others, timing.others > 10.0 ? "*" : "");
    char ratio[32] = "-";
    if (c.compare_with_reference)
      std::snprintf(ratio, sizeof ratio, "%.0fx", kReferenceSeconds / timing.median);
    std::printf("%-24s %-22s %10.1f  [%8.1f-%8.1f] %5d %10s %7s\n", c.name.c_str(), what, timing.median * 1e3,
                timing.min * 1e3, timing.max * 1e3, timing.runs, ratio, others);
  }
  std::printf("# %s: serialized plans %.1f MB\n", c.name.c_str(),
              static_cast<double>(serialized_bytes) / 1e6);
}

}  // namespace

int main() {
  const char* runs_text = std::getenv("MESHTRAIN_BENCH_RUNS");
  const int runs = std::max(1, runs_text != nullptr ? std::atoi(runs_text) : 9);
  const std::vector<KernelName> all = {KernelName::fwd_bwd, KernelName::fwd_bwd_accum, KernelName::update,
                                       KernelName::eval};
  const std::vector<KernelName> reference_three = {KernelName::fwd_bwd, KernelName::fwd_bwd_accum,
                                                   KernelName::update};
  const std::string dense_70b = std::string(MESHTRAIN_SOURCE_DIR) + "/bench/configs/dense-70b.yaml";
  const std::vector<Case> cases = {
      {"dense-70b h100x1024",
       dense_70b,
       {"topology=h100x1024", "mesh.data=16", "mesh.fsdp=8", "mesh.tensor=8"},
       all,
       false},
      // What `compile --search` ranks first for this model on h100x1024 at batch 1 per device: one that fits.
      {"dense-70b h100x1024 fit",
       dense_70b,
       {"topology=h100x1024", "mesh.data=16", "mesh.fsdp=32", "mesh.tensor=2", "remat_policy=full"},
       all,
       false},
      {"qwen3-0.6b v6e-4", "qwen3-0.6b", {"topology=v6e-4", "mesh.fsdp=4"}, reference_three, true},
      {"qwen3-0.6b v6e-4 (4)", "qwen3-0.6b", {"topology=v6e-4", "mesh.fsdp=4"}, all, true},
  };
  std::printf(
      "# bench_plan: wall time of one plan, ms: median [min-max] over the runs (one warm-up first); "
      "vs 38 s = the reference system's AOT compile of\n# qwen3-0.6b for v6e-4 (three kernels) divided "
      "by the median; others = %% of all CPUs other processes took (* above 10%%)\n");
  std::printf("%-24s %-22s %10s  %-19s %5s %10s %7s\n", "case", "what", "median ms", "[min-max] ms", "runs",
              "vs 38 s", "others");
  for (const Case& c : cases) {
    try {
      run_case(c, runs);
    } catch (const std::exception& error) {  // a benchmark reports, it does not fail the build or the run
      std::printf("%-24s error: %s\n", c.name.c_str(), error.what());
    }
  }
  return 0;
}
