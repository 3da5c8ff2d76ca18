// Streamed, decompressed file bytes (byte_stream.h): plain reads, zlib's inflate for gzip (every member of a
// multi-member file, as gzip -d reads them) and libzstd's streaming decoder (every frame).
#include "meshtrain/data/records/byte_stream.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <cerrno>
#include <system_error>
#include <vector>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string damaged_hint(const char* tool) {
  return std::string(
             "the file is damaged or cut short (an interrupted download or copy): fetch or compress it "
             "again; `") +
         tool + " -t FILE` checks a file";
}

class PlainStream final : public ByteStream {
 public:
  PlainStream(std::string path, size_t chunk_bytes)
      : ByteStream(std::move(path), chunk_bytes), buffer_(chunk_bytes) {}
  std::string_view next() override {
    const size_t got = read_file(buffer_.data(), buffer_.size());
    offset_ += got;
    return {buffer_.data(), got};
  }

 private:
  std::vector<char> buffer_;
};

// What both decoders share: the compressed file's bytes, refilled one chunk at a time as the decoder takes
// them, and one chunk of decompressed output.
class CompressedStream : public ByteStream {
 protected:
  CompressedStream(std::string path, size_t chunk_bytes)
      : ByteStream(std::move(path), chunk_bytes), input_(chunk_bytes), output_(chunk_bytes) {}

  void refill_if_taken() {
    if (input_position_ < input_size_ || input_at_end_) return;
    input_size_ = read_file(input_.data(), input_.size());
    input_position_ = 0;
    input_at_end_ = input_size_ == 0;
  }
  bool no_more_input() const { return input_position_ == input_size_ && input_at_end_; }
  // The byte offset of the file the decoder has reached.
  uint64_t compressed_offset() const { return file_bytes_read() - (input_size_ - input_position_); }

  std::vector<char> input_;
  size_t input_size_ = 0;      // bytes of input_ filled
  size_t input_position_ = 0;  // bytes of them the decoder has taken
  bool input_at_end_ = false;  // the file has no more bytes
  std::vector<char> output_;
};

class GzipStream final : public CompressedStream {
 public:
  GzipStream(std::string path, size_t chunk_bytes) : CompressedStream(std::move(path), chunk_bytes) {
    // 15 + 16: a 32 KiB window, gzip framing only (its header and CRC-32 trailer checked).
    if (inflateInit2(&stream_, 15 + 16) != Z_OK) fail(path_, "zlib to start", "no memory", "free memory");
  }
  ~GzipStream() override { inflateEnd(&stream_); }

  std::string_view next() override {
    stream_.next_out = reinterpret_cast<Bytef*>(output_.data());
    stream_.avail_out = static_cast<uInt>(output_.size());
    while (stream_.avail_out > 0) {
      refill_if_taken();
      const bool input_done = no_more_input();
      if (input_done && !in_member_) break;  // the end, between members
      if (!in_member_) {                     // another member follows (concatenated .gz files are one stream)
        inflateReset(&stream_);
        in_member_ = true;
      }
      stream_.next_in = reinterpret_cast<Bytef*>(input_.data() + input_position_);
      stream_.avail_in = static_cast<uInt>(input_size_ - input_position_);
      const uInt out_before = stream_.avail_out;
      const int status = inflate(&stream_, Z_NO_FLUSH);
      input_position_ = input_size_ - stream_.avail_in;
      if (status == Z_STREAM_END) {
        in_member_ = false;
      } else if (status != Z_OK && status != Z_BUF_ERROR) {
        fail(path_, "gzip data",
             "corrupt data at byte offset " + std::to_string(compressed_offset()) + " of the file (" +
                 (stream_.msg != nullptr ? stream_.msg : "zlib error " + std::to_string(status)) + ")",
             damaged_hint("gzip"));
      } else if (input_done && stream_.avail_out == out_before) {
        fail(path_, "a complete gzip stream",
             "the file ends inside it at byte offset " + std::to_string(compressed_offset()) + " (" +
                 std::to_string(offset_ + output_.size() - stream_.avail_out) + " bytes decompressed)",
             damaged_hint("gzip"));
      }
    }
    const size_t got = output_.size() - stream_.avail_out;
    offset_ += got;
    return {output_.data(), got};
  }

