// Tests for the safetensors reader and writers: round trips, strided reads, dtype conversion both ways, files
// written in pieces, and one test per malformed input the reader must reject with a MeshError that names the
// file and the problem.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "error_text.h"
#include "meshtrain/core/error.h"
#include "meshtrain/io/safetensors.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

uint16_t bf16_bits(float value) {
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(value) >> 16);
}

std::string le64(uint64_t value) {
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &value, 8);
  return bytes;
}

template <class T>
std::string raw_bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("meshtrain_safetensors_" + std::to_string(::getpid()) + "_" + std::string(info->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write_bytes(const std::string& bytes, const std::string& name = "bad.safetensors") const {
    const std::string file = path(name);
    std::ofstream out(file, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return file;
  }

  // A file with the given header text (unpadded) followed by `data`.
  std::string write_raw(const std::string& header, const std::string& data = "",
                        const std::string& name = "bad.safetensors") const {
    return write_bytes(le64(header.size()) + header + data, name);
  }

  // open() must throw a MeshError mentioning the file path and every needle.
  static void expect_open_error(const std::string& file, const std::vector<std::string>& needles) {
    try {
      SafetensorsFile::open(file);
      ADD_FAILURE() << "open(" << file << ") did not throw";
    } catch (const MeshError& error) {
      const std::string message = error.what();
      EXPECT_TRUE(contains(message, file)) << message;
      for (const std::string& needle : needles)
        EXPECT_TRUE(contains(message, needle)) << "'" << needle << "' not in: " << message;
    }
  }

  void expect_header_error(const std::string& header, const std::vector<std::string>& needles,
                           const std::string& data = std::string(64, '\0')) const {
    expect_open_error(write_raw(header, data), needles);
  }

  fs::path dir_;
};

// ---------------------------------------------------------------------------------------------------------------
// Round trips and conversion

TEST_F(SafetensorsTest, RoundTripKeepsDtypesShapesBytesOrderAndMetadata) {
  const std::vector<float> weights = {1.5f, -2.0f, 3.25f, 0.0f, -0.5f, 7.0f};
  const std::vector<uint16_t> halves = {bf16_bits(1.0f), bf16_bits(-2.5f), bf16_bits(3.140625f), 0};
  const std::vector<int32_t> ids = {7, -3, 2147483647};
  const std::vector<uint8_t> mask = {0, 1, 1, 0, 255};
  const float scalar = 42.0f;
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "12"}, {"note", "ünïcode"}};
  const std::string file = path("model.safetensors");
  write_safetensors(file,
                    {{"w", "F32", {2, 3}, weights.data()},
                     {"h", "BF16", {4}, halves.data()},
                     {"ids", "I32", {3}, ids.data()},
                     {"mask", "U8", {5}, mask.data()},
                     {"empty", "F32", {0}, nullptr},
                     {"scalar", "F32", {}, &scalar}},
                    metadata);

  std::ifstream raw(file, std::ios::binary);
  uint64_t header_bytes = 0;
  raw.read(reinterpret_cast<char*>(&header_bytes), 8);
  EXPECT_EQ(header_bytes % 8, 0u) << "header must be padded to a multiple of 8";

  const SafetensorsFile st = SafetensorsFile::open(file);
  EXPECT_EQ(st.path(), file);
  EXPECT_EQ(st.metadata(), metadata);
  const std::vector<std::string> names = {"w", "h", "ids", "mask", "empty", "scalar"};
  const std::vector<std::string> dtypes = {"F32", "BF16", "I32", "U8", "F32", "F32"};
  const std::vector<std::vector<int64_t>> shapes = {{2, 3}, {4}, {3}, {5}, {0}, {}};
  ASSERT_EQ(st.entries().size(), names.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const SafetensorsEntry& entry = st.entries()[i];
    EXPECT_EQ(entry.name, names[i]);
    EXPECT_EQ(entry.dtype, dtypes[i]);
    EXPECT_EQ(entry.shape, shapes[i]);
    EXPECT_EQ(entry.begin, offset) << "tensors are written contiguously in the given order";
    offset = entry.end;
    EXPECT_EQ(st.find(names[i]), &entry);
  }
  EXPECT_EQ(fs::file_size(file), 8 + header_bytes + offset);
  EXPECT_EQ(st.find("missing"), nullptr);

  auto bytes_of = [&](const std::string& name) {
    const SafetensorsEntry* entry = st.find(name);
    return std::string(reinterpret_cast<const char*>(st.data(*entry)), entry->end - entry->begin);
  };
  EXPECT_EQ(bytes_of("w"), raw_bytes(weights));
  EXPECT_EQ(bytes_of("h"), raw_bytes(halves));
  EXPECT_EQ(bytes_of("ids"), raw_bytes(ids));
  EXPECT_EQ(bytes_of("mask"), raw_bytes(mask));
  EXPECT_EQ(bytes_of("empty"), "");

  std::vector<float> out(6);
  st.read_f32("w", {2, 3}, out.data());
  EXPECT_EQ(out, weights);
  float scalar_out = 0.0f;
  st.read_f32("scalar", {}, &scalar_out);
  EXPECT_EQ(scalar_out, 42.0f);
  st.read_f32("empty", {0}, nullptr);  // nothing to copy
  std::vector<int32_t> ids_out(3);
  st.read_i32("ids", {3}, ids_out.data());
  EXPECT_EQ(ids_out, ids);
}

