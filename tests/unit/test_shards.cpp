// Token shards: round trips at both widths, and every kind of corruption is a MeshError naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/shards.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

class ShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("meshtrain_shards_" + std::to_string(::getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string read_bytes(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void write_bytes(const std::string& file, const std::string& bytes) {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  // Writes a good shard, lets `damage` edit its bytes, and expects opening it to fail naming the file and
  // mentioning `needle`.
  void expect_corrupt(const std::function<void(std::string&)>& damage, const std::string& needle) {
    const std::string file = path("damaged.tokens");
    const std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 10};
    write_token_shard(file, std::span<const int32_t>(tokens));
    std::string bytes = read_bytes(file);
    damage(bytes);
    write_bytes(file, bytes);
    try {
      TokenShard::open(file);
      FAIL() << "expected a MeshError mentioning " << needle;
    } catch (const MeshError& error) {
      const std::string message = error.what();
      EXPECT_EQ(error.context().where, file);
      EXPECT_NE(message.find(needle), std::string::npos) << message;
      EXPECT_NE(message.find("meshtrain prepare"), std::string::npos) << message;
    }
  }

  fs::path dir_;
};

void set_u32(std::string& bytes, size_t offset, uint32_t value) {
  std::memcpy(bytes.data() + offset, &value, 4);
}
void set_u64(std::string& bytes, size_t offset, uint64_t value) {
  std::memcpy(bytes.data() + offset, &value, 8);
}

TEST_F(ShardsTest, RoundTripWidth2) {
  const std::vector<int32_t> tokens = {0, 1, 2, 65535, 300, 7};
  const std::string file = path("a.tokens");
  const ShardSummary written = write_token_shard(file, std::span<const int32_t>(tokens));
  EXPECT_EQ(written.width, 2u);
  EXPECT_EQ(written.token_count, tokens.size());
  EXPECT_EQ(fs::file_size(file), 32 + 2 * tokens.size());
  const TokenShard shard = TokenShard::open(file);
  ASSERT_EQ(shard.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(shard[i], tokens[i]);
  EXPECT_EQ(shard.max_token(), 65535);
  EXPECT_EQ(shard.summary().checksum, written.checksum);
  std::vector<int32_t> middle(3);
  shard.read(2, 3, middle.data());
  EXPECT_EQ(middle, (std::vector<int32_t>{2, 65535, 300}));
  // No temp file is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(ShardsTest, RoundTripWidth4) {
  const std::vector<int32_t> tokens = {65536, 0, 151935, 2147483647, 12};
  const std::string file = path("b.tokens");
  EXPECT_EQ(write_token_shard(file, std::span<const int32_t>(tokens)).width, 4u);
  const TokenShard shard = TokenShard::open(file);
  ASSERT_EQ(shard.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(shard[i], tokens[i]);
  EXPECT_EQ(shard.max_token(), 2147483647);
}

TEST_F(ShardsTest, HeaderLayoutIsAsDocumented) {
  const std::vector<int32_t> tokens = {1, 2, 3};
  const std::string file = path("c.tokens");
  write_token_shard(file, std::span<const int32_t>(tokens));
  const std::string bytes = read_bytes(file);
  ASSERT_EQ(bytes.size(), 38u);
  EXPECT_EQ(bytes.substr(0, 8), "MTTOKENS");
  uint32_t version, width, checksum, reserved;
  uint64_t count;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&width, bytes.data() + 12, 4);
  std::memcpy(&count, bytes.data() + 16, 8);
  std::memcpy(&checksum, bytes.data() + 24, 4);
  std::memcpy(&reserved, bytes.data() + 28, 4);
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(width, 2u);
  EXPECT_EQ(count, 3u);
  EXPECT_EQ(checksum, crc32c(bytes.data() + 32, 6));
  EXPECT_EQ(reserved, 0u);
}

TEST_F(ShardsTest, DocumentsGetEosAfterEach) {
  const std::string file = path("docs.tokens");
  write_token_shard(file, {{1, 2}, {}, {3}}, 9);
  const TokenShard shard = TokenShard::open(file);
  std::vector<int32_t> all(shard.size());
  shard.read(0, all.size(), all.data());
  EXPECT_EQ(all, (std::vector<int32_t>{1, 2, 9, 9, 3, 9}));
}

TEST_F(ShardsTest, EmptyShardRoundTrips) {
  const std::string file = path("empty.tokens");
  write_token_shard(file, std::span<const int32_t>());
  const TokenShard shard = TokenShard::open(file);
  EXPECT_EQ(shard.size(), 0u);
  EXPECT_EQ(shard.max_token(), -1);
}

TEST_F(ShardsTest, MovedShardStaysReadable) {
  const std::vector<int32_t> tokens = {4, 5};
  const std::string file = path("m.tokens");
  write_token_shard(file, std::span<const int32_t>(tokens));
  std::vector<TokenShard> shards;
  shards.push_back(TokenShard::open(file));
  shards.push_back(TokenShard::open(file));
  TokenShard moved = std::move(shards[0]);
  EXPECT_EQ(moved[1], 5);
  EXPECT_EQ(shards[1][0], 4);
}

TEST_F(ShardsTest, NegativeIdIsRejected) {
  const std::vector<int32_t> tokens = {1, -3};
  EXPECT_THROW(write_token_shard(path("n.tokens"), std::span<const int32_t>(tokens)), MeshError);
  EXPECT_FALSE(fs::exists(path("n.tokens")));
}

// Appended in uneven pieces across several 1 MiB chunks, the streamed shard is byte for byte the one
// written at once.
TEST_F(ShardsTest, StreamingWriterMatchesWholeWrite) {
  std::vector<int32_t> tokens(1'500'000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919) % 65536);
  const ShardSummary whole = write_token_shard(path("whole.tokens"), std::span<const int32_t>(tokens));
  TokenShardWriter writer(path("streamed.tokens"), 2);
  for (size_t start = 0, piece = 1; start < tokens.size(); start += piece, piece = piece * 3 + 1) {
    writer.append(std::span<const int32_t>(tokens).subspan(start, std::min(piece, tokens.size() - start)));
  }
  EXPECT_EQ(writer.size(), tokens.size());
  EXPECT_FALSE(fs::exists(path("streamed.tokens")));  // not until finish()
  const ShardSummary streamed = writer.finish();
  EXPECT_EQ(streamed.checksum, whole.checksum);
  EXPECT_EQ(streamed.file_bytes, whole.file_bytes);
  EXPECT_EQ(read_bytes(path("streamed.tokens")), read_bytes(path("whole.tokens")));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);  // no temp file
}

// A 4-byte shard whose ids all fit in 2 bytes (a tokenizer of more than 65536 ids) reads back.
TEST_F(ShardsTest, StreamingWriterWidth4WithSmallIds) {
  const std::vector<int32_t> tokens = {5, 65535, 0};
  const std::string file = path("w4.tokens");
  TokenShardWriter writer(file, 4);
  writer.append(tokens);
  EXPECT_EQ(writer.finish().width, 4u);
  const TokenShard shard = TokenShard::open(file);
  EXPECT_EQ(shard.summary().width, 4u);
  ASSERT_EQ(shard.size(), 3u);
  EXPECT_EQ(shard[1], 65535);
  EXPECT_EQ(fs::file_size(file), 32u + 12u);
}

// An id wider than the shard's width is a MeshError naming the file and the token; the abandoned shard
// leaves nothing behind.
TEST_F(ShardsTest, StreamingWriterRejectsAnIdTooWide) {
  const std::string file = path("narrow.tokens");
  try {
    TokenShardWriter writer(file, 2);
    writer.append(std::vector<int32_t>{1, 2});
    writer.append(std::vector<int32_t>{65536});
    FAIL() << "an id of 65536 in a 2-byte shard was accepted";
  } catch (const MeshError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(file), std::string::npos) << message;
    EXPECT_NE(message.find("id 65536 at token 2"), std::string::npos) << message;
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);
}

