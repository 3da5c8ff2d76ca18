// Token shards: the on-disk form of a tokenized corpus (`meshtrain prepare` writes them, the loader mmaps
// them).
//
// Format (version 1, all integers little-endian):
//   offset  size  field
//        0     8  magic "MTTOKENS"
//        8     4  u32 version = 1
//       12     4  u32 token width in bytes, 2 or 4: 2 when every id < 65536 (write_token_shard) or when
//                   the tokenizer has at most 65536 ids (prepare --tokenizer, which streams), else 4; so
//                   a 4-byte shard's ids may all lie below 65536
//       16     8  u64 token count N
//       24     4  u32 CRC-32C (Castagnoli) of the N * width token bytes
//       28     4  u32 reserved, 0
//       32  N*w   the tokens, unsigned little-endian integers of `width` bytes
// The file size is exactly 32 + N * width. Documents are stored back to back, each followed by the
// end-of-sequence id (the writer appends it), so the EOS id marks every document boundary; the EOS id
// itself is not stored in the shard (prepare.json and the tokenizer record it). A reader checks magic,
// version, width, reserved field, size and checksum, and rejects anything else naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "meshtrain/core/durable_file.h"

namespace meshtrain {

inline constexpr char kShardMagic[8] = {'M', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 32;

struct ShardSummary {
  uint64_t token_count = 0;
  uint32_t width = 0;     // bytes per token: 2 or 4
  uint32_t checksum = 0;  // CRC-32C of the token bytes
  uint64_t file_bytes = 0;
};

// A shard written as it grows, so a writer holds one chunk of it in memory, not the whole: a placeholder
// header, the tokens appended in chunks (CRC-32C computed as they go), then at finish() the header written
// and the file fsynced and renamed into place (DurableFile). A shard given up before finish() (an error, a
// stopped run) leaves no file at `path`. The width is fixed up front; an id that does not fit it, or a
// negative one, is a MeshError naming `path`.
class TokenShardWriter {
 public:
  TokenShardWriter(const std::string& path, uint32_t width);
  void append(std::span<const int32_t> tokens);
  uint64_t size() const { return token_count_; }
  ShardSummary finish();

 private:
  void flush();

  DurableFile file_;
  uint32_t width_;
  uint64_t token_count_ = 0;
  uint32_t checksum_ = 0;
  std::vector<unsigned char> chunk_;  // token bytes not yet written
};

// The width a shard of ids below `limit` (e.g. a tokenizer's vocabulary size) is written with.
inline uint32_t shard_width_for(int64_t limit) {
  return limit <= 65536 ? 2 : 4;
}

// Writes `tokens` as one shard (2 bytes a token when every id < 65536). The file appears atomically (temp
// file, fsync, rename); write errors are MeshErrors naming `path`. Negative ids are rejected.
ShardSummary write_token_shard(const std::string& path, std::span<const int32_t> tokens);
// Writes the documents back to back, each followed by `eos_id`.
ShardSummary write_token_shard(const std::string& path, const std::vector<std::vector<int32_t>>& documents,
                               int32_t eos_id);

// A validated, read-only, memory-mapped shard. Move-only.
class TokenShard {
 public:
  // Maps and validates the whole file (header fields, size, checksum, ids below 2^31); any defect is a
  // MeshError naming the file with the hint to re-run `meshtrain prepare`.
  static TokenShard open(const std::string& path);

  uint64_t size() const { return summary_.token_count; }
  int32_t operator[](uint64_t index) const {
    return summary_.width == 2 ? static_cast<int32_t>(u16_[index]) : static_cast<int32_t>(u32_[index]);
  }
  // Copies tokens [start, start + count) into `out`; the range must lie inside the shard.
  void read(uint64_t start, size_t count, int32_t* out) const;

  const ShardSummary& summary() const { return summary_; }
  int32_t max_token() const { return max_token_; }  // -1 for an empty shard
  const std::string& path() const { return path_; }

  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();

 private:
  TokenShard() = default;
  void release();

  std::string path_;
  ShardSummary summary_;
  int32_t max_token_ = -1;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  const uint16_t* u16_ = nullptr;  // [N] when width == 2
  const uint32_t* u32_ = nullptr;  // [N] when width == 4
};

// Whether `path` is still the shard an earlier run recorded: a whole shard (TokenShard::open's checks) with
// this checksum and token count. False for a missing, damaged or different file (a prepare then rebuilds).
bool shard_still_written(const std::string& path, uint32_t checksum, uint64_t tokens);

}  // namespace meshtrain
