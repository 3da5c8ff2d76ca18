// A file's bytes streamed in fixed-size chunks, decompressed by the file's name: plain, .gz (zlib) or .zst
// (libzstd). Never the whole file in memory: one chunk of the file and one of its decompressed bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace meshtrain {

enum class Compression { none, gzip, zstd };

// By the name's last extension: .gz, .zst, anything else none.
Compression compression_of(const std::string& path);

inline constexpr size_t kDefaultChunkBytes = size_t{1} << 20;

class ByteStream {
 public:
  // Opens `path` (a MeshError naming it when it cannot be read). chunk_bytes (1 byte to 1 GiB): the most
  // bytes read from the file at once and the most next() returns.
  static std::unique_ptr<ByteStream> open(const std::string& path, size_t chunk_bytes = kDefaultChunkBytes);
  virtual ~ByteStream();
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  // The next decompressed bytes (1 to chunk_bytes of them), valid until the next call; empty at the end. A
  // read error, or a compressed file that is corrupt or ends inside a stream (truncated), is a MeshError
  // naming the file, the byte offset of the file reached, and the fix.
  virtual std::string_view next() = 0;

  const std::string& path() const { return path_; }
  // Decompressed bytes returned so far: the offset in the decompressed stream of the next chunk's first byte.
  uint64_t offset() const { return offset_; }
  // Bytes read from the file so far (compressed where it is), for progress.
  uint64_t file_bytes_read() const { return file_bytes_read_; }

 protected:
  ByteStream(std::string path, size_t chunk_bytes);
  // Up to `capacity` bytes of the file into `out`; 0 at its end.
  size_t read_file(char* out, size_t capacity);

  std::string path_;
  size_t chunk_bytes_;
  uint64_t offset_ = 0;

 private:
  int descriptor_ = -1;
  uint64_t file_bytes_read_ = 0;
};

}  // namespace meshtrain
