// Trace recording and the Chrome trace-event JSON it is written as.
#include "meshtrain/metrics/trace.h"

#include <algorithm>
#include <cstdio>

#include "meshtrain/core/durable_file.h"

namespace meshtrain {

TraceRecorder::TraceRecorder(std::vector<int64_t> profiler_steps, int process_id)
    : profiler_steps_(std::move(profiler_steps)),
      process_id_(process_id),
      origin_(std::chrono::steady_clock::now()) {}

void TraceRecorder::begin_step(int64_t step) {
  const std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
  active_.store(std::find(profiler_steps_.begin(), profiler_steps_.end(), step) != profiler_steps_.end(),
                std::memory_order_relaxed);
}

int64_t TraceRecorder::step() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return step_;
}

double TraceRecorder::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

void TraceRecorder::record(const std::string& name, const std::string& category, double start_us,
                           double duration_us, int thread, nlohmann::json args) {
  if (!active()) return;
  const std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(Event{name, category, start_us, duration_us, thread, step_, std::move(args)});
}

size_t TraceRecorder::event_count() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

std::map<std::pair<std::string, int64_t>, double> TraceRecorder::durations_us(
    const std::string& category) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::pair<std::string, int64_t>, double> durations;
  for (const Event& event : events_) {
    if (event.category == category) durations[{event.name, event.step}] += event.duration_us;
  }
  return durations;
}

void TraceRecorder::write(const std::string& path) const {
  nlohmann::json events = nlohmann::json::array();
  // Metadata events name the process and threads in the viewer.
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", process_id_},
                    {"tid", 0},
                    {"args", {{"name", "meshtrain rank " + std::to_string(process_id_)}}}});
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> threads;
  for (const Event& event : events_) {
    if (std::find(threads.begin(), threads.end(), event.thread) == threads.end()) {
      threads.push_back(event.thread);
    }
  }
  std::sort(threads.begin(), threads.end());
  for (int thread : threads) {
    events.push_back(
        {{"name", "thread_name"},
         {"ph", "M"},
         {"pid", process_id_},
         {"tid", thread},
         {"args", {{"name", thread == 0 ? std::string("main") : "thread " + std::to_string(thread)}}}});
  }
  for (const Event& event : events_) {
    nlohmann::json args = event.args.is_object() ? event.args : nlohmann::json::object();
    if (!event.args.is_null() && !event.args.is_object()) args["value"] = event.args;
    args["step"] = event.step;
    events.push_back({{"name", event.name},
                      {"cat", event.category},
                      {"ph", "X"},
                      {"ts", event.start_us},
                      // Perfetto drops negative durations; a clock can only make them by a caller bug.
                      {"dur", std::max(0.0, event.duration_us)},
                      {"pid", process_id_},
                      {"tid", event.thread},
                      {"args", std::move(args)}});
  }
  // Where this recorder's clock starts on steady_clock (CLOCK_MONOTONIC: one clock for every process of a
  // host), so the traces of several ranks can be laid on one time line (bench/pipeline's bubble).
  const double origin_us = std::chrono::duration<double, std::micro>(origin_.time_since_epoch()).count();
  const nlohmann::json trace = {{"traceEvents", std::move(events)},
                                {"displayTimeUnit", "ms"},
                                {"otherData", {{"steady_clock_origin_us", origin_us}}}};
  write_file_atomically(path, trace.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void TraceScope::finish() noexcept {
  // A destructor must not throw: a failed allocation while recording loses this one event.
  try {
    const double end_us = recorder_->now_us();
    recorder_->record(std::string(name_), std::string(category_), start_us_, end_us - start_us_, thread_,
                      std::move(args_));
  } catch (...) {
  }
}

}  // namespace meshtrain
