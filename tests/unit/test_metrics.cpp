// metrics.jsonl: one valid JSON object per flushed line, append on resume, truncate_after semantics, and
// the TensorBoard mirror of numeric fields.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshtrain/metrics/metrics.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() / ("meshtrain_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Every line parsed; fails the test on a line that is not a JSON object or a missing final newline.
std::vector<nlohmann::json> read_lines(const std::string& path) {
  const std::string text = read_text(path);
  EXPECT_TRUE(text.empty() || text.back() == '\n') << "file must end with a newline";
  std::vector<nlohmann::json> records;
  size_t begin = 0;
  for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
    const std::string line = text.substr(begin, end - begin);
    EXPECT_TRUE(nlohmann::json::accept(line)) << "not JSON: " << line;
    records.push_back(nlohmann::json::parse(line, nullptr, false));
    EXPECT_TRUE(records.back().is_object()) << line;
  }
  return records;
}

std::vector<int64_t> steps_of(const std::vector<nlohmann::json>& records) {
  std::vector<int64_t> steps;
  for (const auto& record : records) steps.push_back(record.value("step", int64_t{-1}));
  return steps;
}

TEST(MetricsLog, WritesOneFlushedJsonLinePerRecord) {
  TempDir directory("metrics_lines");
  MetricsLog log(directory.str() + "/run", /*tensorboard=*/false);
  EXPECT_EQ(log.path(), directory.str() + "/run/metrics.jsonl");
  for (int64_t step = 0; step < 3; ++step) {
    log.write({{"step", step}, {"loss", 3.0 - 0.5 * static_cast<double>(step)}, {"lr", 1e-4}});
    // Read while the log is open: each line must already be on disk (tail -f).
    EXPECT_EQ(read_lines(log.path()).size(), static_cast<size_t>(step + 1));
  }
  const auto records = read_lines(log.path());
  EXPECT_EQ(steps_of(records), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_DOUBLE_EQ(records[2]["loss"].get<double>(), 2.0);
  EXPECT_EQ(log.tensorboard(), nullptr);
}

TEST(MetricsLog, NonFiniteAndInvalidUtf8StayValidJson) {
  TempDir directory("metrics_odd");
  MetricsLog log(directory.str(), false);
  log.write({{"step", 0}, {"loss", std::numeric_limits<double>::quiet_NaN()}, {"note", "bad \xFF byte"}});
  const auto records = read_lines(log.path());
  ASSERT_EQ(records.size(), 1u);
  EXPECT_TRUE(records[0]["loss"].is_null());  // JSON has no NaN
  EXPECT_NE(records[0]["note"].get<std::string>().find("bad"), std::string::npos);
}

TEST(MetricsLog, RecordWithoutStepIsABug) {
  TempDir directory("metrics_nostep");
  MetricsLog log(directory.str(), false);
  EXPECT_THROW(log.write({{"loss", 1.0}}), std::logic_error);
  EXPECT_THROW(log.write({{"step", "three"}}), std::logic_error);
}

TEST(MetricsLog, ResumeAppendsAfterTruncation) {
  TempDir directory("metrics_resume");
  std::string path;
  {
    MetricsLog log(directory.str(), false);
    path = log.path();
    for (int64_t step = 0; step < 5; ++step) log.write({{"step", step}, {"loss", 1.0}});
  }
  // The run crashed after step 4; its last checkpoint was step 2: steps 3 and 4 are redone.
  MetricsLog::truncate_after(path, 2);
  {
    MetricsLog log(directory.str(), false);
    for (int64_t step = 3; step < 6; ++step) log.write({{"step", step}, {"loss", 0.5}});
  }
  EXPECT_EQ(steps_of(read_lines(path)), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
}

TEST(MetricsLog, TruncateAfterKeepsOnlyCompleteEarlierLines) {
  TempDir directory("metrics_truncate");
  fs::create_directories(directory.str());
  const std::string path = directory.str() + "/metrics.jsonl";
  write_text(path,
             "{\"step\":0,\"loss\":4}\n"
             "{\"event\":\"start\",\"config\":\"x\"}\n"  // no step: kept
             "{\"step\":1,\"loss\":3}\n"
             "not json\n"  // unparseable: dropped
             "{\"step\":2,\"eval/loss\":3.5}\n"
             "{\"step\":3,\"loss\":2}\n"
             "{\"step\":4,\"loss\":1}\n"
             "{\"step\":5,\"lo");  // torn by a crash
  MetricsLog::truncate_after(path, 2);
  EXPECT_EQ(read_text(path),
            "{\"step\":0,\"loss\":4}\n"
            "{\"event\":\"start\",\"config\":\"x\"}\n"
            "{\"step\":1,\"loss\":3}\n"
            "{\"step\":2,\"eval/loss\":3.5}\n");
  // Nothing left behind by the atomic replace.
  EXPECT_EQ(std::distance(fs::directory_iterator(directory.str()), fs::directory_iterator()), 1);

  // A complete last line that lost only its newline is still dropped: the next append would join it.
  write_text(path, "{\"step\":0}\n{\"step\":1}");
  MetricsLog::truncate_after(path, 10);
  EXPECT_EQ(read_text(path), "{\"step\":0}\n");

  // Nothing above the step: the file is left as it is.
  write_text(path, "{\"step\":0}\n{\"step\":1}\n");
  const auto before = fs::last_write_time(path);
  MetricsLog::truncate_after(path, 1);
  EXPECT_EQ(read_text(path), "{\"step\":0}\n{\"step\":1}\n");
  EXPECT_EQ(fs::last_write_time(path), before);

  // Step -1 empties the log (a run restarted from scratch in the same run_dir).
  MetricsLog::truncate_after(path, -1);
  EXPECT_EQ(read_text(path), "");
}

TEST(MetricsLog, TruncateAfterMissingFileDoesNothing) {
  TempDir directory("metrics_missing");
  fs::create_directories(directory.str());
  MetricsLog::truncate_after(directory.str() + "/metrics.jsonl", 3);
  EXPECT_FALSE(fs::exists(directory.str() + "/metrics.jsonl"));
}

TEST(MetricsLog, MirrorsNumericFieldsToTensorBoard) {
  TempDir directory("metrics_tb");
  {
    MetricsLog log(directory.str(), /*tensorboard=*/true);
    ASSERT_NE(log.tensorboard(), nullptr);
    log.write({{"step", 7},
               {"loss", 2.5},
               {"lr", 1e-4},
               {"eval", {{"loss", 3.0}}},
               {"note", "text"},
               {"skipped", true}});
  }
  std::string events;
  for (const auto& entry : fs::directory_iterator(directory.str())) {
    if (entry.path().filename().string().find("tfevents") != std::string::npos) {
      events = read_text(entry.path().string());
    }
  }
  ASSERT_FALSE(events.empty());
  // Summary.Value.tag is field 1, length-delimited: 0x0A, length, bytes.
  const auto has_tag = [&events](const std::string& tag) {
    return events.find(std::string("\x0A") + static_cast<char>(tag.size()) + tag) != std::string::npos;
  };
  EXPECT_TRUE(has_tag("loss"));
  EXPECT_TRUE(has_tag("lr"));
  EXPECT_TRUE(has_tag("eval/loss"));
  EXPECT_FALSE(has_tag("step"));
  EXPECT_FALSE(has_tag("note"));
  EXPECT_FALSE(has_tag("skipped"));
}

}  // namespace
}  // namespace meshtrain
