// Element types the engine stores, and their sizes and names as they appear in configs and safetensors.
#pragma once

#include <cstddef>
#include <string>

namespace meshtrain {

enum class DType { f32, bf16, i32, u8 };  // u8: per-token loss masks

size_t dtype_bytes(DType dtype);
std::string dtype_config_name(DType dtype);       // "float32", "bfloat16", "int32", "uint8"
std::string dtype_safetensors_name(DType dtype);  // "F32", "BF16", "I32", "U8"
// Parses a config value ("float32" / "bfloat16"); `key` names the config key in the error.
DType dtype_from_config(const std::string& key, const std::string& value);

}  // namespace meshtrain