TEST_F(SafetensorsTest, WritesNoMetadataKeyWhenMetadataIsEmpty) {
  const float value = 1.0f;
  const std::string file = path("plain.safetensors");
  write_safetensors(file, {{"x", "F32", {1}, &value}}, {});
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(contains(bytes, "__metadata__"));
  EXPECT_TRUE(SafetensorsFile::open(file).metadata().empty());
}

TEST_F(SafetensorsTest, ReadF32ConvertsBf16Exactly) {
  const std::vector<uint16_t> halves = {0x3F80, 0xC020, 0x4049, 0x0000, 0x8000, 0x7F80};
  ASSERT_EQ(halves[0], bf16_bits(1.0f));
  ASSERT_EQ(halves[1], bf16_bits(-2.5f));
  ASSERT_EQ(halves[2], bf16_bits(3.140625f));
  const std::string file = path("bf16.safetensors");
  write_safetensors(file, {{"h", "BF16", {2, 3}, halves.data()}}, {});
  std::vector<float> out(6, -1.0f);
  SafetensorsFile::open(file).read_f32("h", {2, 3}, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  EXPECT_EQ(out[2], 3.140625f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_TRUE(out[4] == 0.0f && std::signbit(out[4]));
  EXPECT_EQ(out[5], std::numeric_limits<float>::infinity());
}

TEST_F(SafetensorsTest, ReadF32ConvertsF16IncludingSubnormalsAndInfinity) {
  const std::vector<uint16_t> halves = {0x3C00, 0xC100, 0x7BFF, 0x0001, 0x0200, 0x8000, 0xFC00, 0x3555};
  const std::string file = path("f16.safetensors");
  write_safetensors(file, {{"h", "F16", {8}, halves.data()}}, {});
  std::vector<float> out(8);
  SafetensorsFile::open(file).read_f32("h", {8}, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  EXPECT_EQ(out[2], 65504.0f);               // largest finite half
  EXPECT_EQ(out[3], std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(out[4], std::ldexp(1.0f, -15));  // subnormal 512 * 2^-24
  EXPECT_TRUE(out[5] == 0.0f && std::signbit(out[5]));
  EXPECT_EQ(out[6], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[7], 0.333251953125f);  // nearest half to 1/3
}

TEST_F(SafetensorsTest, ReadF32ConvertsF64AndRejectsValuesBeyondFloatRange) {
  const std::vector<double> values = {1.0, -2.5, 0.1, 1e-3};
  const double huge_value = 1e300;
  const std::string file = path("f64.safetensors");
  write_safetensors(file, {{"d", "F64", {4}, values.data()}, {"huge", "F64", {1}, &huge_value}}, {});
  const SafetensorsFile st = SafetensorsFile::open(file);
  std::vector<float> out(4);
  st.read_f32("d", {4}, out.data());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(out[i], static_cast<float>(values[i]));
  float huge = 0.0f;
  try {
    st.read_f32("huge", {1}, &huge);
    ADD_FAILURE() << "1e300 accepted as float32";
  } catch (const MeshError& error) {
    EXPECT_TRUE(contains(error.what(), file) && contains(error.what(), "'huge'")) << error.what();
    EXPECT_TRUE(contains(error.what(), "float32 range")) << error.what();
  }
}

TEST_F(SafetensorsTest, ReadsUnalignedDataFromUnpaddedHeaders) {
  // Foreign writers need not pad, so tensor data may start at any address.
  const std::vector<float> values = {1.0f, 2.0f, 3.0f};
  const std::string header = R"({"v":{"dtype":"F32","shape":[3],"data_offsets":[1,13]}})";
  ASSERT_NE(header.size() % 4, 0u);
  const std::string file = write_raw(header, "x" + raw_bytes(values), "unaligned.safetensors");
  std::vector<float> out(3);
  SafetensorsFile::open(file).read_f32("v", {3}, out.data());
  EXPECT_EQ(out, values);
}

TEST_F(SafetensorsTest, ReadI32AcceptsI64InRangeAndRejectsOutOfRange) {
  const std::vector<int64_t> small = {0, -5, 2147483647, -2147483648LL};
  const std::vector<int64_t> big = {1, 2147483648LL};
  const std::string file = path("i64.safetensors");
  write_safetensors(file, {{"small", "I64", {4}, small.data()}, {"big", "I64", {2}, big.data()}}, {});
  const SafetensorsFile st = SafetensorsFile::open(file);
  std::vector<int32_t> out(4);
  st.read_i32("small", {4}, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{0, -5, 2147483647, -2147483647 - 1}));
  try {
    st.read_i32("big", {2}, out.data());
    ADD_FAILURE() << "2^31 accepted as int32";
  } catch (const MeshError& error) {
    EXPECT_TRUE(contains(error.what(), "'big'") && contains(error.what(), "2147483648")) << error.what();
    EXPECT_TRUE(contains(error.what(), "element 1")) << error.what();
  }
}

TEST_F(SafetensorsTest, MovedFromFileReleasesNothingTwice) {
  const float value = 3.0f;
  const std::string file = path("move.safetensors");
  write_safetensors(file, {{"x", "F32", {1}, &value}}, {});
  SafetensorsFile first = SafetensorsFile::open(file);
  SafetensorsFile second = std::move(first);
  SafetensorsFile third = SafetensorsFile::open(file);
  third = std::move(second);
  float out = 0.0f;
  third.read_f32("x", {1}, &out);
  EXPECT_EQ(out, 3.0f);
}

// ---------------------------------------------------------------------------------------------------------------
// Read errors that name file, tensor, expected and found

class SafetensorsReadErrorTest : public SafetensorsTest {
 protected:
  void SetUp() override {
    SafetensorsTest::SetUp();
    file_ = path("weights.safetensors");
    write_safetensors(file_, {{"layer.w", "F32", {2, 3}, values_.data()}, {"ids", "I32", {6}, ids_.data()}},
                      {});
  }
  template <class Read>
  std::string error_of(Read read) {
    try {
      read(SafetensorsFile::open(file_));
    } catch (const MeshError& error) {
      return error.what();
    }
    ADD_FAILURE() << "no MeshError";
    return "";
  }
  std::string file_;
  std::vector<float> values_ = std::vector<float>(6, 1.0f);
  std::vector<int32_t> ids_ = std::vector<int32_t>(6, 1);
  std::vector<float> out_ = std::vector<float>(6);
  std::vector<int32_t> ids_out_ = std::vector<int32_t>(6);
};

TEST_F(SafetensorsReadErrorTest, ShapeMismatchNamesFileTensorAndBothShapes) {
  const std::string message = error_of([&](const SafetensorsFile& st) {
    st.read_f32("layer.w", {3, 2}, out_.data());
  });
  EXPECT_TRUE(contains(message, file_)) << message;
  EXPECT_TRUE(contains(message, "'layer.w'")) << message;
  EXPECT_TRUE(contains(message, "expected shape [3, 2]")) << message;
  EXPECT_TRUE(contains(message, "found shape [2, 3]")) << message;
}

TEST_F(SafetensorsReadErrorTest, MissingTensorNamesFileAndTensor) {
  const std::string message =
      error_of([&](const SafetensorsFile& st) { st.read_f32("layer.b", {6}, out_.data()); });
  EXPECT_TRUE(contains(message, file_) && contains(message, "'layer.b'")) << message;
  EXPECT_TRUE(contains(message, "no such tensor")) << message;
}

TEST_F(SafetensorsReadErrorTest, WrongDtypeNamesAcceptedAndFoundDtypes) {
  std::string message = error_of([&](const SafetensorsFile& st) { st.read_f32("ids", {6}, out_.data()); });
  EXPECT_TRUE(contains(message, "'ids'") && contains(message, "F32, BF16, F16 or F64") &&
              contains(message, "found dtype I32"))
      << message;
  message = error_of([&](const SafetensorsFile& st) { st.read_i32("layer.w", {2, 3}, ids_out_.data()); });
  EXPECT_TRUE(contains(message, "'layer.w'") && contains(message, "I32 or I64") &&
              contains(message, "found dtype F32"))
      << message;
}

// ---------------------------------------------------------------------------------------------------------------
// Hostile files: every one must be a MeshError naming the file and the problem, never a crash

TEST_F(SafetensorsTest, RejectsMissingFileAndDirectory) {
  expect_open_error(path("absent.safetensors"), {"No such file"});
  expect_open_error(dir_.string(), {"a directory"});
}

TEST_F(SafetensorsTest, RejectsFileShorterThanEightBytes) {
  expect_open_error(write_bytes(""), {"at least 8 bytes", "0 bytes"});
  expect_open_error(write_bytes("abc"), {"at least 8 bytes", "3 bytes"});
}

TEST_F(SafetensorsTest, RejectsHeaderLengthPastEndOfFile) {
  expect_open_error(write_bytes(le64(1000) + "{}"), {"header length", "at most 2", "found 1000"});
  expect_open_error(write_bytes(le64(std::numeric_limits<uint64_t>::max()) + "{}"), {"header length"});
}

TEST_F(SafetensorsTest, RejectsHeaderLengthOver100MiB) {
  // A sparse file is big enough for the length to pass the file-size check without writing 100 MiB.
  const uint64_t header_bytes = (uint64_t{100} << 20) + 1;
  const std::string file = write_bytes(le64(header_bytes) + "{}");
  fs::resize_file(file, 8 + header_bytes + 16);
  expect_open_error(file, {"at most 100 MiB", std::to_string(header_bytes)});
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotJson) {
  expect_header_error("{\"w\": {\"dtype\": ", {"valid UTF-8 JSON", "parse error"});
  expect_header_error("", {"valid UTF-8 JSON"});
  expect_header_error("{\"\xff\": 1}", {"valid UTF-8 JSON", "UTF-8"});
  expect_header_error(std::string(100000, '['), {"nested at most"});
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotAnObject) {
  expect_header_error("[1, 2]", {"JSON object", "array"});
  expect_header_error("\"text\"", {"JSON object", "string"});
}

TEST_F(SafetensorsTest, RejectsEntryThatIsNotAnObject) {
  expect_header_error(R"({"w": 3})", {"tensor 'w'", "an object with dtype", "3 (number)"});
  expect_header_error(R"({"w": [1, 2]})", {"tensor 'w'", "an object with dtype"});
}

TEST_F(SafetensorsTest, RejectsEntryMissingAField) {
  expect_header_error(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", {"tensor 'w'", "'dtype' field"});
  expect_header_error(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", {"tensor 'w'", "'shape' field"});
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [1]}})", {"tensor 'w'", "'data_offsets' field"});
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  expect_header_error(R"({"w": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}})",
                      {"tensor 'w'", "dtype 'Q7'", "BF16"});
  expect_header_error(R"({"w": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}})",
                      {"tensor 'w'", "4 (number)"});
}

TEST_F(SafetensorsTest, RejectsNegativeOrNonIntegerDims) {
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [-2, 3], "data_offsets": [0, 4]}})",
                      {"tensor 'w'", "shape dimension 0", "non-negative integer", "negative number -2"});
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [1, 2.5], "data_offsets": [0, 4]}})",
                      {"tensor 'w'", "shape dimension 1", "2.5"});
  expect_header_error(R"({"w": {"dtype": "F32", "shape": ["4"], "data_offsets": [0, 16]}})",
                      {"tensor 'w'", "shape dimension 0", "string"});
  expect_header_error(R"({"w": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}})",
                      {"tensor 'w'", "shape as an array"});
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [9223372036854775808], "data_offsets": [0, 16]}})",
                      {"tensor 'w'", "at most 9223372036854775807"});
}

