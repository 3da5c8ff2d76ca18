#include "meshtrain/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <utility>

#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/tensor.h"

namespace meshtrain {
namespace {

// The format is little-endian and we read it in place; a big-endian host would need byte swaps everywhere.
static_assert(std::endian::native == std::endian::little, "safetensors reading assumes a little-endian host");

using json = nlohmann::json;

// Real headers are a few MiB at most; the cap bounds what a corrupt length field can make us parse.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
// A valid header nests 3 deep (object, entry, shape array). The cap stops a header of '[[[[...' from building
// millions of nested values before we get to reject it.
constexpr size_t kMaxJsonDepth = 64;
constexpr const char* kKnownDtypes =
    "BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, "
    "I64, U64, F64 or C64";

std::string os_error(int err) {
  return std::system_category().message(err);
}

// A JSON value as it appears in the file, shortened so a huge value cannot flood the message.
std::string json_text(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text + " (" + value.type_name() + ")";
}

// Reads a non-negative integer that must fit in `limit`; otherwise fails describing `what`.
uint64_t json_count(const json& value, uint64_t limit, const std::string& where, const std::string& what) {
  if (!value.is_number_unsigned()) {
    // nlohmann stores every non-negative integer literal as unsigned, so a signed integer here is negative.
    const char* problem = value.is_number_integer() ? "a negative number " : "";
    fail(where, what + " as a non-negative integer", problem + json_text(value));
  }
  const uint64_t count = value.get<uint64_t>();
  if (count > limit) fail(where, what + " at most " + std::to_string(limit), std::to_string(count));
  return count;
}

// Multiplies without wrapping; false on overflow.
bool checked_mul(uint64_t a, uint64_t b, uint64_t& out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return false;
  out = a * b;
  return true;
}

// Number of elements and bytes of a shape, or fails if either does not fit in 64 bits (int64 for elements,
// since the API speaks int64_t).
uint64_t shape_bytes(const std::vector<int64_t>& shape, size_t element_bytes, const std::string& where) {
  // Any zero dimension makes the tensor empty regardless of how large the other dimensions are.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  uint64_t elements = 1, bytes = 0;
  for (int64_t dim : shape) {
    if (!checked_mul(elements, static_cast<uint64_t>(dim), elements) ||
        elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(where, "a shape whose element count fits in 64 bits",
           "shape " + dims_text(shape) + " (overflows)");
    }
  }
  if (!checked_mul(elements, element_bytes, bytes)) {
    fail(where, "a tensor whose byte size fits in 64 bits", "shape " + dims_text(shape) + " (overflows)");
  }
  return bytes;
}

int64_t element_count(const std::vector<int64_t>& shape) {
  // A zero anywhere makes the product 0 even where the other dimensions' product would overflow.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;  // validated by shape_bytes when the file was opened
  return count;
}

template <class T>
T load(const std::byte* src, int64_t index) {
  T value;
  std::memcpy(&value, src + index * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return value;
}

float f16_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float32.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));         // rebias 15 -> 127
}

uint16_t float_to_f16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: quiet, with the top payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // 65520 (largest half 65504 plus half its ulp) and above round to inf; the tie goes up since 65504 is odd.
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (magnitude >= 0x38800000u) {  // normal in half (>= 2^-14): rebias 127 -> 15, round 23 -> 10 bits
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - (uint32_t{112} << 23)) >> 13));
  }
  // Subnormal in half: the value in units of 2^-24 is mantissa * 2^(exponent - 126), rounded to nearest even.
  // A carry out of the top gives 0x400, the smallest normal, which is the right encoding.
  const uint32_t exponent = magnitude >> 23;
  if (exponent < 102) return sign;  // below 2^-25: rounds to zero (float subnormals included)
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // 14..24
  uint32_t units = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (units & 1u) != 0)) ++units;
  return static_cast<uint16_t>(sign | units);
}

