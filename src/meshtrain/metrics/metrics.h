// Per-step metrics of a run: one JSON object per line in <run_dir>/metrics.jsonl (what tools and
// `tail -f` read), mirrored as TensorBoard scalars.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "meshtrain/metrics/tensorboard.h"

namespace meshtrain {

class MetricsLog {
 public:
  // Opens <run_dir>/metrics.jsonl for appending (creating run_dir), so a resumed run continues the file;
  // call truncate_after() first. With `tensorboard`, numeric fields also go to an event file in run_dir.
  MetricsLog(const std::string& run_dir, bool tensorboard);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Appends `record` (an object with an integer "step") as one line and flushes it. Each numeric field
  // other than "step" becomes a TensorBoard scalar tagged with its key; nested objects join keys with
  // '/' ({"eval": {"loss": x}} -> "eval/loss"). NaN / infinity are written as null in JSON (JSON has no
  // such numbers) but reach TensorBoard as they are.
  void write(const nlohmann::json& record);

  const std::string& path() const { return path_; }
  // Null when TensorBoard is off.
  TensorBoardWriter* tensorboard() { return tensorboard_.get(); }

  // Drops the lines of `path` whose "step" is greater than `step`, lines that are not JSON objects, and a
  // last line without its newline (a write torn by a crash). Lines without "step" are kept. Replaces the
  // file atomically, and only when something was dropped; a missing file is left missing. Returns the
  // highest step dropped (`step` when none was): the steps a resumed run trains again.
  static int64_t truncate_after(const std::string& path, int64_t step);

 private:
  struct FileCloser {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace meshtrain
