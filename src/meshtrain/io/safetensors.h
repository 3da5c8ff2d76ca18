// Reading and writing Hugging Face safetensors files: a validated, memory-mapped reader (with conversion to
// float32 / int32 for loading weights, whole or in strided runs) and writers that check every write and never
// leave a partial file, one of them taking a tensor in pieces for checkpoints larger than memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
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
  // Part of tensor `name` as float32 (same checks and conversions as read_f32): `blocks` runs of `block`
  // consecutive elements, run b starting at element start + b * stride of the flattened tensor, packed into
  // `out` (blocks * block floats). One layer l of a stacked [X, L, Y] tensor is start = l * Y, blocks = X,
  // block = Y, stride = L * Y. A run outside the tensor is a bug in the caller (MT_CHECK).
  void read_f32_blocks(const std::string& name, const std::vector<int64_t>& expected_shape, int64_t start,
                       int64_t blocks, int64_t block, int64_t stride, float* out) const;
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
// path and the OS error (strerror). A SafetensorsWriter given each tensor whole.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

// A tensor of a file still to be written: its data comes later, in pieces.
struct SafetensorsTensorSpec {
  std::string name;
  std::string dtype;  // "F32", "BF16", "I32", "U8", ...
  std::vector<int64_t> shape;
};

// Bytes tensor `tensor` takes in a file at `path`; fails naming the path and tensor if it cannot be written
// (the reserved name '__metadata__', an unknown dtype, a negative dimension, a size past 64 bits).
uint64_t safetensors_tensor_bytes(const std::string& path, const SafetensorsTensorSpec& tensor);

class DurableFile;

// A safetensors file written in pieces, for tensors too large to hold at once. The constructor checks the
// tensor list, lays the file out exactly as write_safetensors does (tensors in the given order) and writes
// the header; each tensor's elements then arrive in any order through positional writes. commit() checks
// that every element of every tensor was written once and publishes the file atomically; a writer destroyed
// without commit leaves nothing behind (and any earlier file at the path untouched). I/O errors (ENOSPC,
// EFBIG, permissions) name the path and the OS error. Not thread-safe.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<SafetensorsTensorSpec> tensors,
                    const std::map<std::string, std::string>& metadata);
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&& other) noexcept;
  ~SafetensorsWriter();

  // `blocks` runs of `block` elements of tensor `name` (run b starts at element start + b * stride, the
  // geometry of read_f32_blocks), taken packed from `data` and converted from float32 to the tensor's dtype:
  // F32 and F64 exactly, BF16 and F16 rounded to nearest even (F16 overflows to inf and rounds subnormals
  // exactly; NaN stays a quiet NaN). Converts through a bounded buffer, never a copy of the whole tensor.
  void write_f32(const std::string& name, int64_t start, int64_t blocks, int64_t block, int64_t stride,
                 const float* data);
  // The whole tensor `name`, already in its dtype (element count x dtype size bytes).
  void write_raw(const std::string& name, const void* data);
  // Fails (naming the file, the tensor, and how many of its elements were written) unless every tensor has
  // had exactly its element count written; overlapping and missing writes both show in the count.
  void check_complete() const;
  // check_complete(), then fsync and rename into place (DurableFile::commit).
  void commit();

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in file order
  const SafetensorsEntry* find(const std::string& name) const;               // nullptr if absent
  uint64_t data_start() const { return data_start_; }  // file offset of the data section (entries' begin)

 private:
  size_t checked_index(const std::string& name) const;
  void write_bytes(const void* data, size_t size, uint64_t offset);

  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;  // name -> position in entries_
  std::vector<int64_t> written_;         // elements written so far, per entry
  uint64_t data_start_ = 0;              // file offset of the data section
  std::unique_ptr<DurableFile> file_;    // null once committed
};

// Bytes per element of a safetensors dtype name; 0 for unknown names and for sub-byte types (F4, F6_*).
size_t safetensors_dtype_bytes(const std::string& dtype);

}  // namespace meshtrain
