// Trace recorder: Chrome trace JSON that parses back, events only during profiler steps, and TraceScope
// timings that are ordered and non-negative.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/metrics/trace.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() / ("meshtrain_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

nlohmann::json load(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);  // throws (fails the test) on invalid JSON
}

std::vector<nlohmann::json> complete_events(const nlohmann::json& trace) {
  std::vector<nlohmann::json> events;
  for (const auto& event : trace.at("traceEvents")) {
    if (event.at("ph") == "X") events.push_back(event);
  }
  return events;
}

// Simulates three steps of two ops each; only steps 1 and 3 are profiled.
TEST(Trace, RecordsOnlyProfilerSteps) {
  TempDir directory("trace_steps");
  TraceRecorder recorder({1, 3}, /*process_id=*/2);
  EXPECT_FALSE(recorder.active());  // before any step
  for (int64_t step = 0; step < 4; ++step) {
    recorder.begin_step(step);
    EXPECT_EQ(recorder.active(), step == 1 || step == 3);
    const double start = recorder.now_us();
    recorder.record("attention", "forward", start, 10.0, 0, {{"layer", 3}});
    recorder.record("all_reduce", "collective", start + 10.0, 5.0, 1);
  }
  EXPECT_EQ(recorder.event_count(), 4u);
  const std::string path = directory.str() + "/trace.json";
  recorder.write(path);

  const nlohmann::json trace = load(path);
  const auto events = complete_events(trace);
  ASSERT_EQ(events.size(), 4u);
  for (const auto& event : events) {
    for (const char* key : {"name", "cat", "ts", "dur", "pid", "tid", "args"}) {
      EXPECT_TRUE(event.contains(key)) << key << " missing in " << event.dump();
    }
    const int64_t step = event["args"]["step"].get<int64_t>();
    EXPECT_TRUE(step == 1 || step == 3) << event.dump();
    EXPECT_EQ(event["pid"], 2);
  }
  EXPECT_EQ(events[0]["name"], "attention");
  EXPECT_EQ(events[0]["cat"], "forward");
  EXPECT_EQ(events[0]["args"]["layer"], 3);
  EXPECT_DOUBLE_EQ(events[0]["dur"].get<double>(), 10.0);
  EXPECT_EQ(events[1]["tid"], 1);
  // Metadata names the process and both threads.
  int metadata = 0;
  for (const auto& event : trace["traceEvents"]) metadata += event["ph"] == "M" ? 1 : 0;
  EXPECT_EQ(metadata, 3);
  // Atomic write: no temporary file left.
  EXPECT_EQ(std::distance(fs::directory_iterator(directory.str()), fs::directory_iterator()), 1);
}

TEST(Trace, ScopeTimesOnlyWhenActive) {
  TraceRecorder recorder({0});
  recorder.begin_step(0);
  {
    TraceScope outer(&recorder, "step", "train");
    EXPECT_TRUE(outer.active());
    outer.arg("tokens", 2048);
    {
      TraceScope inner(&recorder, "matmul", "forward");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  recorder.begin_step(1);
  {
    TraceScope skipped(&recorder, "matmul", "forward");
    EXPECT_FALSE(skipped.active());
    skipped.arg("ignored", 1);
  }
  {
    TraceScope no_recorder(nullptr, "matmul", "forward");
    EXPECT_FALSE(no_recorder.active());
  }
  TempDir directory("trace_scope");
  recorder.write(directory.str() + "/trace.json");
  const auto events = complete_events(load(directory.str() + "/trace.json"));
  ASSERT_EQ(events.size(), 2u);
  // The inner scope ends first, so it is recorded first.
  const auto& inner = events[0];
  const auto& outer = events[1];
  EXPECT_EQ(inner["name"], "matmul");
  EXPECT_EQ(outer["name"], "step");
  EXPECT_EQ(outer["args"]["tokens"], 2048);
  for (const auto& event : events) {
    EXPECT_GE(event["ts"].get<double>(), 0.0);
    EXPECT_GE(event["dur"].get<double>(), 0.0);
  }
  EXPECT_GE(inner["dur"].get<double>(), 2000.0);  // slept 2 ms
  // Nesting: the outer region contains the inner one.
  EXPECT_LE(outer["ts"].get<double>(), inner["ts"].get<double>());
  EXPECT_GE(outer["ts"].get<double>() + outer["dur"].get<double>(),
            inner["ts"].get<double>() + inner["dur"].get<double>());
}

TEST(Trace, ConcurrentRecordsAreAllKept) {
  TraceRecorder recorder({5});
  recorder.begin_step(5);
  std::vector<std::thread> threads;
  for (int thread = 0; thread < 4; ++thread) {
    threads.emplace_back([&recorder, thread] {
      for (int i = 0; i < 100; ++i) TraceScope scope(&recorder, "work", "kernel", thread);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(recorder.event_count(), 400u);
}

TEST(Trace, WriteFailureNamesThePath) {
  TraceRecorder recorder({0});
  try {
    recorder.write("/nonexistent_meshtrain_dir/trace.json");
    FAIL() << "expected MeshError";
  } catch (const MeshError& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent_meshtrain_dir/trace.json"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace meshtrain