// `count` float32 values as `dtype` (F32, F64, BF16 or F16) into `out`.
void encode_f32(const std::string& dtype, const float* in, int64_t count, std::byte* out) {
  if (dtype == "F32") {
    std::memcpy(out, in, static_cast<size_t>(count) * sizeof(float));
  } else if (dtype == "F64") {
    for (int64_t i = 0; i < count; ++i) {
      const auto value = static_cast<double>(in[i]);
      std::memcpy(out + i * 8, &value, 8);
    }
  } else {
    const bool bf16 = dtype == "BF16";
    MT_CHECK(bf16 || dtype == "F16", "unhandled dtype " + dtype);
    for (int64_t i = 0; i < count; ++i) {
      const uint16_t half = bf16 ? bfloat16_from_float(in[i]) : float_to_f16(in[i]);
      std::memcpy(out + i * 2, &half, 2);
    }
  }
}

// Checks that `blocks` runs of `block` elements, run b starting at element start + b * stride, lie inside a
// tensor of `count` elements (`where` names it); returns the number of elements the runs hold. Callers pass
// geometry they computed, so a bad one is a bug, not a user error.
int64_t checked_runs(const std::string& where, int64_t count, int64_t start, int64_t blocks, int64_t block,
                     int64_t stride) {
  const auto geometry = [&] {
    return where + ": start " + std::to_string(start) + ", " + std::to_string(blocks) + " runs of " +
           std::to_string(block) + " every " + std::to_string(stride) + " elements, in a tensor of " +
           std::to_string(count) + " elements";
  };
  MT_CHECK(start >= 0 && blocks >= 0 && block >= 0 && stride >= 0, geometry());
  int64_t total = 0;
  MT_CHECK(!__builtin_mul_overflow(blocks, block, &total), geometry());
  if (total == 0) return 0;
  int64_t end = 0;  // one past the last run's last element
  const bool overflow = __builtin_mul_overflow(blocks - 1, stride, &end) ||
                        __builtin_add_overflow(end, start, &end) || __builtin_add_overflow(end, block, &end);
  MT_CHECK(!overflow && end <= count, geometry());
  return total;
}

// Records duplicate keys while nlohmann parses (its DOM silently keeps the last of duplicate keys), and
// aborts on absurd nesting.
class HeaderParseWatcher {
 public:
  struct TooDeep {};

  bool on_event(json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        if (stack_.size() >= kMaxJsonDepth) throw TooDeep{};
        std::string owner;
        if (!stack_.empty()) owner = stack_.back().is_object ? stack_.back().last_key : stack_.back().owner;
        stack_.push_back(Frame{event == json::parse_event_t::object_start, {}, {}, std::move(owner)});
        break;
      }
      case json::parse_event_t::key: {
        Frame& frame = stack_.back();
        const auto& key = parsed.get_ref<const std::string&>();
        if (!frame.keys.insert(key).second && duplicate_.empty()) {
          if (stack_.size() > 1) {
            duplicate_ = "key '" + key + "' twice in the entry for '" + frame.owner + "'";
          } else if (key == "__metadata__") {
            duplicate_ = "'__metadata__' twice";
          } else {
            duplicate_ = "tensor name '" + key + "' twice";
          }
        }
        frame.last_key = key;
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        stack_.pop_back();
        break;
      case json::parse_event_t::value:
        break;
    }
    return true;
  }

  const std::string& duplicate() const { return duplicate_; }

 private:
  struct Frame {
    bool is_object;
    std::set<std::string> keys;
    std::string last_key;
    std::string owner;  // key this container sits under (the tensor name for an entry), for messages
  };
  std::vector<Frame> stack_;
  std::string duplicate_;
};

// Closes a file descriptor on every path out of a function.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