TEST_F(SafetensorsTest, RejectsShapeProductOverflow) {
  expect_header_error(
      R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 4], "data_offsets": [0, 4]}})",
      {"tensor 'w'", "element count fits in 64 bits", "overflows"});
  // 2^62 elements fit, 2^62 x 8 bytes do not.
  expect_header_error(R"({"w": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 4]}})",
                      {"tensor 'w'", "byte size fits in 64 bits"});
}

TEST_F(SafetensorsTest, RejectsMalformedDataOffsets) {
  const auto with_offsets = [](const std::string& offsets) {
    return R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": )" + offsets + "}}";
  };
  expect_header_error(with_offsets("[0]"), {"tensor 'w'", "data_offsets as [begin, end]"});
  expect_header_error(with_offsets("[0, 4, 8]"), {"tensor 'w'", "data_offsets as [begin, end]"});
  expect_header_error(with_offsets("{\"begin\": 0}"), {"tensor 'w'", "data_offsets as [begin, end]"});
  expect_header_error(with_offsets("[-4, 0]"), {"tensor 'w'", "data_offsets begin", "negative"});
  expect_header_error(with_offsets("[0, 4.0]"), {"tensor 'w'", "data_offsets end", "non-negative integer"});
  expect_header_error(with_offsets("[8, 4]"), {"tensor 'w'", "begin <= end", "[8, 4)"});
}

