// Raw sources' fingerprints (fingerprint.h): size and a CRC-32C over each file's head and tail.
#include "meshtrain/data/records/fingerprint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>
#include <vector>

#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

[[noreturn]] void fail_read(const std::string& path) {
  fail(path, "a readable data file", std::system_category().message(errno),
       "check the path and its permissions");
}

// CRC-32C of `size` bytes of `descriptor` from `offset`, extending `crc`.
uint32_t crc_of_range(int descriptor, const std::string& path, uint64_t offset, uint64_t size, uint32_t crc) {
  std::vector<char> buffer(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t got =
        ::pread(descriptor, buffer.data() + done, size - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail_read(path);
    if (got == 0) fail(path, "a file that stays as it is while read", "it shrank", "stop whatever writes it");
    done += static_cast<size_t>(got);
  }
  return crc32c(buffer.data(), buffer.size(), crc);
}

FileFingerprint fingerprint_file(const std::string& path) {
  const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) fail_read(path);
  struct CloseAtExit {
    int descriptor;
    ~CloseAtExit() { ::close(descriptor); }
  } closer{descriptor};
  struct stat info {};
  if (::fstat(descriptor, &info) != 0) fail_read(path);
  FileFingerprint fingerprint{path, static_cast<uint64_t>(info.st_size), 0};
  const uint64_t head = std::min(fingerprint.bytes, kFingerprintSampleBytes);
  fingerprint.sample_crc32c = crc_of_range(descriptor, path, 0, head, 0);
  const uint64_t tail_start =
      std::max(head, fingerprint.bytes - std::min(fingerprint.bytes, kFingerprintSampleBytes));
  fingerprint.sample_crc32c =
      crc_of_range(descriptor, path, tail_start, fingerprint.bytes - tail_start, fingerprint.sample_crc32c);
  return fingerprint;
}

}  // namespace

std::vector<FileFingerprint> fingerprint_files(const std::vector<std::string>& files) {
  std::vector<FileFingerprint> fingerprint;
  fingerprint.reserve(files.size());
  for (const std::string& file : files) fingerprint.push_back(fingerprint_file(file));
  return fingerprint;
}

nlohmann::json fingerprint_json(const std::vector<FileFingerprint>& fingerprint) {
  nlohmann::json files = nlohmann::json::array();
  for (const FileFingerprint& file : fingerprint) {
    files.push_back({{"path", file.path}, {"bytes", file.bytes}, {"sample_crc32c", file.sample_crc32c}});
  }
  return {{"files", files}};
}

std::vector<FileFingerprint> fingerprint_from_json(const nlohmann::json& json, const std::string& where) {
  std::vector<FileFingerprint> fingerprint;
  try {
    for (const nlohmann::json& file : json.at("files")) {
      fingerprint.push_back({file.at("path").get<std::string>(), file.at("bytes").get<uint64_t>(),
                             file.at("sample_crc32c").get<uint32_t>()});
    }
  } catch (const nlohmann::json::exception& error) {
    fail(where, "a sources' fingerprint {\"files\": [{\"path\", \"bytes\", \"sample_crc32c\"}, ...]}",
         error.what(), "the fingerprint is damaged or from another meshtrain version");
  }
  return fingerprint;
}

std::string fingerprint_change(const std::vector<FileFingerprint>& saved,
                               const std::vector<FileFingerprint>& now) {
  const size_t common = std::min(saved.size(), now.size());
  for (size_t i = 0; i < common; ++i) {
    const FileFingerprint& before = saved[i];
    const FileFingerprint& after = now[i];
    if (before.path != after.path) {
      return "file " + std::to_string(i + 1) + " was " + before.path + ", is now " + after.path +
             " (files added, removed or renamed)";
    }
    if (before.bytes != after.bytes) {
      return before.path + " changed size: " + std::to_string(before.bytes) + " bytes, now " +
             std::to_string(after.bytes);
    }
    if (before.sample_crc32c != after.sample_crc32c) {
      return before.path + " changed content (same size, its first or last 64 KiB differ)";
    }
  }
  if (saved.size() > now.size()) {
    return std::to_string(saved.size() - now.size()) + " file(s) removed, the first " + saved[common].path;
  }
  if (now.size() > saved.size()) {
    return std::to_string(now.size() - saved.size()) + " file(s) added, the first " + now[common].path;
  }
  return "";
}

}  // namespace meshtrain