size_t safetensors_dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t, std::less<>> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8},     {"C64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

// ---------------------------------------------------------------------------------------------------------------
// Reader

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept {
  *this = std::move(other);
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
    path_ = std::move(other.path_);
    entries_ = std::move(other.entries_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    data_section_ = std::exchange(other.data_section_, nullptr);
    data_bytes_ = std::exchange(other.data_bytes_, 0);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;  // owns the mapping from here on, so every failure below unmaps
  file.path_ = path;

  FdGuard fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail(path, "a readable safetensors file", "open failed: " + os_error(errno));
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0)
    fail(path, "a file whose size can be read", "fstat failed: " + os_error(errno));
  if (!S_ISREG(info.st_mode))
    fail(path, "a regular file", S_ISDIR(info.st_mode) ? "a directory" : "a special file");
  const uint64_t file_bytes = static_cast<uint64_t>(info.st_size);
  if (file_bytes < 8) {
    fail(path, "a safetensors file (at least 8 bytes: the header length)",
         std::to_string(file_bytes) + " bytes", "the file is empty or truncated; re-download or re-save it");
  }

  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) fail(path, "a file that can be memory-mapped", "mmap failed: " + os_error(errno));
  file.map_ = map;
  file.map_bytes_ = file_bytes;
  const auto* bytes = static_cast<const char*>(map);

  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes, sizeof(header_bytes));
  if (header_bytes > file_bytes - 8) {
    fail(path,
         "a header length (first 8 bytes, little-endian) of at most " + std::to_string(file_bytes - 8) +
             " (file size - 8)",
         std::to_string(header_bytes), "the file is truncated or not a safetensors file");
  }
  if (header_bytes > kMaxHeaderBytes) {
    fail(path, "a header length of at most 100 MiB", std::to_string(header_bytes) + " bytes",
         "the file is corrupt or not a safetensors file");
  }
  file.data_section_ = reinterpret_cast<const std::byte*>(bytes + 8 + header_bytes);
  file.data_bytes_ = file_bytes - 8 - header_bytes;
  file.validate_header(bytes + 8, header_bytes);
  return file;
}

