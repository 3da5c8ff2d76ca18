// CRC-32C (Castagnoli): TensorBoard record framing and checkpoint / shard checksums.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshtrain {

// Extends `crc` (0 to start) with `size` bytes: SSE4.2's CRC32 instruction where the CPU has it (CPUID), else
// crc32c_tables.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// The plain reference: slicing-by-8 tables, for any CPU.
uint32_t crc32c_tables(const void* data, size_t size, uint32_t crc = 0);
// TensorBoard's masked form: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c_masked(uint32_t crc);

}  // namespace meshtrain
