// Element types the engine stores, and their sizes and names as they appear in configs and safetensors.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

namespace meshtrain {

enum class DType { f32, bf16, i32, u8 };  // u8: per-token loss masks

size_t dtype_bytes(DType dtype);
std::string dtype_config_name(DType dtype);       // "float32", "bfloat16", "int32", "uint8"
std::string dtype_safetensors_name(DType dtype);  // "F32", "BF16", "I32", "U8"
// Parses a config value ("float32" / "bfloat16"); `key` names the config key in the error.
DType dtype_from_config(const std::string& key, const std::string& value);

// bfloat16 as its 16 bits: the top half of a float32.
inline float float_from_bfloat16(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest even. Rounding a NaN could carry its payload into the exponent (a signalling NaN would
// become inf): keep the sign and the top payload bits and set the quiet bit instead.
inline uint16_t bfloat16_from_float(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  // Add just under half an ulp, plus one more when the lowest kept bit is odd.
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// out [rows, cols] (packed) = in [rows, cols] (row stride ld_in) rounded to bfloat16, on all threads.
void round_to_bfloat16(const float* in, int64_t rows, int64_t cols, int64_t ld_in, uint16_t* out);

}  // namespace meshtrain