void SafetensorsFile::validate_header(const char* header, uint64_t header_bytes) {
  HeaderParseWatcher watcher;
  json root;
  try {
    root = json::parse(
        header, header + header_bytes,
        [&watcher](int, json::parse_event_t event, json& parsed) { return watcher.on_event(event, parsed); });
  } catch (const json::exception& error) {
    fail(path_, "a header of valid UTF-8 JSON", error.what(),
         "the file is corrupt or not a safetensors file");
  } catch (const HeaderParseWatcher::TooDeep&) {
    fail(path_, "a header JSON nested at most " + std::to_string(kMaxJsonDepth) + " levels deep",
         "deeper nesting", "the file is corrupt or not a safetensors file");
  }
  if (!root.is_object()) {
    fail(path_, "a header that is a JSON object {\"name\": {...}, ...}", json_text(root));
  }
  if (!watcher.duplicate().empty()) {
    fail(path_, "each header key once", watcher.duplicate(), "the file was written by a broken writer");
  }

  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      const std::string where = path_ + ": __metadata__";
      if (!value.is_object()) fail(where, "an object of string -> string", json_text(value));
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) fail(where, "string values", "key '" + key + "' = " + json_text(text));
        metadata_[key] = text.get<std::string>();
      }
      continue;
    }

    const std::string where = tensor_where(path_, name);
    if (!value.is_object()) fail(where, "an object with dtype, shape and data_offsets", json_text(value));
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(field)) {
        fail(where, std::string("a '") + field + "' field (entries need dtype, shape and data_offsets)",
             "an entry without it: " + json_text(value));
      }
    }

    SafetensorsEntry entry;
    entry.name = name;
    const json& dtype = value["dtype"];
    if (!dtype.is_string()) fail(where, std::string("dtype ") + kKnownDtypes, json_text(dtype));
    entry.dtype = dtype.get<std::string>();
    const size_t element_bytes = safetensors_dtype_bytes(entry.dtype);
    if (element_bytes == 0) fail(where, std::string("dtype ") + kKnownDtypes, "dtype '" + entry.dtype + "'");

    const json& shape = value["shape"];
    if (!shape.is_array()) fail(where, "shape as an array of non-negative integers", json_text(shape));
    for (size_t i = 0; i < shape.size(); ++i) {
      const uint64_t dim =
          json_count(shape[i], static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), where,
                     "shape dimension " + std::to_string(i) + " of " + json_text(shape));
      entry.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint64_t expected_bytes = shape_bytes(entry.shape, element_bytes, where);

    const json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) {
      fail(where, "data_offsets as [begin, end]", json_text(offsets));
    }
    const uint64_t limit = std::numeric_limits<uint64_t>::max();
    entry.begin = json_count(offsets[0], limit, where, "data_offsets begin");
    entry.end = json_count(offsets[1], limit, where, "data_offsets end");
    const std::string range = "[" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + ")";
    if (entry.begin > entry.end) fail(where, "data_offsets with begin <= end", range);
    if (entry.end > data_bytes_) {
      fail(where, "data_offsets within the data section of " + std::to_string(data_bytes_) + " bytes",
           "data_offsets " + range, "the file is truncated; re-download or re-save it");
    }
    if (entry.end - entry.begin != expected_bytes) {
      fail(where,
           std::to_string(expected_bytes) + " bytes (shape " + dims_text(entry.shape) + " x " +
               std::to_string(element_bytes) + "-byte " + entry.dtype + ")",
           std::to_string(entry.end - entry.begin) + " bytes at data_offsets " + range);
    }
    entries_.push_back(std::move(entry));
  }

  std::sort(entries_.begin(), entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  // Gaps between tensors are legal here (the reference Rust reader rejects them); overlaps never are.
  const SafetensorsEntry* furthest = nullptr;  // non-empty entry reaching furthest into the data so far
  for (const SafetensorsEntry& entry : entries_) {
    if (entry.begin == entry.end) continue;  // empty tensors occupy no bytes
    if (furthest != nullptr && entry.begin < furthest->end) {
      fail(path_, "tensors whose byte ranges do not overlap",
           "'" + furthest->name + "' [" + std::to_string(furthest->begin) + ", " +
               std::to_string(furthest->end) + ") overlaps '" + entry.name + "' [" +
               std::to_string(entry.begin) + ", " + std::to_string(entry.end) + ")",
           "the file was written by a broken writer");
    }
    if (furthest == nullptr || entry.end > furthest->end) furthest = &entry;
  }
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const std::byte* SafetensorsFile::data(const SafetensorsEntry& entry) const {
  MT_CHECK(entry.begin <= entry.end && entry.end <= data_bytes_,
           "entry '" + entry.name + "' is not from " + path_);
  return data_section_ + entry.begin;
}

const SafetensorsEntry& SafetensorsFile::checked_entry(
    const std::string& name, const std::vector<int64_t>& expected_shape,
    const std::vector<std::string>& accepted_dtypes) const {
  const std::string where = tensor_where(path_, name);
  const SafetensorsEntry* entry = find(name);
  if (entry == nullptr) {
    std::string found = "no such tensor among the file's " + std::to_string(entries_.size()) + " tensors";
    fail(where, "a tensor of shape " + dims_text(expected_shape), found,
         "check that the checkpoint matches the model configuration");
  }
  if (entry->shape != expected_shape) {
    fail(where, "shape " + dims_text(expected_shape), "shape " + dims_text(entry->shape),
         "check that the checkpoint matches the model configuration");
  }
  if (std::find(accepted_dtypes.begin(), accepted_dtypes.end(), entry->dtype) == accepted_dtypes.end()) {
    std::string accepted;
    for (size_t i = 0; i < accepted_dtypes.size(); ++i) {
      accepted += (i == 0 ? "" : i + 1 == accepted_dtypes.size() ? " or " : ", ") + accepted_dtypes[i];
    }
    fail(where, "dtype " + accepted, "dtype " + entry->dtype);
  }
  return *entry;
}

void SafetensorsFile::read_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                               float* out) const {
  // The count comes from the file's validated shape (the expected one may be anything until compared).
  const int64_t count =
      element_count(checked_entry(name, expected_shape, {"F32", "BF16", "F16", "F64"}).shape);
  read_f32_blocks(name, expected_shape, 0, 1, count, count, out);
}

void SafetensorsFile::read_f32_blocks(const std::string& name, const std::vector<int64_t>& expected_shape,
                                      int64_t start, int64_t blocks, int64_t block, int64_t stride,
                                      float* out) const {
  const SafetensorsEntry& entry = checked_entry(name, expected_shape, {"F32", "BF16", "F16", "F64"});
  const int64_t total =
      checked_runs(tensor_where(path_, name), element_count(entry.shape), start, blocks, block, stride);
  MT_CHECK(out != nullptr || total == 0, "read_f32_blocks into a null buffer");
  if (total == 0) return;
  if (stride == block) {  // back-to-back runs: one run
    block = total;
    blocks = 1;
  }
  const std::byte* src = data(entry);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t first = start + b * stride;
    float* dst = out + b * block;
    if (entry.dtype == "F32") {
      std::memcpy(dst, src + first * 4, static_cast<size_t>(block) * sizeof(float));
    } else if (entry.dtype == "BF16") {
      for (int64_t i = 0; i < block; ++i) dst[i] = float_from_bfloat16(load<uint16_t>(src, first + i));
    } else if (entry.dtype == "F16") {
      for (int64_t i = 0; i < block; ++i) dst[i] = f16_to_float(load<uint16_t>(src, first + i));
    } else {
      MT_CHECK(entry.dtype == "F64", "unhandled dtype " + entry.dtype);
      for (int64_t i = 0; i < block; ++i) {
        const double value = load<double>(src, first + i);
        // Converting a finite double beyond float range is undefined behaviour; it would be garbage weights
        // anyway.
        if (std::isfinite(value) && std::fabs(value) > FLT_MAX) {
          fail(tensor_where(path_, name), "F64 values within float32 range (|x| <= 3.4e38)",
               to_text(value) + " at element " + std::to_string(first + i));
        }
        dst[i] = static_cast<float>(value);
      }
    }
  }
}

