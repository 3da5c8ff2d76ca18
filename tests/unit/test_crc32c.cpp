// CRC-32C against the standard check value and RFC 3720's test vectors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

}  // namespace
}  // namespace meshtrain
