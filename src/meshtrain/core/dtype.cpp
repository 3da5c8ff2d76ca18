#include "meshtrain/core/dtype.h"

#include "meshtrain/core/error.h"

namespace meshtrain {

size_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
    case DType::u8:
      return 1;
  }
  return 0;
}

std::string dtype_config_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float32";
    case DType::bf16:
      return "bfloat16";
    case DType::i32:
      return "int32";
    case DType::u8:
      return "uint8";
  }
  return "?";
}

std::string dtype_safetensors_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::i32:
      return "I32";
    case DType::u8:
      return "U8";
  }
  return "?";
}

DType dtype_from_config(const std::string& key, const std::string& value) {
  if (value == "float32" || value == "fp32") return DType::f32;
  if (value == "bfloat16" || value == "bf16") return DType::bf16;
  fail("config key '" + key + "'", "float32 or bfloat16", "'" + value + "'");
}

void round_to_bfloat16(const float* in, int64_t rows, int64_t cols, int64_t ld_in, uint16_t* out) {
  // Whole rows per thread when there are enough of them; a single wide row (a bias, one token) is split.
  if (rows >= 8) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* source = in + r * ld_in;
      uint16_t* target = out + r * cols;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) target[c] = bfloat16_from_float(source[c]);
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* source = in + r * ld_in;
    uint16_t* target = out + r * cols;
#pragma omp parallel for simd schedule(static)
    for (int64_t c = 0; c < cols; ++c) target[c] = bfloat16_from_float(source[c]);
  }
}

}  // namespace meshtrain
