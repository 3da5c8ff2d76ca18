// Durable, atomic file writes: temporary file, fsync, rename, fsync of the directory.
#include "meshtrain/core/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "meshtrain/core/error.h"

namespace meshtrain {

std::string read_file_text(const std::string& path, const std::string& what, const std::string& hint) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "a readable " + what, std::strerror(errno), hint);
  std::string bytes;
  char buffer[1 << 16];
  while (true) {
    const ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      ::close(fd);
      fail(path, "a readable " + what, std::string("read failed: ") + std::strerror(err), hint);
    }
    if (got == 0) break;
    bytes.append(buffer, static_cast<size_t>(got));
  }
  ::close(fd);
  return bytes;
}

namespace {

// The fix for the usual reasons a write fails half-way.
std::string write_error_hint(int err) {
  if (err == ENOSPC || err == EDQUOT)
    return "free space on the device (or within the quota) or write elsewhere";
  if (err == EFBIG) return "raise the file-size limit (ulimit -f) or write elsewhere";
  return "check that the folder exists and is writable";
}

std::string parent_directory(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

DurableFile::DurableFile(std::string path, unsigned permissions)
    : path_(std::move(path)), temporary_(path_ + ".tmp." + std::to_string(::getpid())) {
  fd_ =
      ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, static_cast<mode_t>(permissions));
  if (fd_ < 0) {
    const int err = errno;
    fail(path_, "a file meshtrain can write", "creating " + temporary_ + " failed: " + std::strerror(err),
         write_error_hint(err));
  }
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_.c_str());
}

void DurableFile::give_up(const std::string& step, int err) {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  ::unlink(temporary_.c_str());
  committed_ = true;  // nothing left for the destructor to remove
  fail(path_, "the complete file written and renamed into place",
       step + " failed: " + std::strerror(err) + "; the partial file was removed", write_error_hint(err));
}

void DurableFile::write_at(const void* data, size_t size, uint64_t offset) {
  MT_CHECK(fd_ >= 0, "write to a committed DurableFile " + path_);
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::pwrite(fd_, bytes, size, static_cast<off_t>(offset));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) give_up("write", written < 0 ? errno : EIO);
    bytes += written;
    size -= static_cast<size_t>(written);
    offset += static_cast<uint64_t>(written);
  }
}

void DurableFile::append(const void* data, size_t size) {
  write_at(data, size, end_);
  end_ += size;
  // Start writing back what is appended as it grows, without waiting for it, so that commit()'s fsync of a
  // large file (a token shard, a checkpoint's tensors) waits for the last stretch only, not the whole file.
  if (end_ - written_back_ >= kWritebackBytes) {
    ::sync_file_range(fd_, static_cast<off_t>(written_back_), static_cast<off_t>(end_ - written_back_),
                      SYNC_FILE_RANGE_WRITE);  // a hint: an error here shows again at fsync, which is checked
    written_back_ = end_;
  }
}

void DurableFile::commit() {
  MT_CHECK(fd_ >= 0, "DurableFile " + path_ + " committed twice");
  // Delayed-allocation filesystems may report ENOSPC only here, so fsync and close are checked like writes.
  if (::fsync(fd_) != 0) give_up("fsync", errno);
  if (::close(std::exchange(fd_, -1)) != 0) give_up("close", errno);
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) give_up("rename of " + temporary_, errno);
  committed_ = true;
  fsync_directory(parent_directory(path_));
}

void write_file_atomically(const std::string& path, std::string_view content, unsigned permissions) {
  DurableFile file(path, permissions);
  file.append(content);
  file.commit();
}

void fsync_directory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    fail(directory, "a directory that can be opened", std::string("open failed: ") + std::strerror(errno));
  }
  const bool synced = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!synced) {
    fail(directory, "a directory whose entries can be made durable",
         std::string("fsync failed: ") + std::strerror(err));
  }
}

}  // namespace meshtrain
