// Token shard writer and mmap reader; the format is described in shards.h.
#include "meshtrain/data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>

#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// Tokens are read in place from the mapping; a big-endian host would need byte swaps.
static_assert(std::endian::native == std::endian::little, "token shards assume a little-endian host");

constexpr const char* kRerunHint = "re-run meshtrain prepare to rebuild the shard";

std::string os_error(int err) {
  return std::system_category().message(err);
}

void put_u32(unsigned char* out, uint32_t value) {
  std::memcpy(out, &value, 4);
}
void put_u64(unsigned char* out, uint64_t value) {
  std::memcpy(out, &value, 8);
}
uint32_t get_u32(const unsigned char* in) {
  uint32_t value;
  std::memcpy(&value, in, 4);
  return value;
}
uint64_t get_u64(const unsigned char* in) {
  uint64_t value;
  std::memcpy(&value, in, 8);
  return value;
}

// Chunk of the streaming writer: large enough that writes and CRC calls are few, small enough to stay in
// cache.
constexpr size_t kChunkBytes = size_t{1} << 20;

// Range check first, then the narrowing copy: two branch-free loops the compiler vectorizes.
template <class Word>
void put_tokens(const std::string& path, std::span<const int32_t> tokens, uint64_t first_index,
                unsigned char* out) {
  constexpr auto kLimit = static_cast<int64_t>(std::numeric_limits<Word>::max());
  int32_t low = 0, high = 0;
  for (const int32_t id : tokens) {
    low = std::min(low, id);
    high = std::max(high, id);
  }
  if (low < 0 || high > kLimit) {
    const auto bad =
        std::find_if(tokens.begin(), tokens.end(), [](int32_t id) { return id < 0 || id > kLimit; });
    fail(path,
         *bad < 0 ? "non-negative token ids"
                  : "token ids that fit " + std::to_string(sizeof(Word)) + "-byte shard tokens",
         "id " + std::to_string(*bad) + " at token " +
             std::to_string(first_index + static_cast<uint64_t>(bad - tokens.begin())));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto word = static_cast<Word>(tokens[i]);
    std::memcpy(out + i * sizeof(Word), &word, sizeof(Word));
  }
}

[[noreturn]] void corrupt(const std::string& path, const std::string& expected, const std::string& found) {
  fail(path, expected, found, kRerunHint);
}

}  // namespace

TokenShardWriter::TokenShardWriter(const std::string& path, uint32_t width) : file_(path), width_(width) {
  MT_CHECK(width == 2 || width == 4, "shard width " + std::to_string(width));
  chunk_.reserve(kChunkBytes);
  const unsigned char placeholder[kShardHeaderBytes] = {};  // not a shard's magic until finish()
  file_.append(placeholder, sizeof placeholder);
}

void TokenShardWriter::append(std::span<const int32_t> tokens) {
  while (!tokens.empty()) {
    const size_t room = (kChunkBytes - chunk_.size()) / width_;
    const size_t count = std::min(room, tokens.size());
    const size_t used = chunk_.size();
    chunk_.resize(used + count * width_);
    const std::span<const int32_t> part = tokens.first(count);
    if (width_ == 2) {
      put_tokens<uint16_t>(file_.path(), part, token_count_, chunk_.data() + used);
    } else {
      put_tokens<uint32_t>(file_.path(), part, token_count_, chunk_.data() + used);
    }
    token_count_ += count;
    tokens = tokens.subspan(count);
    if (chunk_.size() + width_ > kChunkBytes) flush();
  }
}

void TokenShardWriter::flush() {
  checksum_ = crc32c(chunk_.data(), chunk_.size(), checksum_);
  file_.append(chunk_.data(), chunk_.size());
  chunk_.clear();
}

ShardSummary TokenShardWriter::finish() {
  flush();
  ShardSummary summary;
  summary.token_count = token_count_;
  summary.width = width_;
  summary.checksum = checksum_;
  summary.file_bytes = kShardHeaderBytes + token_count_ * width_;
  unsigned char header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, 8);
  put_u32(header + 8, kShardVersion);
  put_u32(header + 12, summary.width);
  put_u64(header + 16, summary.token_count);
  put_u32(header + 24, summary.checksum);
  put_u32(header + 28, 0);
  file_.write_at(header, sizeof header, 0);
  file_.commit();
  return summary;
}

ShardSummary write_token_shard(const std::string& path, std::span<const int32_t> tokens) {
  const int32_t max_token = tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
  TokenShardWriter writer(path, shard_width_for(int64_t{max_token} + 1));
  writer.append(tokens);
  return writer.finish();
}

ShardSummary write_token_shard(const std::string& path, const std::vector<std::vector<int32_t>>& documents,
                               int32_t eos_id) {
  size_t total = 0;
  for (const auto& document : documents) total += document.size() + 1;
  std::vector<int32_t> tokens;
  tokens.reserve(total);
  for (const auto& document : documents) {
    tokens.insert(tokens.end(), document.begin(), document.end());
    tokens.push_back(eos_id);
  }
  return write_token_shard(path, std::span<const int32_t>(tokens));
}

