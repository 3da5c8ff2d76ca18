// CRC-32C (Castagnoli): TensorBoard record framing and checkpoint / shard checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace meshtrain {

// Extends `crc` (0 to start) with `size` bytes: SSE4.2's CRC32 instruction where the CPU has it (CPUID), else
// crc32c_tables.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// The plain reference: slicing-by-8 tables, for any CPU.
uint32_t crc32c_tables(const void* data, size_t size, uint32_t crc = 0);
// TensorBoard's masked form: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c_masked(uint32_t crc);

struct FileChecksum {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};
// Size and CRC-32C of the file at `path` as stored, read in 1 MiB blocks. A file that cannot be opened or
// read fails naming `path`, `expected` ("a readable checkpoint file") and the system's reason.
FileChecksum checksum_file(const std::string& path, const std::string& expected);

}  // namespace meshtrain