TEST_F(SafetensorsTest, RejectsTruncatedDataSection) {
  const std::string header = R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
  expect_header_error(header, {"tensor 'w'", "data section of 8 bytes", "[0, 16)", "truncated"},
                      std::string(8, '\0'));
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [18446744073709551612, 0]}})",
                      {"tensor 'w'", "begin <= end"});
}

TEST_F(SafetensorsTest, RejectsByteSizeThatDisagreesWithShape) {
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})",
                      {"tensor 'w'", "expected 12 bytes", "found 16 bytes"});
  expect_header_error(R"({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 16]}})",
                      {"tensor 'w'", "expected 8 bytes", "2-byte BF16"});
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  expect_header_error(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                          "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                      {"do not overlap", "'a' [0, 16)", "'b' [8, 24)"});
  // Overlap with an earlier tensor that is not the immediately preceding one.
  expect_header_error(R"({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
                          "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                          "c": {"dtype": "F32", "shape": [1], "data_offsets": [20, 24]}})",
                      {"do not overlap", "'a'"});
  expect_header_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})",
                      {"do not overlap"});
}

TEST_F(SafetensorsTest, RejectsDuplicateKeys) {
  expect_header_error(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                          "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                      {"tensor name 'w' twice"});
  expect_header_error(R"({"w": {"dtype": "F32", "dtype": "I32", "shape": [1], "data_offsets": [0, 4]}})",
                      {"key 'dtype' twice in the entry for 'w'"});
  expect_header_error(R"({"__metadata__": {"a": "1", "a": "2"}})",
                      {"key 'a' twice in the entry for '__metadata__'"});
}

TEST_F(SafetensorsTest, RejectsMetadataThatIsNotStringToString) {
  expect_header_error(R"({"__metadata__": {"format": "pt", "step": 3}})",
                      {"__metadata__", "string values", "'step'", "3 (number)"});
  expect_header_error(R"({"__metadata__": ["pt"]})", {"__metadata__", "an object of string -> string"});
}

TEST_F(SafetensorsTest, AcceptsGapsTrailingBytesAndEmptyTensorsAnywhere) {
  const std::vector<float> values = {5.0f, 6.0f};
  const std::string data = std::string(4, 'g') + raw_bytes(values) + "trailing";
  const std::string file = write_raw(R"({"v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
                                         "e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [6, 6]},
                                         "__metadata__": {}})",
                                     data, "gaps.safetensors");
  const SafetensorsFile st = SafetensorsFile::open(file);
  ASSERT_EQ(st.entries().size(), 2u);
  EXPECT_EQ(st.entries()[0].name, "v");
  EXPECT_EQ(st.entries()[1].name, "e");
  std::vector<float> out(2);
  st.read_f32("v", {2}, out.data());
  EXPECT_EQ(out, values);
}

