// A source's files (source_files.h): a file, a folder walked recursively, or a glob(3) pattern, each file's
// format known by its name.
#include "meshtrain/data/records/source_files.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool hidden(const fs::path& path) {
  const std::string name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

// glob(3)'s matches, unsorted (its own order follows the locale's collation; the caller sorts bytewise).
std::vector<std::string> glob_matches(const std::string& pattern, const std::string& path_setting) {
  glob_t matches{};
  const int status = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &matches);
  std::vector<std::string> paths;
  if (status == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) paths.emplace_back(matches.gl_pathv[i]);
  }
  ::globfree(&matches);
  if (status == GLOB_NOMATCH || (status == 0 && paths.empty())) {
    fail(pattern, "a glob matching at least one file", "no match",
         "check the pattern and the current folder, or point " + path_setting + " at a file or folder");
  }
  if (status != 0) {
    fail(pattern, "a glob that can be expanded", status == GLOB_NOSPACE ? "out of memory" : "a read error",
         "check the folders' permissions");
  }
  return paths;
}

}  // namespace

std::optional<RecordFormat> record_format_of(const std::string& path) {
  if (ends_with(path, ".txt")) return RecordFormat::text;
  for (const char* suffix : {".jsonl", ".jsonl.gz", ".jsonl.zst"}) {
    if (ends_with(path, suffix)) return RecordFormat::json_lines;
  }
  if (ends_with(path, ".parquet")) return RecordFormat::parquet;
  return std::nullopt;
}

const char* supported_record_files() {
  return ".txt (one document per file), .jsonl, .jsonl.gz, .jsonl.zst (one JSON object per line), .parquet "
         "(one "
         "row per document)";
}

std::vector<std::string> files_under(const std::string& folder) {
  std::vector<std::string> files;
  std::error_code error;
  fs::recursive_directory_iterator it(folder, fs::directory_options::skip_permission_denied, error);
  if (error) fail(folder, "a readable folder", error.message(), "check the folder's permissions");
  for (const fs::recursive_directory_iterator end; it != end; it.increment(error)) {
    if (error) fail(folder, "a readable folder tree", error.message(), "check the folder's permissions");
    std::error_code kind_error;  // a dangling link is neither file nor folder: skipped
    if (hidden(it->path())) {
      if (it->is_directory(kind_error)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(kind_error)) files.push_back(it->path().string());
  }
  if (error) fail(folder, "a readable folder tree", error.message(), "check the folder's permissions");
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> resolve_source_files(const std::string& source, const std::string& path_setting) {
  const std::vector<std::string> named =
      is_glob(source) ? glob_matches(source, path_setting) : std::vector<std::string>{source};
  std::vector<std::string> files;
  for (const std::string& path : named) {
    std::error_code error;
    const fs::file_status status = fs::status(path, error);
    if (error || !fs::exists(status)) {
      fail(path, "an existing file, folder or glob of " + std::string(supported_record_files()),
           status.type() == fs::file_type::not_found ? std::string("nothing at that path") : error.message(),
           "check " + path_setting);
    }
    if (fs::is_directory(status)) {
      const std::vector<std::string> inside = files_under(path);
      if (inside.empty()) {
        fail(path, "a folder holding at least one data file", "no files (hidden ones are skipped)",
             "put " + std::string(supported_record_files()) + " files in it or point " + path_setting +
                 " elsewhere");
      }
      files.insert(files.end(), inside.begin(), inside.end());
    } else {
      files.push_back(path);
    }
  }
  for (const std::string& file : files) {
    if (!record_format_of(file)) {
      fail(file, std::string("a data file named ") + supported_record_files(),
           "a name of no supported kind" + (source == file ? std::string() : " (in " + source + ")"),
           "rename or convert it, or move it out of " + path_setting + "'s files (none is skipped)");
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool is_glob(const std::string& source) {
  return source.find_first_of("*?[") != std::string::npos;
}

bool holds_records(const std::string& source) {
  if (is_glob(source)) return true;
  std::error_code error;
  const std::vector<std::string> files =
      fs::is_directory(source, error) ? files_under(source) : std::vector<std::string>{source};
  for (const std::string& file : files) {
    const std::optional<RecordFormat> format = record_format_of(file);
    if (format && *format != RecordFormat::text) return true;
  }
  return false;
}

}  // namespace meshtrain
