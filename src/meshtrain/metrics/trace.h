// Chrome / Perfetto trace of chosen steps (profiler: trace, profiler_steps): one complete ("ph": "X")
// event per timed region, written as {"traceEvents": [...]} for ui.perfetto.dev or chrome://tracing.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

class TraceRecorder {
 public:
  // Records only during the steps in `profiler_steps`; `process_id` (the rank) becomes each event's pid.
  explicit TraceRecorder(std::vector<int64_t> profiler_steps, int process_id = 0);

  // Marks the start of `step`: recording is on for the steps listed, off otherwise.
  void begin_step(int64_t step);
  bool active() const { return active_.load(std::memory_order_relaxed); }
  int64_t step() const;

  // Adds one complete event of the current step (ignored when not active). Times are microseconds on
  // this recorder's clock (now_us()); the step number is added to `args` as "step".
  void record(const std::string& name, const std::string& category, double start_us, double duration_us,
              int thread = 0, nlohmann::json args = {});
  // Microseconds since this recorder was made, on steady_clock.
  double now_us() const;

  size_t event_count() const;
  // Microseconds recorded per event name and step, over events of `category` ("op": the kernels' ops).
  std::map<std::pair<std::string, int64_t>, double> durations_us(const std::string& category) const;
  // Writes everything recorded so far as trace JSON, atomically (MeshError naming `path` on failure).
  void write(const std::string& path) const;

 private:
  struct Event {
    std::string name, category;
    double start_us, duration_us;
    int thread;
    int64_t step;
    nlohmann::json args;
  };
  std::vector<int64_t> profiler_steps_;
  int process_id_;
  std::chrono::steady_clock::time_point origin_;
  // Worker threads read active_ (TraceScope) while only the step loop writes it, between steps.
  std::atomic<bool> active_{false};
  mutable std::mutex mutex_;  // guards step_ and events_: record() may run on worker threads
  int64_t step_ = -1;
  std::vector<Event> events_;
};

// Times the enclosing scope into `recorder` when it is active; otherwise costs one branch. `recorder`
// may be null (profiling off). `name` and `category` must outlive the scope (literals, op names).
class TraceScope {
 public:
  TraceScope(TraceRecorder* recorder, std::string_view name, std::string_view category, int thread = 0)
      : recorder_(recorder != nullptr && recorder->active() ? recorder : nullptr) {
    if (recorder_ != nullptr) {
      name_ = name;
      category_ = category;
      thread_ = thread;
      start_us_ = recorder_->now_us();
    }
  }
  ~TraceScope() {
    if (recorder_ != nullptr) finish();
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  bool active() const { return recorder_ != nullptr; }
  // Attaches an argument shown in the trace viewer; does nothing when inactive (check active() before
  // computing an expensive value).
  void arg(const std::string& key, nlohmann::json value) {
    if (recorder_ != nullptr) args_[key] = std::move(value);
  }

 private:
  void finish() noexcept;

  TraceRecorder* recorder_;
  std::string_view name_, category_;
  int thread_ = 0;
  double start_us_ = 0.0;
  nlohmann::json args_;
};

}  // namespace meshtrain