// ---------------------------------------------------------------------------------------------------------------
// Write errors

TEST_F(SafetensorsTest, WriteFailureUnderFileSizeLimitRemovesPartialFileAndNamesOsError) {
  const std::string file = path("big.safetensors");
  const std::vector<float> values(1 << 14, 1.0f);  // 64 KiB, far past the 4 KiB limit below
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  // The limit and ignored signal stay in a child so nothing else in this process (gtest output redirected to
  // a file, say) runs under them.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);  // otherwise exceeding the limit kills the process instead of failing write()
    rlimit limit{};
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 4096;
    int code = 3;
    std::string message = "setrlimit failed";
    if (::setrlimit(RLIMIT_FSIZE, &limit) == 0) {
      try {
        write_safetensors(file, {{"w", "F32", {1 << 14}, values.data()}}, {{"step", "1"}});
        message = "no exception";
        code = 1;
      } catch (const MeshError& error) {
        message = error.what();
        code = 0;
      } catch (const std::exception& error) {
        message = std::string("not a MeshError: ") + error.what();
        code = 2;
      }
    }
    [[maybe_unused]] const ssize_t ignored = ::write(pipe_fds[1], message.data(), message.size());
    ::_exit(code);
  }
  ::close(pipe_fds[1]);
  std::string message;
  char buffer[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof(buffer))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    message.append(buffer, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "child died with signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << message;
  EXPECT_TRUE(contains(message, file)) << message;
  EXPECT_TRUE(contains(message, std::strerror(EFBIG))) << message;
  EXPECT_TRUE(contains(message, "ulimit -f")) << message;
  EXPECT_FALSE(fs::exists(file)) << "partial file left behind";
}

TEST_F(SafetensorsTest, WriteIntoMissingDirectoryNamesPathAndOsError) {
  const float value = 1.0f;
  const std::string file = path("no/such/dir/x.safetensors");
  try {
    write_safetensors(file, {{"x", "F32", {1}, &value}}, {});
    ADD_FAILURE() << "no error";
  } catch (const MeshError& error) {
    EXPECT_TRUE(contains(error.what(), file) && contains(error.what(), std::strerror(ENOENT)))
        << error.what();
  }
}

TEST_F(SafetensorsTest, WriteRejectsBadTensorListBeforeCreatingTheFile) {
  const float value = 1.0f;
  const std::string file = path("bad_input.safetensors");
  const auto expect_write_error = [&](const std::vector<SafetensorsTensor>& tensors,
                                      const std::string& needle) {
    try {
      write_safetensors(file, tensors, {});
      ADD_FAILURE() << "no error for " << needle;
    } catch (const MeshError& error) {
      EXPECT_TRUE(contains(error.what(), file) && contains(error.what(), needle)) << error.what();
    }
    EXPECT_FALSE(fs::exists(file));
  };
  expect_write_error({{"x", "F32", {1}, &value}, {"x", "F32", {1}, &value}}, "unique tensor names");
  expect_write_error({{"x", "F33", {1}, &value}}, "dtype 'F33'");
  expect_write_error({{"x", "F32", {-1}, &value}}, "non-negative dimensions");
  expect_write_error({{"__metadata__", "F32", {1}, &value}}, "reserved");
  expect_write_error({{"bad\xff", "F32", {1}, &value}}, "valid UTF-8");
}

// ---------------------------------------------------------------------------------------------------------------
// Strided block reads

