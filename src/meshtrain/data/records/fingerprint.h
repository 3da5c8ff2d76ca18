// What identifies a raw source's files, for later resume checks: each file's path, size and a CRC-32C of its
// first and last 64 KiB. Cheap on any corpus (two reads per file), and blind to mtimes, which a copy to
// another machine changes without changing the data.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace meshtrain {

struct FileFingerprint {
  std::string path;            // as the source resolved it
  uint64_t bytes = 0;          // the file's size on disk (compressed where it is)
  uint32_t sample_crc32c = 0;  // CRC-32C of bytes [0, 64 KiB) then [size - 64 KiB, size), the whole file once
                               // when it is at most 128 KiB
  bool operator==(const FileFingerprint&) const = default;
};

inline constexpr uint64_t kFingerprintSampleBytes = 64 * 1024;

// The files in the order given (a MeshError naming a file that cannot be read).
std::vector<FileFingerprint> fingerprint_files(const std::vector<std::string>& files);

// {"files": [{"path", "bytes", "sample_crc32c"}, ...]} and back (a MeshError naming `where` on a bad one).
nlohmann::json fingerprint_json(const std::vector<FileFingerprint>& fingerprint);
std::vector<FileFingerprint> fingerprint_from_json(const nlohmann::json& json, const std::string& where);

// What changed from `saved` to `now`, for an error: the first file added, removed, resized or rewritten, or
// a changed order; empty when they are the same.
std::string fingerprint_change(const std::vector<FileFingerprint>& saved,
                               const std::vector<FileFingerprint>& now);

}  // namespace meshtrain
