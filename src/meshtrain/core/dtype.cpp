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

}  // namespace meshtrain