TEST_F(SafetensorsTest, ReadF32BlocksMatchesTheWholeReadInEveryDtype) {
  // A stacked [X, L, Y] = [3, 4, 5] tensor of small integers (exact in every dtype), each layer read alone.
  constexpr int64_t X = 3, L = 4, Y = 5, kCount = X * L * Y;
  std::vector<float> f32(kCount);
  std::vector<uint16_t> bf16(kCount), f16(kCount);
  std::vector<double> f64(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    f32[i] = static_cast<float>(i) - 30.0f;
    bf16[i] = bf16_bits(f32[i]);
    f64[i] = f32[i];
  }
  // Halves of integers below 2048: sign, exponent 15 + floor(log2 |v|), the rest of |v| in the mantissa.
  for (int64_t i = 0; i < kCount; ++i) {
    const auto magnitude = static_cast<uint32_t>(std::fabs(f32[i]));
    uint16_t bits = f32[i] < 0 ? 0x8000 : 0;
    if (magnitude != 0) {
      const int top = std::bit_width(magnitude) - 1;
      bits = static_cast<uint16_t>(bits | ((top + 15) << 10) | ((magnitude << (10 - top)) & 0x3ff));
    }
    f16[i] = bits;
  }
  const std::string file = path("stacked.safetensors");
  const std::vector<int64_t> shape = {X, L, Y};
  write_safetensors(file,
                    {{"f32", "F32", shape, f32.data()},
                     {"bf16", "BF16", shape, bf16.data()},
                     {"f16", "F16", shape, f16.data()},
                     {"f64", "F64", shape, f64.data()}},
                    {});
  const SafetensorsFile st = SafetensorsFile::open(file);
  for (const std::string name : {"f32", "bf16", "f16", "f64"}) {
    std::vector<float> whole(kCount);
    st.read_f32(name, shape, whole.data());
    EXPECT_EQ(whole, f32) << name;
    for (int64_t l = 0; l < L; ++l) {
      std::vector<float> layer(X * Y, -1.0f);
      st.read_f32_blocks(name, shape, l * Y, X, Y, L * Y, layer.data());
      for (int64_t x = 0; x < X; ++x) {
        for (int64_t y = 0; y < Y; ++y) EXPECT_EQ(layer[x * Y + y], whole[(x * L + l) * Y + y]) << name;
      }
    }
    std::vector<float> rows(2 * L * Y);  // back-to-back runs: rows 1 and 2
    st.read_f32_blocks(name, shape, L * Y, 2, L * Y, L * Y, rows.data());
    EXPECT_TRUE(std::equal(rows.begin(), rows.end(), whole.begin() + L * Y)) << name;
  }
  std::vector<float> out(X * Y);
  // Runs past the end are the caller's bug; the name and shape are checked as read_f32 checks them.
  EXPECT_THROW(st.read_f32_blocks("f32", shape, 1, X, Y, L * Y * X, out.data()), std::logic_error);
  EXPECT_THROW(st.read_f32_blocks("f32", shape, kCount - Y + 1, 1, Y, Y, out.data()), std::logic_error);
  std::string message = testing::error_of([&] { st.read_f32_blocks("nope", shape, 0, 1, Y, Y, out.data()); });
  EXPECT_TRUE(contains(message, file) && contains(message, "'nope'") && contains(message, "no such tensor"))
      << message;
  message = testing::error_of([&] { st.read_f32_blocks("f32", {X, Y, L}, 0, 1, Y, Y, out.data()); });
  EXPECT_TRUE(contains(message, "'f32'") && contains(message, "shape [3, 5, 4]")) << message;
}

// ---------------------------------------------------------------------------------------------------------------
// SafetensorsWriter: a file in pieces

using SafetensorsWriterTest = SafetensorsTest;

// Writes float32 values given by their bits into a one-tensor file of `dtype` and returns the 16-bit codes.
std::vector<uint16_t> written_halves(const std::string& file, const std::string& dtype,
                                     const std::vector<uint32_t>& float_bits) {
  std::vector<float> values;
  for (uint32_t bits : float_bits) values.push_back(std::bit_cast<float>(bits));
  const auto count = static_cast<int64_t>(values.size());
  SafetensorsWriter writer(file, {{"h", dtype, {count}}}, {});
  writer.write_f32("h", 0, 1, count, count, values.data());
  writer.commit();
  const SafetensorsFile st = SafetensorsFile::open(file);
  std::vector<uint16_t> codes(values.size());
  std::memcpy(codes.data(), st.data(*st.find("h")), codes.size() * 2);
  return codes;
}

TEST_F(SafetensorsWriterTest, WritesBf16RoundedToNearestEvenBitExact) {
  // float32 bits -> bf16 bits, by hand.
  const std::vector<std::pair<uint32_t, uint16_t>> cases = {
      {0x3F800000, 0x3F80},  // 1.0
      {0x3F808000, 0x3F80},  // tie: stays on the even 0x3F80
      {0x3F818000, 0x3F82},  // tie: 0x3F81 is odd, goes up to even
      {0x3F808001, 0x3F81},  // just past half: rounds up
      {0x3F807FFF, 0x3F80},  // just below half: rounds down
      {0xBF808001, 0xBF81},  // negative
      {0x00012345, 0x0001},  // float subnormal
      {0x00018000, 0x0002},  // subnormal tie to even
      {0x7F7FFFFF, 0x7F80},  // FLT_MAX rounds past the largest bf16 to inf
      {0x7F800000, 0x7F80},  // inf
      {0xFF800000, 0xFF80},  // -inf
      {0x7FC00000, 0x7FC0},  // quiet NaN
      {0x7F800001, 0x7FC0},  // signalling NaN with a low payload: stays NaN (plain rounding would give inf)
      {0xFFFFFFFF, 0xFFFF},  // NaN with every bit set: no carry out
  };
  std::vector<uint32_t> inputs;
  for (const auto& [in, out] : cases) inputs.push_back(in);
  const std::string file = path("bf16.safetensors");
  const std::vector<uint16_t> codes = written_halves(file, "BF16", inputs);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(codes[i], cases[i].second) << std::hex << "float bits 0x" << cases[i].first;
  }
  // And back: bf16 is the top half of a float32, so every code reads as exactly that float.
  std::vector<float> back(cases.size());
  SafetensorsFile::open(file).read_f32("h", {static_cast<int64_t>(cases.size())}, back.data());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(back[i]), uint32_t{cases[i].second} << 16) << i;
  }
}

