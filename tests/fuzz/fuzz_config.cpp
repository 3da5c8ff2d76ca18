// Config layering (config/config.h) on arbitrary bytes: the input is a user YAML file, then after
// fuzz::kFileSeparator key=value overrides, one a line, layered over configs/base.yaml and the preset the
// file or an override names, as `meshtrain train FILE KEY=VALUE...` loads them.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_files.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain;
  const std::vector<std::string_view> files = fuzz::split_files(data, size, 2);
  const std::string path = fuzz::write_scratch_file("config.yaml", files[0]);
  std::vector<std::string> overrides;
  std::string_view lines = files[1];
  while (!lines.empty()) {
    const size_t end = std::min(lines.find('\n'), lines.size());
    overrides.emplace_back(lines.substr(0, end));
    lines.remove_prefix(std::min(end + 1, lines.size()));
  }
  try {
    load_config(path, overrides);
  } catch (const MeshError&) {
    // A rejected file or override is the expected outcome for most inputs.
  }
  return 0;
}