void SafetensorsFile::read_i32(const std::string& name, const std::vector<int64_t>& expected_shape,
                               int32_t* out) const {
  const SafetensorsEntry& entry = checked_entry(name, expected_shape, {"I32", "I64"});
  const int64_t count = element_count(entry.shape);
  MT_CHECK(out != nullptr || count == 0, "read_i32 into a null buffer");
  const std::byte* src = data(entry);
  if (entry.dtype == "I32") {
    if (count > 0) std::memcpy(out, src, static_cast<size_t>(count) * sizeof(int32_t));
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    const int64_t value = load<int64_t>(src, i);
    if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
      fail(tensor_where(path_, name), "I64 values within int32 range",
           std::to_string(value) + " at element " + std::to_string(i));
    }
    out[i] = static_cast<int32_t>(value);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Writers

uint64_t safetensors_tensor_bytes(const std::string& path, const SafetensorsTensorSpec& tensor) {
  const std::string where = tensor_where(path, tensor.name);
  if (tensor.name == "__metadata__") {
    fail(where, "a tensor name other than the reserved '__metadata__'", "'__metadata__'");
  }
  const size_t element_bytes = safetensors_dtype_bytes(tensor.dtype);
  if (element_bytes == 0) fail(where, std::string("dtype ") + kKnownDtypes, "dtype '" + tensor.dtype + "'");
  for (int64_t dim : tensor.shape) {
    if (dim < 0) fail(where, "non-negative dimensions", "shape " + dims_text(tensor.shape));
  }
  return shape_bytes(tensor.shape, element_bytes, where);
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<SafetensorsTensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)) {
  // Everything that can be wrong with the inputs is checked before the file is created.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (SafetensorsTensorSpec& tensor : tensors) {
    const uint64_t bytes = safetensors_tensor_bytes(path_, tensor);
    if (!index_.emplace(tensor.name, entries_.size()).second) {
      fail(tensor_where(path_, tensor.name), "unique tensor names", "the name twice in the tensor list");
    }
    if (bytes > std::numeric_limits<uint64_t>::max() - offset) {
      fail(path_, "a total size that fits in 64 bits", "tensors summing past 2^64 bytes");
    }
    header[tensor.name] = {
        {"dtype", tensor.dtype}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + bytes}}};
    entries_.push_back(SafetensorsEntry{std::move(tensor.name), std::move(tensor.dtype),
                                        std::move(tensor.shape), offset, offset + bytes});
    offset += bytes;
  }
  written_.assign(entries_.size(), 0);
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& error) {
    fail(path_, "tensor names and metadata that are valid UTF-8", error.what());
  }
  // Padding keeps the data section 8-byte aligned in memory maps, as other writers do.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_bytes = header_text.size();
  std::string prefix(sizeof(header_bytes), '\0');
  std::memcpy(prefix.data(), &header_bytes, sizeof(header_bytes));
  header_text.insert(0, prefix);
  data_start_ = header_text.size();

  file_ = std::make_unique<DurableFile>(path_);
  file_->write_at(header_text.data(), header_text.size(), 0);
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept = default;
SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&& other) noexcept = default;
SafetensorsWriter::~SafetensorsWriter() = default;  // DurableFile's destructor removes an uncommitted file

const SafetensorsEntry* SafetensorsWriter::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