 private:
  z_stream stream_{};
  bool in_member_ = true;  // an empty file is a truncated stream, not an empty one
};

class ZstdStream final : public CompressedStream {
 public:
  ZstdStream(std::string path, size_t chunk_bytes)
      : CompressedStream(std::move(path), chunk_bytes), context_(ZSTD_createDCtx()) {
    if (context_ == nullptr) fail(path_, "libzstd to start", "no memory", "free memory");
  }
  ~ZstdStream() override { ZSTD_freeDCtx(context_); }

  std::string_view next() override {
    ZSTD_outBuffer out{output_.data(), output_.size(), 0};
    while (out.pos < out.size) {
      refill_if_taken();
      const bool input_done = no_more_input();
      // Past a frame's end the decoder's return is only a hint for the next header: stop there.
      if (input_done && !in_frame_) break;
      ZSTD_inBuffer in{input_.data(), input_size_, input_position_};
      const size_t out_before = out.pos;
      const size_t status = ZSTD_decompressStream(context_, &out, &in);
      input_position_ = in.pos;
      if (ZSTD_getErrorCode(status) == ZSTD_error_frameParameter_windowTooLarge) {
        // Not damage: made with `zstd --long=31` or the like; libzstd's default cap is what zstd -d has too.
        fail(path_, "a zstd window of at most 128 MiB",
             "a frame asking for more (made with zstd --long above 27)",
             "recompress it without --long (zstd -d -c --long=31 FILE | zstd -o NEW), or with --long=27");
      }
      if (ZSTD_isError(status)) {
        fail(path_, "zstd data",
             "corrupt data at byte offset " + std::to_string(compressed_offset()) + " of the file (" +
                 ZSTD_getErrorName(status) + ")",
             damaged_hint("zstd"));
      }
      in_frame_ = status != 0;
      if (input_done && in_frame_ && out.pos == out_before) {
        fail(path_, "a complete zstd frame",
             "the file ends inside it at byte offset " + std::to_string(compressed_offset()) + " (" +
                 std::to_string(offset_ + out.pos) + " bytes decompressed)",
             damaged_hint("zstd"));
      }
    }
    offset_ += out.pos;
    return {output_.data(), out.pos};
  }

 private:
  ZSTD_DCtx* context_;
  bool in_frame_ = true;  // an empty file is a truncated frame, not an empty stream
};

}  // namespace

Compression compression_of(const std::string& path) {
  if (ends_with(path, ".gz")) return Compression::gzip;
  if (ends_with(path, ".zst")) return Compression::zstd;
  return Compression::none;
}

ByteStream::ByteStream(std::string path, size_t chunk_bytes)
    : path_(std::move(path)), chunk_bytes_(chunk_bytes) {
  // zlib counts a buffer in 32-bit words: a chunk stays well below that.
  MT_CHECK(chunk_bytes_ > 0 && chunk_bytes_ <= (size_t{1} << 30),
           "a byte stream reads chunks of 1 byte to 1 GiB");
  descriptor_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (descriptor_ < 0) {
    fail(path_, "a readable file", std::system_category().message(errno),
         "check the path and its permissions");
  }
}

ByteStream::~ByteStream() {
  ::close(descriptor_);
}

size_t ByteStream::read_file(char* out, size_t capacity) {
  while (true) {
    const ssize_t got = ::read(descriptor_, out, capacity);
    if (got >= 0) {
      file_bytes_read_ += static_cast<uint64_t>(got);
      return static_cast<size_t>(got);
    }
    if (errno != EINTR) {
      fail(path_, "a readable file",
           std::system_category().message(errno) + " at byte offset " + std::to_string(file_bytes_read_),
           "check the disk and the file's permissions");
    }
  }
}

std::unique_ptr<ByteStream> ByteStream::open(const std::string& path, size_t chunk_bytes) {
  switch (compression_of(path)) {
    case Compression::gzip:
      return std::make_unique<GzipStream>(path, chunk_bytes);
    case Compression::zstd:
      return std::make_unique<ZstdStream>(path, chunk_bytes);
    case Compression::none:
      break;
  }
  return std::make_unique<PlainStream>(path, chunk_bytes);
}

}  // namespace meshtrain
