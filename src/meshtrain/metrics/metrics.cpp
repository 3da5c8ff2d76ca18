// metrics.jsonl writer with TensorBoard mirroring, and the truncation that keeps a resumed run's log free
// of duplicate steps.
#include "meshtrain/metrics/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// Invalid UTF-8 in a string field (e.g. a file name) must not abort the run: replace it.
std::string dump_line(const nlohmann::json& record) {
  return record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void mirror_numbers(TensorBoardWriter& writer, const nlohmann::json& object, const std::string& prefix,
                    int64_t step, double wall_time) {
  for (const auto& [key, value] : object.items()) {
    const std::string tag = prefix.empty() ? key : prefix + "/" + key;
    if (value.is_object()) {
      mirror_numbers(writer, value, tag, step, wall_time);
    } else if (value.is_number() && !(prefix.empty() && key == "step")) {
      writer.add_scalar(tag, step, value.get<double>(), wall_time);
    }
  }
}

}  // namespace

MetricsLog::MetricsLog(const std::string& run_dir, bool tensorboard) {
  std::error_code error;
  std::filesystem::create_directories(run_dir, error);
  if (error) fail(run_dir, "a run directory meshtrain can create", error.message(), "check run_dir");
  path_ = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  file_.reset(std::fopen(path_.c_str(), "a"));
  if (!file_) {
    fail(path_, "a metrics file open for appending", std::strerror(errno),
         "check run_dir's permissions and free space");
  }
  if (tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(run_dir);
}

MetricsLog::~MetricsLog() = default;

void MetricsLog::write(const nlohmann::json& record) {
  MT_CHECK(record.is_object() && record.contains("step") && record["step"].is_number_integer(),
           "a metrics record needs an integer \"step\"");
  const std::string line = dump_line(record) + "\n";
  // One fwrite per line, then a flush: `tail -f` and a crash both see whole lines (up to the last one).
  if (std::fwrite(line.data(), 1, line.size(), file_.get()) != line.size() || std::fflush(file_.get()) != 0) {
    fail(path_, "a writable metrics file", std::strerror(errno), "check free space in run_dir");
  }
  if (tensorboard_) {
    mirror_numbers(*tensorboard_, record, "", record["step"].get<int64_t>(), unix_seconds_now());
    tensorboard_->flush();
  }
}

int64_t MetricsLog::truncate_after(const std::string& path, int64_t step) {
  std::ifstream in(path, std::ios::binary);
  int64_t highest_dropped = step;
  if (!in) {
    if (!std::filesystem::exists(path)) return highest_dropped;
    fail(path, "a readable metrics file", std::strerror(errno), "check its permissions");
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) fail(path, "a readable metrics file", std::strerror(errno), "check the disk");
  const std::string text = buffer.str();
  std::string kept;
  bool changed = false;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    // A last line without '\n' is a write torn by a crash: drop it even if it happens to parse, since
    // appending after it would glue the next record onto it.
    if (end == std::string::npos) {
      changed = true;
      break;
    }
    const std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool keep = record.is_object() && !(record.contains("step") && record["step"].is_number() &&
                                              record["step"].get<double>() > static_cast<double>(step));
    if (keep) {
      kept.append(line);
      kept += '\n';
    } else {
      changed = true;
      if (record.is_object() && record.contains("step") && record["step"].is_number_integer())
        highest_dropped = std::max(highest_dropped, record["step"].get<int64_t>());
    }
  }
  if (changed) write_file_atomically(path, kept);
  return highest_dropped;
}

}  // namespace meshtrain