TEST_F(SafetensorsWriterTest, WritesF16RoundedToNearestEvenWithOverflowAndSubnormalsBitExact) {
  const float inf = std::numeric_limits<float>::infinity();
  // float32 value -> f16 bits -> the float that code reads back as, by hand.
  struct Case {
    uint32_t in;
    uint16_t code;
    float back;
  };
  const std::vector<Case> cases = {
      {0x3F800000, 0x3C00, 1.0f},
      {0x3F801000, 0x3C00, 1.0f},             // 1 + 2^-11: tie, stays even
      {0x3F803000, 0x3C02, 1.0f + 0x1p-9f},   // 1 + 3 * 2^-11: tie, 0x3C01 is odd, goes up
      {0x3F801001, 0x3C01, 1.0f + 0x1p-10f},  // just past half: rounds up
      {0x3EAAAAAB, 0x3555, 0.333251953125f},  // 1/3
      {0x477FE000, 0x7BFF, 65504.0f},         // largest half
      {0x477FEFFF, 0x7BFF, 65504.0f},         // just below 65520 still rounds down
      {0x477FF000, 0x7C00, inf},              // 65520: the tie goes up, to inf
      {0x49742400, 0x7C00, inf},              // 1e6 overflows
      {0xC788B800, 0xFC00, -inf},             // -70000
      {0x7F800000, 0x7C00, inf},              // inf
      {0xFF800000, 0xFC00, -inf},             // -inf
      {0x38800000, 0x0400, 0x1p-14f},         // smallest normal
      {0x387FE000, 0x0400, 0x1p-14f},         // 1023.5 x 2^-24: tie to even carries into the normals
      {0x38000000, 0x0200, 0x1p-15f},         // subnormal 512 x 2^-24
      {0x33800000, 0x0001, 0x1p-24f},         // smallest subnormal
      {0x33C00000, 0x0002, 0x1p-23f},         // 1.5 x 2^-24: tie, 1 is odd, goes up
      {0x34200000, 0x0002, 0x1p-23f},         // 2.5 x 2^-24: tie, stays on the even 2
      {0x33400000, 0x0001, 0x1p-24f},         // 0.75 x 2^-24 rounds up
      {0x33000000, 0x0000, 0.0f},             // 2^-25: tie, rounds to the even 0
      {0x2EDBE6FF, 0x0000, 0.0f},             // 1e-10 underflows
      {0xB3800000, 0x8001, -0x1p-24f},        // negative subnormal
      {0x80000000, 0x8000, -0.0f},            // -0
      {0x7FC00000, 0x7E00, std::nanf("")},    // quiet NaN
      {0x7F800001, 0x7E00, std::nanf("")},    // signalling NaN stays NaN
  };
  std::vector<uint32_t> inputs;
  for (const Case& c : cases) inputs.push_back(c.in);
  const std::string file = path("f16.safetensors");
  const std::vector<uint16_t> codes = written_halves(file, "F16", inputs);
  std::vector<float> back(cases.size());
  SafetensorsFile::open(file).read_f32("h", {static_cast<int64_t>(cases.size())}, back.data());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(codes[i], cases[i].code) << std::hex << "float bits 0x" << cases[i].in;
    if (std::isnan(cases[i].back)) {
      EXPECT_TRUE(std::isnan(back[i])) << i;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(cases[i].back)) << i;
    }
  }
}

TEST_F(SafetensorsWriterTest, FileWrittenInScatteredPiecesEqualsWriteSafetensorsByteForByte) {
  constexpr int64_t X = 3, L = 4, Y = 5;
  std::vector<float> stacked(X * L * Y);
  for (size_t i = 0; i < stacked.size(); ++i) stacked[i] = static_cast<float>(i) * 0.25f - 7.0f;
  const std::vector<float> small = {1.0f, -2.0f, 0.5f, 3.0f, 6.0f, -0.75f};
  std::vector<uint16_t> small_bf16;
  for (float value : small) small_bf16.push_back(bf16_bits(value));  // exact in bf16
  const std::vector<uint16_t> small_f16 = {0x3C00, 0xC000, 0x3800, 0x4200, 0x4600, 0xBA00};
  const std::vector<double> small_f64(small.begin(), small.end());
  const std::vector<int32_t> ids = {4, -1, 7, 2147483647};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};

  const std::string whole = path("whole.safetensors");
  write_safetensors(whole,
                    {{"stacked", "F32", {X, L, Y}, stacked.data()},
                     {"bf16", "BF16", {2, 3}, small_bf16.data()},
                     {"empty", "F32", {0, 4}, nullptr},
                     {"f16", "F16", {6}, small_f16.data()},
                     {"ids", "I32", {4}, ids.data()},
                     {"f64", "F64", {6}, small_f64.data()}},
                    metadata);

  const std::string pieces = path("pieces.safetensors");
  SafetensorsWriter writer(pieces,
                           {{"stacked", "F32", {X, L, Y}},
                            {"bf16", "BF16", {2, 3}},
                            {"empty", "F32", {0, 4}},
                            {"f16", "F16", {6}},
                            {"ids", "I32", {4}},
                            {"f64", "F64", {6}}},
                           metadata);
  writer.write_raw("ids", ids.data());
  for (int64_t l = L - 1; l >= 0; --l) {  // one layer at a time, last first
    std::vector<float> layer(X * Y);
    for (int64_t x = 0; x < X; ++x) {
      for (int64_t y = 0; y < Y; ++y) layer[x * Y + y] = stacked[(x * L + l) * Y + y];
    }
    writer.write_f32("stacked", l * Y, X, Y, L * Y, layer.data());
  }
  writer.write_f32("bf16", 3, 1, 3, 3, small.data() + 3);  // second row, then the first
  writer.write_f32("bf16", 0, 1, 3, 3, small.data());
  writer.write_f32("f16", 1, 3, 1, 2, std::vector<float>{small[1], small[3], small[5]}.data());  // odd, even
  writer.write_f32("f16", 0, 3, 1, 2, std::vector<float>{small[0], small[2], small[4]}.data());
  writer.write_f32("f64", 0, 2, 3, 3, small.data());
  writer.commit();

  const auto bytes_of = [](const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(bytes_of(pieces), bytes_of(whole));
  EXPECT_FALSE(bytes_of(whole).empty());
}