TokenShard TokenShard::open(const std::string& path) {
  TokenShard shard;
  shard.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    fail(path, "a readable token shard", os_error(errno),
         "check dataset_path, or run meshtrain prepare to create the shards");
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, "a readable token shard", os_error(err));
  }
  const uint64_t file_bytes = static_cast<uint64_t>(info.st_size);
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    fail(path, "a regular file holding a token shard", "not a regular file",
         "point dataset_path at a .tokens file");
  }
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    corrupt(path, "at least the 32-byte shard header", std::to_string(file_bytes) + " bytes (truncated)");
  }
  void* mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_error = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapping == MAP_FAILED) fail(path, "mmap of the shard to succeed", os_error(map_error));
  shard.mapping_ = mapping;
  shard.mapping_bytes_ = file_bytes;

  const auto* bytes = static_cast<const unsigned char*>(mapping);
  if (std::memcmp(bytes, kShardMagic, 8) != 0) {
    std::string found;
    for (int i = 0; i < 8; ++i) {
      const unsigned char c = bytes[i];
      found += (c >= 32 && c < 127) ? static_cast<char>(c) : '?';
    }
    corrupt(path, "magic \"MTTOKENS\" (a meshtrain token shard)", "\"" + found + "\"");
  }
  const uint32_t version = get_u32(bytes + 8);
  if (version != kShardVersion) {
    fail(path, "shard format version " + std::to_string(kShardVersion), "version " + std::to_string(version),
         "re-run meshtrain prepare with this meshtrain to rebuild the shard");
  }
  const uint32_t width = get_u32(bytes + 12);
  if (width != 2 && width != 4) corrupt(path, "token width 2 or 4 bytes", std::to_string(width));
  const uint64_t count = get_u64(bytes + 16);
  const uint32_t checksum = get_u32(bytes + 24);
  const uint32_t reserved = get_u32(bytes + 28);
  if (reserved != 0) corrupt(path, "reserved header field 0", std::to_string(reserved));
  const uint64_t data_bytes = file_bytes - kShardHeaderBytes;
  const bool truncated = count > data_bytes / width;
  if (truncated || count * width != data_bytes) {
    corrupt(path,
            "file size 32 + " + std::to_string(count) + " tokens x " + std::to_string(width) +
                " bytes (header says so)",
            std::to_string(file_bytes) + " bytes" + (truncated ? " (truncated)" : " (trailing bytes)"));
  }
  const uint32_t actual = crc32c(bytes + kShardHeaderBytes, data_bytes);
  if (actual != checksum) {
    corrupt(path, "token checksum (CRC-32C) " + std::to_string(checksum),
            std::to_string(actual) + " (the token bytes are corrupt)");
  }
  shard.summary_ = ShardSummary{count, width, checksum, file_bytes};
  uint32_t max_token = 0;
  if (width == 2) {
    shard.u16_ = reinterpret_cast<const uint16_t*>(bytes + kShardHeaderBytes);
    for (uint64_t i = 0; i < count; ++i) max_token = std::max<uint32_t>(max_token, shard.u16_[i]);
  } else {
    shard.u32_ = reinterpret_cast<const uint32_t*>(bytes + kShardHeaderBytes);
    for (uint64_t i = 0; i < count; ++i) max_token = std::max(max_token, shard.u32_[i]);
  }
  if (max_token > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    corrupt(path, "token ids below 2^31", "id " + std::to_string(max_token));
  }
  shard.max_token_ = count == 0 ? -1 : static_cast<int32_t>(max_token);
  return shard;
}

void TokenShard::read(uint64_t start, size_t count, int32_t* out) const {
  MT_CHECK(start <= summary_.token_count && count <= summary_.token_count - start, path_);
  if (summary_.width == 2) {
    for (size_t i = 0; i < count; ++i) out[i] = u16_[start + i];
  } else {
    for (size_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(u32_[start + i]);
  }
}

TokenShard::TokenShard(TokenShard&& other) noexcept {
  *this = std::move(other);
}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    summary_ = other.summary_;
    max_token_ = other.max_token_;
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
    u16_ = std::exchange(other.u16_, nullptr);
    u32_ = std::exchange(other.u32_, nullptr);
  }
  return *this;
}

TokenShard::~TokenShard() {
  release();
}

void TokenShard::release() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
  mapping_ = nullptr;
  mapping_bytes_ = 0;
  u16_ = nullptr;
  u32_ = nullptr;
}

bool shard_still_written(const std::string& path, uint32_t checksum, uint64_t tokens) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) return false;
  try {
    const TokenShard shard = TokenShard::open(path);
    return shard.summary().checksum == checksum && shard.size() == tokens;
  } catch (const MeshError&) {
    return false;
  }
}

}  // namespace meshtrain
