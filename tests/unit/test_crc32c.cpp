// CRC-32C against the standard check value and RFC 3720's test vectors; files checksummed block by block.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/core/crc32c.h"

namespace meshtrain {
namespace {

TEST(Crc32c, StandardVectors) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_tables(check.data(), check.size()), 0xE3069283u);
  const std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::vector<unsigned char> ascending(32);
  for (size_t i = 0; i < ascending.size(); ++i) ascending[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
}

TEST(Crc32c, ExtendsAcrossCalls) {
  const std::string text = "The quick brown fox jumps over the lazy dog";
  const uint32_t whole = crc32c(text.data(), text.size());
  EXPECT_EQ(crc32c(text.data() + 10, text.size() - 10, crc32c(text.data(), 10)), whole);
}

// The instruction path (where the CPU has one) against the tables on every length and alignment around the
// 8-byte steps, extended from a non-zero start.
TEST(Crc32c, InstructionEqualsTables) {
  std::vector<unsigned char> bytes(300);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t size = 0; size + offset <= bytes.size(); size += 13) {
      EXPECT_EQ(crc32c(bytes.data() + offset, size, 0x1234u),
                crc32c_tables(bytes.data() + offset, size, 0x1234u))
          << "offset " << offset << " size " << size;
    }
  }
}

// A file longer than the 1 MiB blocks it is read in, and not a multiple of them: its size and the CRC of its
// bytes in one piece; a missing file names its path and what it should have been.
TEST(Crc32c, ChecksumsAFileAcrossBlocks) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("meshtrain_crc_" + std::to_string(getpid()))).string();
  std::string bytes((size_t{3} << 20) + 12345, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
  std::ofstream(path, std::ios::binary) << bytes;
  const FileChecksum sum = checksum_file(path, "a readable test file");
  std::filesystem::remove(path);
  EXPECT_EQ(sum.bytes, bytes.size());
  EXPECT_EQ(sum.crc32c, crc32c(bytes.data(), bytes.size()));
  const std::string error = testing::error_of([&] { checksum_file(path, "a readable test file"); });
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("a readable test file"), std::string::npos) << error;
}

}  // namespace
}  // namespace meshtrain
