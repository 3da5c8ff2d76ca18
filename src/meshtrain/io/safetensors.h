// Reading and writing Hugging Face safetensors files: a validated, memory-mapped reader (with conversion to
// float32 / int32 for loading weights) and a writer that checks every write and never leaves a partial file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace meshtrain {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as in the file: "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

// A read-only memory map of one safetensors file whose header has been fully validated: every tensor's byte
// range lies inside the data section, matches its shape and dtype, and overlaps no other tensor.
class SafetensorsFile {
 public:
  // Memory-maps (read-only) and validates the whole header before returning. Every error names the file
  // path (and the tensor when there is one), what was expected and what was found.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in data-offset order
  const SafetensorsEntry* find(const std::string& name) const;               // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Start of the entry's bytes; not necessarily aligned for its dtype (read through memcpy).
  const std::byte* data(const SafetensorsEntry& entry) const;

  // Copies tensor `name` into `out` as float32, converting from F32, BF16, F16 or F64. Errors (naming file
  // and tensor, expected vs found) if the tensor is missing, or its shape differs from `expected_shape`.
  void read_f32(const std::string& name, const std::vector<int64_t>& expected_shape, float* out) const;
  // Same for int32 from I32 or I64 (every I64 value is range-checked).
  void read_i32(const std::string& name, const std::vector<int64_t>& expected_shape, int32_t* out) const;

 private:
  SafetensorsFile() = default;
  void validate_header(const char* header, uint64_t header_bytes);
  const SafetensorsEntry& checked_entry(const std::string& name, const std::vector<int64_t>& expected_shape,
                                        const std::vector<std::string>& accepted_dtypes) const;

  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;  // name -> position in entries_
  std::map<std::string, std::string> metadata_;
  void* map_ = nullptr;  // the whole file
  size_t map_bytes_ = 0;
  const std::byte* data_section_ = nullptr;
  uint64_t data_bytes_ = 0;
};

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "I32", "U8", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;  // shape.product() x dtype size bytes
};

// Writes a complete file at `path` (tensors in the given order, header padded to 8, __metadata__ if
// non-empty) through a DurableFile (core/durable_file.h): the file appears whole or not at all; on any
// failure (e.g. ENOSPC, EFBIG under a file-size limit) the partial file is removed and a MeshError names the
// path and the OS error (strerror).
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

// Bytes per element of a safetensors dtype name; 0 for unknown names and for sub-byte types (F4, F6_*).
size_t safetensors_dtype_bytes(const std::string& dtype);

}  // namespace meshtrain