TEST_F(SafetensorsWriterTest, ConvertsTensorsLargerThanItsBufferInChunks) {
  const int64_t count = (int64_t{5} << 20) / 2 + 3;  // more than one 4 MiB buffer of bf16, not a multiple
  std::vector<float> values(count);
  // Exact in bf16, with a period (251) that does not divide the chunk, so a misplaced chunk would show.
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<float>(i % 251);
  const std::string file = path("large.safetensors");
  SafetensorsWriter writer(file, {{"w", "BF16", {count}}}, {});
  writer.write_f32("w", 0, 1, count, count, values.data());
  writer.commit();
  std::vector<float> back(count);
  SafetensorsFile::open(file).read_f32("w", {count}, back.data());
  EXPECT_EQ(back, values);
}

TEST_F(SafetensorsWriterTest, CommitRefusesMissingOrRepeatedWritesNamingTheTensor) {
  const std::vector<float> values(20, 1.0f);
  const std::string file = path("partial.safetensors");
  {
    SafetensorsWriter writer(file, {{"done", "F32", {4}}, {"layers.w", "BF16", {3, 4, 5}}}, {});
    writer.write_f32("done", 0, 1, 4, 4, values.data());
    writer.write_f32("layers.w", 0, 3, 5, 20, values.data());  // layer 0 only
    writer.write_f32("layers.w", 5, 3, 5, 20, values.data());  // layer 1
    const std::string message = testing::error_of([&] { writer.commit(); });
    EXPECT_TRUE(contains(message, file) && contains(message, "'layers.w'")) << message;
    EXPECT_TRUE(contains(message, "30 of 60 elements written")) << message;
  }
  EXPECT_FALSE(fs::exists(file));
  {
    SafetensorsWriter writer(file, {{"w", "F32", {2, 2}}}, {});
    writer.write_f32("w", 0, 2, 2, 2, values.data());
    writer.write_f32("w", 2, 1, 2, 2, values.data());  // row 1 again
    const std::string message = testing::error_of([&] { writer.commit(); });
    EXPECT_TRUE(contains(message, "'w'") && contains(message, "6 of 4 elements written") &&
                contains(message, "more than once"))
        << message;
  }
  EXPECT_FALSE(fs::exists(file));
}

TEST_F(SafetensorsWriterTest, AbandonedWriterLeavesNothingAndKeepsAnEarlierFile) {
  const std::vector<float> values = {1.0f, 2.0f};
  const std::string fresh = path("fresh.safetensors");
  {
    SafetensorsWriter writer(fresh, {{"w", "F32", {2}}}, {});
    writer.write_f32("w", 0, 1, 2, 2, values.data());
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "no file and no temporary left";

  const std::string earlier = path("earlier.safetensors");
  write_safetensors(earlier, {{"w", "F32", {2}, values.data()}}, {});
  {
    SafetensorsWriter writer(earlier, {{"w", "F32", {2}}}, {});
    const std::vector<float> other = {5.0f, 6.0f};
    writer.write_f32("w", 0, 1, 2, 2, other.data());
  }
  std::vector<float> out(2);
  SafetensorsFile::open(earlier).read_f32("w", {2}, out.data());
  EXPECT_EQ(out, values);
}

TEST_F(SafetensorsWriterTest, RejectsWritesThatDoNotFitTheLayout) {
  const std::vector<float> values(8, 1.0f);
  const std::vector<int32_t> ids = {1, 2};
  const std::string file = path("misuse.safetensors");
  SafetensorsWriter writer(file, {{"w", "F32", {2, 4}}, {"ids", "I32", {2}}}, {});
  std::string message = testing::error_of([&] { writer.write_f32("ids", 0, 1, 2, 2, values.data()); });
  EXPECT_TRUE(contains(message, file) && contains(message, "'ids'") && contains(message, "dtype I32") &&
              contains(message, "write_raw"))
      << message;
  message = testing::error_of([&] { writer.write_raw("bias", ids.data()); });
  EXPECT_TRUE(contains(message, file) && contains(message, "'bias'") && contains(message, "no such tensor"))
      << message;
  EXPECT_THROW(writer.write_f32("w", 5, 1, 4, 4, values.data()), std::logic_error);  // past the end
  EXPECT_THROW(writer.write_f32("w", 0, 2, 4, 2, values.data()), std::logic_error);  // runs overlap
  writer.write_raw("ids", ids.data());
  writer.write_f32("w", 0, 2, 4, 4, values.data());
  writer.commit();
  EXPECT_THROW(writer.write_raw("ids", ids.data()), std::logic_error);  // after commit
  EXPECT_EQ(SafetensorsFile::open(file).entries().size(), 2u);
}

}  // namespace
}  // namespace meshtrain