size_t SafetensorsWriter::checked_index(const std::string& name) const {
  MT_CHECK(file_ != nullptr, "write to " + path_ + " after commit");
  const auto it = index_.find(name);
  if (it == index_.end()) {
    fail(tensor_where(path_, name),
         "one of the " + std::to_string(entries_.size()) + " tensors the file was laid out with",
         "no such tensor", "declare every tensor when making the writer");
  }
  return it->second;
}

void SafetensorsWriter::write_bytes(const void* data, size_t size, uint64_t offset) {
  if (size > 0) file_->write_at(data, size, data_start_ + offset);
}

void SafetensorsWriter::write_f32(const std::string& name, int64_t start, int64_t blocks, int64_t block,
                                  int64_t stride, const float* data) {
  const size_t index = checked_index(name);
  const SafetensorsEntry& entry = entries_[index];
  const std::string where = tensor_where(path_, name);
  if (entry.dtype != "F32" && entry.dtype != "BF16" && entry.dtype != "F16" && entry.dtype != "F64") {
    fail(where, "a tensor of dtype F32, BF16, F16 or F64 to write float32 values into",
         "dtype " + entry.dtype, "write it whole in its own dtype with write_raw");
  }
  const int64_t total = checked_runs(where, element_count(entry.shape), start, blocks, block, stride);
  // Runs that overlap each other would write some elements twice; the count could not tell.
  MT_CHECK(blocks <= 1 || stride >= block, where + ": write_f32 runs overlap (stride < block)");
  MT_CHECK(data != nullptr || total == 0, where + ": write_f32 from a null buffer");
  written_[index] += total;
  if (total == 0) return;
  if (stride == block) {  // back-to-back runs: one run
    block = total;
    blocks = 1;
  }
  const uint64_t element_bytes = safetensors_dtype_bytes(entry.dtype);
  const auto offset_of = [&](int64_t element) {  // byte offset in the data section
    return entry.begin + static_cast<uint64_t>(element) * element_bytes;
  };
  if (entry.dtype == "F32") {  // already in the file's form: no buffer needed
    for (int64_t b = 0; b < blocks; ++b) {
      write_bytes(data + b * block, static_cast<size_t>(block) * sizeof(float),
                  offset_of(start + b * stride));
    }
    return;
  }
  // Conversion goes through a buffer of at most kBufferBytes, never a copy of the whole tensor.
  constexpr uint64_t kBufferBytes = uint64_t{4} << 20;
  const int64_t chunk = std::min(static_cast<int64_t>(kBufferBytes / element_bytes), block);
  std::vector<std::byte> buffer(static_cast<size_t>(chunk) * element_bytes);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t done = 0; done < block; done += chunk) {
      const int64_t count = std::min(chunk, block - done);
      encode_f32(entry.dtype, data + b * block + done, count, buffer.data());
      write_bytes(buffer.data(), static_cast<size_t>(count) * element_bytes,
                  offset_of(start + b * stride + done));
    }
  }
}

void SafetensorsWriter::write_raw(const std::string& name, const void* data) {
  const size_t index = checked_index(name);
  const SafetensorsEntry& entry = entries_[index];
  const uint64_t bytes = entry.end - entry.begin;
  MT_CHECK(data != nullptr || bytes == 0, tensor_where(path_, name) + ": write_raw from a null buffer");
  write_bytes(data, bytes, entry.begin);
  written_[index] += element_count(entry.shape);
}

void SafetensorsWriter::check_complete() const {
  for (size_t i = 0; i < entries_.size(); ++i) {
    const int64_t count = element_count(entries_[i].shape);
    if (written_[i] != count) {
      fail(tensor_where(path_, entries_[i].name),
           "all " + std::to_string(count) + " elements written before commit",
           std::to_string(written_[i]) + " of " + std::to_string(count) + " elements written" +
               (written_[i] > count ? " (some more than once)" : ""),
           "write every element of every tensor exactly once; nothing was published");
    }
  }
}

void SafetensorsWriter::commit() {
  MT_CHECK(file_ != nullptr, path_ + " committed twice");
  check_complete();
  file_->commit();
  file_.reset();
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(tensors.size());
  for (const SafetensorsTensor& tensor : tensors) specs.push_back({tensor.name, tensor.dtype, tensor.shape});
  SafetensorsWriter writer(path, std::move(specs), metadata);
  for (const SafetensorsTensor& tensor : tensors) writer.write_raw(tensor.name, tensor.data);
  writer.commit();
}

}  // namespace meshtrain