TEST_F(ShardsTest, UnwritableFolderNamesThePath) {
  const std::vector<int32_t> tokens = {1};
  const std::string file = path("missing/dir/x.tokens");
  try {
    write_token_shard(file, std::span<const int32_t>(tokens));
    FAIL();
  } catch (const MeshError& error) {
    EXPECT_NE(std::string(error.what()).find("x.tokens"), std::string::npos);
    EXPECT_NE(std::string(error.what()).find("No such file"), std::string::npos) << error.what();
  }
}

TEST_F(ShardsTest, MissingFileNamesIt) {
  try {
    TokenShard::open(path("absent.tokens"));
    FAIL();
  } catch (const MeshError& error) {
    EXPECT_EQ(error.context().where, path("absent.tokens"));
  }
}

TEST_F(ShardsTest, BadMagic) {
  expect_corrupt([](std::string& b) { b[0] = 'X'; }, "MTTOKENS");
}
TEST_F(ShardsTest, BadVersion) {
  expect_corrupt([](std::string& b) { set_u32(b, 8, 7); }, "version 7");
}
TEST_F(ShardsTest, BadWidth) {
  expect_corrupt([](std::string& b) { set_u32(b, 12, 3); }, "width");
}
TEST_F(ShardsTest, BadReserved) {
  expect_corrupt([](std::string& b) { set_u32(b, 28, 1); }, "reserved");
}
TEST_F(ShardsTest, TruncatedData) {
  expect_corrupt([](std::string& b) { b.resize(b.size() - 3); }, "truncated");
}
TEST_F(ShardsTest, TruncatedHeader) {
  expect_corrupt([](std::string& b) { b.resize(20); }, "truncated");
}
TEST_F(ShardsTest, EmptyFile) {
  expect_corrupt([](std::string& b) { b.clear(); }, "header");
}
TEST_F(ShardsTest, SizeMismatchTrailingBytes) {
  expect_corrupt([](std::string& b) { b += "zz"; }, "file size");
}
TEST_F(ShardsTest, CountDisagreesWithSize) {
  expect_corrupt([](std::string& b) { set_u64(b, 16, 5); }, "file size");
  expect_corrupt([](std::string& b) { set_u64(b, 16, ~uint64_t{0}); }, "truncated");
}
TEST_F(ShardsTest, ChecksumMismatch) {
  expect_corrupt([](std::string& b) { b[33] = static_cast<char>(b[33] ^ 1); }, "checksum");
  expect_corrupt([](std::string& b) { set_u32(b, 24, 1234); }, "checksum");
}

}  // namespace
}  // namespace meshtrain
