#include "meshtrain/core/crc32c.h"

#include <fcntl.h>
#include <nmmintrin.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// Slicing-by-8 tables for the reflected polynomial 0x82F63B78.
constexpr std::array<std::array<uint32_t, 256>, 8> make_tables() {
  std::array<std::array<uint32_t, 256>, 8> tables{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    tables[0][byte] = crc;
  }
  for (uint32_t byte = 0; byte < 256; ++byte) {
    for (size_t slice = 1; slice < 8; ++slice) {
      const uint32_t previous = tables[slice - 1][byte];
      tables[slice][byte] = (previous >> 8) ^ tables[0][previous & 0xFFu];
    }
  }
  return tables;
}

constexpr auto kTables = make_tables();

// SSE4.2's CRC32 instruction computes CRC-32C: 8 bytes per instruction, several times the tables' rate
// (shards and checkpoints are checksummed as they are written, so this is on prepare's and save's path).
__attribute__((target("sse4.2"))) uint32_t crc32c_instruction(const unsigned char* bytes, size_t size,
                                                              uint32_t crc) {
  uint64_t state = ~crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, bytes, sizeof word);
    state = _mm_crc32_u64(state, word);
    bytes += 8;
    size -= 8;
  }
  auto narrow = static_cast<uint32_t>(state);
  while (size-- > 0) narrow = _mm_crc32_u8(narrow, *bytes++);
  return ~narrow;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  static const bool has_instruction = cpu_features().sse42;
  if (has_instruction) return crc32c_instruction(static_cast<const unsigned char*>(data), size, crc);
  return crc32c_tables(data, size, crc);
}

uint32_t crc32c_tables(const void* data, size_t size, uint32_t crc) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (size >= 8) {
    const uint32_t low = crc ^ (uint32_t{bytes[0]} | uint32_t{bytes[1]} << 8 | uint32_t{bytes[2]} << 16 |
                                uint32_t{bytes[3]} << 24);
    crc = kTables[7][low & 0xFF] ^ kTables[6][(low >> 8) & 0xFF] ^ kTables[5][(low >> 16) & 0xFF] ^
          kTables[4][low >> 24] ^ kTables[3][bytes[4]] ^ kTables[2][bytes[5]] ^ kTables[1][bytes[6]] ^
          kTables[0][bytes[7]];
    bytes += 8;
    size -= 8;
  }
  while (size-- > 0) crc = (crc >> 8) ^ kTables[0][(crc ^ *bytes++) & 0xFFu];
  return ~crc;
}

uint32_t crc32c_masked(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

FileChecksum checksum_file(const std::string& path, const std::string& expected) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, expected, "open failed: " + std::system_category().message(errno));
  FileChecksum sum;
  std::vector<char> buffer(size_t{1} << 20);
  while (true) {
    const ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      fail(path, expected, "read failed: " + std::system_category().message(error));
    }
    if (got == 0) break;
    sum.crc32c = crc32c(buffer.data(), static_cast<size_t>(got), sum.crc32c);
    sum.bytes += static_cast<uint64_t>(got);
  }
  ::close(fd);
  return sum;
}

}  // namespace meshtrain
