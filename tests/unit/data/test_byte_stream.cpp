// data/records/byte_stream: plain, .gz and .zst files (made by the gzip and zstd tools) give the same bytes
// at any chunk size, multi-member / multi-frame files read whole, and truncated or corrupt files are
// MeshErrors naming the file and the byte offset reached.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "error_text.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/records/byte_stream.h"
#include "record_files.h"

namespace meshtrain {
namespace {

using testing::error_of;

struct Codec {
  const char* command;    // the tool compressing to standard output
  const char* extension;  // the name that makes ByteStream decompress
  const char* name;       // as the reader's errors call it
};
const Codec kCodecs[] = {{"gzip -n", ".gz", "gzip"}, {"zstd -q", ".zst", "zstd"}};

class ByteStreamTest : public testing::RecordFilesTest {
 protected:
  // sample_text() written and compressed with `codec`.
  std::string compressed_sample(const Codec& codec) const {
    const std::string plain = write("sample.txt", sample_text());
    return compress(codec.command, plain, std::string("sample.txt") + codec.extension);
  }

  // About 300 KB of varied text: compressed, it spans several of zlib's and zstd's blocks.
  static std::string sample_text() {
    std::string text;
    uint64_t state = 12345;
    for (int line = 0; line < 6000; ++line) {
      text += "line " + std::to_string(line) + ":";
      for (int word = 0; word < 6; ++word) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        text += " w" + std::to_string(state >> 50) + " \xc3\xa9t\xc3\xa9";
      }
      text += '\n';
    }
    return text;
  }

  static std::string read_all(const std::string& file, size_t chunk_bytes) {
    const auto stream = ByteStream::open(file, chunk_bytes);
    std::string bytes;
    for (std::string_view chunk = stream->next(); !chunk.empty(); chunk = stream->next()) {
      EXPECT_LE(chunk.size(), chunk_bytes);
      bytes.append(chunk);
      EXPECT_EQ(stream->offset(), bytes.size());
    }
    return bytes;
  }

