// What the fuzz targets share: a scratch directory per process (made on first use, removed at exit) where
// inputs are written for parsers that read files, and the split of one input into several files.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::fuzz {

// One input holding several files separates them with this line (the seed corpora are written that way).
inline constexpr std::string_view kFileSeparator = "\n--- next file ---\n";

class ScratchDirectory {
 public:
  ScratchDirectory() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/meshtrain-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror(("mkdtemp " + pattern).c_str());
      std::abort();
    }
    path_ = pattern;
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline const std::filesystem::path& scratch_directory() {
  static const ScratchDirectory directory;
  return directory.path();
}

// Writes `bytes` to `relative` under the scratch directory (making its folders) and returns its path. A write
// that fails is the harness's problem, not the parser's: it aborts.
inline std::string write_scratch_file(const std::string& relative, std::string_view bytes) {
  const std::filesystem::path path = scratch_directory() / relative;
  std::filesystem::create_directories(path.parent_path());
  std::FILE* file = std::fopen(path.c_str(), "wb");
  const bool written = file != nullptr && std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
  if (file == nullptr || std::fclose(file) != 0 || !written) {
    std::perror(("writing " + path.string()).c_str());
    std::abort();
  }
  return path.string();
}

// The input cut at each kFileSeparator: `count` parts, the last ones empty when the input has fewer.
inline std::vector<std::string_view> split_files(const uint8_t* data, size_t size, size_t count) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < count) {
    const size_t cut = rest.find(kFileSeparator);
    if (cut == std::string_view::npos) break;
    parts.push_back(rest.substr(0, cut));
    rest.remove_prefix(cut + kFileSeparator.size());
  }
  parts.push_back(rest);
  parts.resize(count);
  return parts;
}

// The assets under ../shared (real tokenizers); empty when this checkout has none.
inline std::filesystem::path shared_directory() {
  const char* from_environment = std::getenv("MESHTRAIN_SHARED_DIR");
  return from_environment != nullptr ? from_environment : MESHTRAIN_SHARED_DIR;
}

}  // namespace meshtrain::fuzz
