// Durable, atomic file writes: a reader (or a crash) sees the old file or the whole new one, never a part.
// Every file meshtrain writes for later reading (plans, shards, tokenizers, checkpoints, run files) goes
// here; and the one whole-file read (every byte, or an error naming the file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace meshtrain {

// Every byte of `path`; an unreadable file is a MeshError "PATH: expected a readable WHAT, found <the OS's
// reason> (fix: HINT)".
std::string read_file_text(const std::string& path, const std::string& what, const std::string& hint = "");

// A file written under a temporary name beside its final path (path + ".tmp." + pid, so two writers of one
// path never share it) and published by commit(): fsync, rename over the path, fsync of the directory.
// Errors throw MeshError naming the final path; a failed or abandoned write leaves no temporary behind and
// any earlier file at the path untouched.
class DurableFile {
 public:
  // `permissions`: the new file's mode bits before the umask (0755 for a script a user runs).
  explicit DurableFile(std::string path, unsigned permissions = 0644);
  ~DurableFile();  // removes the temporary file unless commit() succeeded
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void append(const void* data, size_t size);
  void append(std::string_view bytes) { append(bytes.data(), bytes.size()); }
  // Writes at a byte offset, for formats whose header is known only after the body (token shards).
  void write_at(const void* data, size_t size, uint64_t offset);
  void commit();

  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void give_up(const std::string& step, int err);

  std::string path_;
  std::string temporary_;
  int fd_ = -1;
  uint64_t end_ = 0;           // where append() writes next
  uint64_t written_back_ = 0;  // appended bytes before this offset have had their writeback started
  static constexpr uint64_t kWritebackBytes = uint64_t{32} << 20;
  bool committed_ = false;
};

// The whole file at once through a DurableFile.
void write_file_atomically(const std::string& path, std::string_view content, unsigned permissions = 0644);

// Makes new entries and renames in `directory` durable (a rename reaches the disk only with its directory).
void fsync_directory(const std::string& directory);

}  // namespace meshtrain