  static std::string raw_bytes(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  // `file` cut to its first `size` bytes, as `name`.
  std::string cut(const std::string& file, uint64_t size, const std::string& name) const {
    const std::string out = path(name);
    std::filesystem::copy_file(file, out);
    std::filesystem::resize_file(out, size);
    return out;
  }

  // `file` with bytes [at, at + 16) inverted, as `name`.
  std::string damage(const std::string& file, uint64_t at, const std::string& name) const {
    std::string bytes = raw_bytes(file);
    for (uint64_t i = at; i < at + 16 && i < bytes.size(); ++i) bytes[i] = static_cast<char>(~bytes[i]);
    return write(name, bytes);
  }
};

TEST_F(ByteStreamTest, CompressionFollowsTheName) {
  EXPECT_EQ(compression_of("a/b.jsonl"), Compression::none);
  EXPECT_EQ(compression_of("a/b.jsonl.gz"), Compression::gzip);
  EXPECT_EQ(compression_of("a/b.jsonl.zst"), Compression::zstd);
  EXPECT_EQ(compression_of("a.gz/b.txt"), Compression::none);
}

TEST_F(ByteStreamTest, PlainGzipAndZstdGiveTheSameBytesAtAnyChunkSize) {
  MESHTRAIN_NEEDS_TOOL("gzip");
  MESHTRAIN_NEEDS_TOOL("zstd");
  const std::string text = sample_text();
  const std::string plain = write("sample.txt", text);
  const std::string gzip = compress("gzip -n", plain, "sample.txt.gz");
  const std::string zstd = compress("zstd -q", plain, "sample.txt.zst");
  ASSERT_LT(std::filesystem::file_size(zstd), text.size() / 2);  // compressed for real
  for (const size_t chunk : {size_t{1}, size_t{7}, size_t{4096}, kDefaultChunkBytes}) {
    if (chunk == 1) {  // a byte at a time through a decoder is slow: one file is enough to show it works
      EXPECT_EQ(read_all(gzip, chunk), text);
      continue;
    }
    EXPECT_EQ(read_all(plain, chunk), text) << chunk;
    EXPECT_EQ(read_all(gzip, chunk), text) << chunk;
    EXPECT_EQ(read_all(zstd, chunk), text) << chunk;
  }
}

TEST_F(ByteStreamTest, ConcatenatedMembersAndFramesReadAsOneStream) {
  MESHTRAIN_NEEDS_TOOL("gzip");
  MESHTRAIN_NEEDS_TOOL("zstd");
  const std::string first = write("first.txt", "the first part\n");
  const std::string second = write("second.txt", "and the second\n");
  for (const Codec& codec : kCodecs) {
    const std::string a = compress(codec.command, first, std::string("a") + codec.extension);
    const std::string b = compress(codec.command, second, std::string("b") + codec.extension);
    const std::string both = write(std::string("both") + codec.extension, raw_bytes(a) + raw_bytes(b));
    EXPECT_EQ(read_all(both, 5), "the first part\nand the second\n") << codec.name;
  }
}

TEST_F(ByteStreamTest, TruncatedFilesNameTheFileAndTheOffsetReached) {
  MESHTRAIN_NEEDS_TOOL("gzip");
  MESHTRAIN_NEEDS_TOOL("zstd");
  for (const Codec& codec : kCodecs) {
    const std::string whole = compressed_sample(codec);
    const uint64_t half = std::filesystem::file_size(whole) / 2;
    const std::string truncated = cut(whole, half, std::string("truncated") + codec.extension);
    for (const size_t chunk : {size_t{4096}, kDefaultChunkBytes}) {
      const std::string message = error_of([&] { read_all(truncated, chunk); });
      EXPECT_NE(message.find(truncated + ": expected a complete " + codec.name), std::string::npos)
          << message;
      EXPECT_NE(message.find("the file ends inside it at byte offset " + std::to_string(half)),
                std::string::npos)
          << message;
      EXPECT_NE(message.find(std::string("`") + codec.name + " -t FILE` checks"), std::string::npos)
          << message;
    }
    const std::string empty = write(std::string("empty") + codec.extension, "");
    EXPECT_NE(error_of([&] { read_all(empty, 4096); }).find("ends inside it at byte offset 0"),
              std::string::npos);
  }
}

TEST_F(ByteStreamTest, CorruptFilesNameTheFileAndTheOffsetReached) {
  MESHTRAIN_NEEDS_TOOL("gzip");
  MESHTRAIN_NEEDS_TOOL("zstd");
  for (const Codec& codec : kCodecs) {
    const std::string whole = compressed_sample(codec);
    const uint64_t size = std::filesystem::file_size(whole);
    const std::string damaged = damage(whole, size / 2, std::string("damaged") + codec.extension);
    const std::string message = error_of([&] { read_all(damaged, 4096); });
    EXPECT_NE(message.find(damaged + ": expected " + codec.name + " data"), std::string::npos) << message;
    EXPECT_NE(message.find("fetch or compress it again"), std::string::npos) << message;
    // The offset reached lies between the damage and the end (a checksum catches it at the latest).
    const std::string lead = "corrupt data at byte offset ";
    const size_t at = message.find(lead);
    ASSERT_NE(at, std::string::npos) << message;
    const uint64_t offset = std::stoull(message.substr(at + lead.size()));
    EXPECT_GE(offset, size / 2) << message;
    EXPECT_LE(offset, size) << message;
    // Not compressed at all, under a compressed name: refused at its first bytes.
    const std::string text = write(std::string("text") + codec.extension, "just text\n");
    EXPECT_NE(error_of([&] { read_all(text, 4096); }).find(lead), std::string::npos);
  }
}

TEST_F(ByteStreamTest, AZstdWindowAboveTheDecodersCapIsNotCalledDamage) {
  MESHTRAIN_NEEDS_TOOL("zstd");
  // From standard input the tool cannot shrink the window to the data's size: the frame asks for 2 GiB.
  const std::string file = path("long.jsonl.zst");
  ASSERT_EQ(std::system(("echo '{\"text\": \"hi\"}' | zstd --long=31 -q -c > '" + file + "'").c_str()), 0);
  const std::string message = error_of([&] { read_all(file, 4096); });
  EXPECT_NE(message.find(file + ": expected a zstd window of at most 128 MiB"), std::string::npos) << message;
  EXPECT_NE(message.find("recompress it without --long"), std::string::npos) << message;
}

TEST_F(ByteStreamTest, AMissingFileIsNamed) {
  const std::string missing = path("missing.jsonl");
  const std::string message = error_of([&] { ByteStream::open(missing); });
  EXPECT_NE(message.find(missing + ": expected a readable file"), std::string::npos) << message;
}

}  // namespace
}  // namespace meshtrain
