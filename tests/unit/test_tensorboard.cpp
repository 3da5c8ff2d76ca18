// TensorBoard event files: decoded back here (record framing, CRCs, Event / Summary protobuf), and read by
// the official `tensorboard` package through tests/reference/tensorboard/read_events.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/error.h"
#include "meshtrain/metrics/tensorboard.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() / ("meshtrain_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

// --- A minimal, independent decoder: TFRecord framing + the protobuf fields meshtrain writes. ---

struct DecodedScalar {
  double wall_time = 0.0;
  int64_t step = 0;
  std::string tag;
  float value = 0.0f;
};

struct DecodedFile {
  std::vector<std::string> file_versions;
  std::vector<DecodedScalar> scalars;
  size_t records = 0;
};

uint64_t little_endian(const std::string& bytes, size_t offset, int count) {
  uint64_t value = 0;
  for (int i = 0; i < count; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes.at(offset + i))) << (8 * i);
  }
  return value;
}

class ProtoReader {
 public:
  explicit ProtoReader(std::string_view data) : data_(data) {}
  bool done() const { return position_ >= data_.size(); }
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (position_ >= data_.size()) throw std::runtime_error("truncated varint");
      const auto byte = static_cast<unsigned char>(data_[position_++]);
      value |= static_cast<uint64_t>(byte & 0x7Fu) << shift;
      if ((byte & 0x80u) == 0) return value;
    }
    throw std::runtime_error("varint longer than 10 bytes");
  }
  uint64_t fixed(int bytes) {
    if (position_ + bytes > data_.size()) throw std::runtime_error("truncated fixed field");
    uint64_t value = little_endian(std::string(data_.substr(position_, bytes)), 0, bytes);
    position_ += bytes;
    return value;
  }
  std::string_view bytes() {
    const uint64_t size = varint();
    if (position_ + size > data_.size()) throw std::runtime_error("truncated length-delimited field");
    const std::string_view payload = data_.substr(position_, size);
    position_ += size;
    return payload;
  }
  void skip(uint32_t wire_type) {
    if (wire_type == 0)
      varint();
    else if (wire_type == 1)
      fixed(8);
    else if (wire_type == 2)
      bytes();
    else if (wire_type == 5)
      fixed(4);
    else
      throw std::runtime_error("unknown wire type " + std::to_string(wire_type));
  }

 private:
  std::string_view data_;
  size_t position_ = 0;
};

void decode_event(std::string_view data, DecodedFile& out) {
  ProtoReader event(data);
  double wall_time = 0.0;
  int64_t step = 0;
  std::vector<DecodedScalar> values;
  while (!event.done()) {
    const uint64_t key = event.varint();
    const auto field = static_cast<uint32_t>(key >> 3), wire_type = static_cast<uint32_t>(key & 7u);
    if (field == 1 && wire_type == 1) {
      wall_time = std::bit_cast<double>(event.fixed(8));
    } else if (field == 2 && wire_type == 0) {
      step = static_cast<int64_t>(event.varint());
    } else if (field == 3 && wire_type == 2) {
      out.file_versions.emplace_back(event.bytes());
    } else if (field == 5 && wire_type == 2) {
      ProtoReader summary(event.bytes());
      while (!summary.done()) {
        const uint64_t summary_key = summary.varint();
        if (summary_key != ((1u << 3) | 2u)) {
          summary.skip(static_cast<uint32_t>(summary_key & 7u));
          continue;
        }
        ProtoReader value(summary.bytes());
        DecodedScalar scalar;
        while (!value.done()) {
          const uint64_t value_key = value.varint();
          if (value_key == ((1u << 3) | 2u)) {
            scalar.tag = std::string(value.bytes());
          } else if (value_key == ((2u << 3) | 5u)) {
            scalar.value = std::bit_cast<float>(static_cast<uint32_t>(value.fixed(4)));
          } else {
            value.skip(static_cast<uint32_t>(value_key & 7u));
          }
        }
        values.push_back(scalar);
      }
    } else {
      event.skip(wire_type);
    }
  }
  for (DecodedScalar& scalar : values) {
    scalar.wall_time = wall_time;
    scalar.step = step;
    out.scalars.push_back(scalar);
  }
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Throws on a framing or CRC error, like a strict reader.
DecodedFile decode_file(const std::string& path) {
  const std::string bytes = read_bytes(path);
  DecodedFile out;
  size_t offset = 0;
  while (offset < bytes.size()) {
    if (offset + 12 > bytes.size()) throw std::runtime_error("truncated record header");
    const uint64_t length = little_endian(bytes, offset, 8);
    if (little_endian(bytes, offset + 8, 4) != crc32c_masked(crc32c(bytes.data() + offset, 8))) {
      throw std::runtime_error("length CRC mismatch at offset " + std::to_string(offset));
    }
    if (offset + 12 + length + 4 > bytes.size()) throw std::runtime_error("truncated record data");
    const std::string_view data(bytes.data() + offset + 12, length);
    if (little_endian(bytes, offset + 12 + length, 4) != crc32c_masked(crc32c(data.data(), data.size()))) {
      throw std::runtime_error("data CRC mismatch at offset " + std::to_string(offset));
    }
    decode_event(data, out);
    ++out.records;
    offset += 12 + length + 4;
  }
  return out;
}

std::vector<std::string> event_files(const std::string& directory) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(directory)) {
    if (entry.path().filename().string().find("tfevents") != std::string::npos) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

struct Point {
  std::string tag;
  int64_t step;
  double value;
};

// Multi-byte varints (large step), a negative value, a '/' tag, and a value float cannot hold exactly.
const std::vector<Point> kPoints = {
    {"loss", 0, 3.4125},
    {"lr", 0, 3e-4},
    {"loss", 1, 2.875},
    {"lr", 1, 2.9e-4},
    {"eval/loss", 1, 3.25},
    {"grad_norm", 2, -1.5e10},
    {"loss", int64_t{1} << 40, 0.1},
};
constexpr double kWallTime = 1700000000.25;

std::string write_points(const std::string& directory) {
  TensorBoardWriter writer(directory);
  for (size_t i = 0; i < kPoints.size(); ++i) {
    writer.add_scalar(kPoints[i].tag, kPoints[i].step, kPoints[i].value, kWallTime + static_cast<double>(i));
  }
  writer.flush();
  return writer.path();
}

// --- Tests ---

TEST(TensorBoardWire, VarintsMatchProtobuf) {
  std::string out;
  tensorboard_wire::append_varint(out, 300);
  EXPECT_EQ(out, std::string("\xAC\x02"));
  out.clear();
  tensorboard_wire::append_int64(out, 2, -1);  // int64 -1: key 0x10, then ten bytes
  EXPECT_EQ(out, std::string("\x10\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\x01"));
  out.clear();
  tensorboard_wire::append_float(out, 2, 1.0f);
  EXPECT_EQ(out, std::string("\x15\x00\x00\x80\x3F", 5));
}

TEST(TensorBoardWire, FramingMatchesTensorFlowRecord) {
  // An empty record: length 0, masked CRC of eight zero bytes, no data, masked CRC of nothing.
  const std::string record = tensorboard_wire::frame_record("");
  ASSERT_EQ(record.size(), 16u);
  EXPECT_EQ(little_endian(record, 0, 8), 0u);
  const unsigned char zeros[8] = {};
  EXPECT_EQ(little_endian(record, 8, 4), crc32c_masked(crc32c(zeros, 8)));
  EXPECT_EQ(little_endian(record, 12, 4), crc32c_masked(0));
}

TEST(TensorBoard, WritesDecodableScalars) {
  TempDir directory("tb_decode");
  const std::string path = write_points(directory.str());
  EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
  EXPECT_EQ(event_files(directory.str()), std::vector<std::string>{path});

  const DecodedFile decoded = decode_file(path);
  EXPECT_EQ(decoded.records, kPoints.size() + 1);
  EXPECT_EQ(decoded.file_versions, std::vector<std::string>{"brain.Event:2"});
  ASSERT_EQ(decoded.scalars.size(), kPoints.size());
  for (size_t i = 0; i < kPoints.size(); ++i) {
    EXPECT_EQ(decoded.scalars[i].tag, kPoints[i].tag);
    EXPECT_EQ(decoded.scalars[i].step, kPoints[i].step);
    EXPECT_EQ(decoded.scalars[i].value, static_cast<float>(kPoints[i].value));
    EXPECT_EQ(decoded.scalars[i].wall_time, kWallTime + static_cast<double>(i));
  }
}

TEST(TensorBoard, DecoderCatchesCorruption) {
  // Guards the test's own decoder: a flipped data byte must fail the CRC check.
  TempDir directory("tb_corrupt");
  const std::string path = write_points(directory.str());
  std::string bytes = read_bytes(path);
  bytes[bytes.size() - 6] = static_cast<char>(bytes[bytes.size() - 6] ^ 0x01);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_THROW(decode_file(path), std::runtime_error);
}

TEST(TensorBoard, WritersNeverShareAFile) {
  TempDir directory("tb_two");
  const std::string first = write_points(directory.str());
  const std::string second = write_points(directory.str());  // same second, same pid
  EXPECT_NE(first, second);
  EXPECT_EQ(event_files(directory.str()).size(), 2u);
  EXPECT_EQ(decode_file(first).scalars.size(), kPoints.size());
}

TEST(TensorBoard, UnusableDirectoryNamesIt) {
  TempDir directory("tb_bad");
  const std::string blocker = directory.str() + "/not_a_directory";
  std::ofstream(blocker) << "x";
  try {
    TensorBoardWriter writer(blocker + "/events");
    FAIL() << "expected MeshError";
  } catch (const MeshError& error) {
    EXPECT_NE(error.context().where.find("not_a_directory"), std::string::npos) << error.what();
  }
}

// The official reader: tensorboard's strict record reader + Event proto, then EventAccumulator.
TEST(TensorBoard, OfficialReaderParsesFile) {
  // The virtual environment of `scripts/setup.sh tests`, else the python3 on PATH.
  const std::string python =
      std::filesystem::exists(MESHTRAIN_TEST_PYTHON) ? MESHTRAIN_TEST_PYTHON : "python3";
  if (std::system(("'" + python + "' -c 'import tensorboard' >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP()
        << python
        << " cannot import tensorboard (scripts/setup.sh tests installs it) - official reader not run";
  }
  TempDir directory("tb_official");
  write_points(directory.str());
  const std::string script =
      std::string(MESHTRAIN_SOURCE_DIR) + "/tests/reference/tensorboard/read_events.py";
  const std::string errors = directory.str() + "/../meshtrain_tb_reader_stderr_" + std::to_string(getpid());
  const std::string command =
      "'" + python + "' '" + script + "' '" + directory.str() + "' 2>'" + errors + "'";
  std::FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << command;
  std::string output;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  const int status = pclose(pipe);
  const std::string error_text = read_bytes(errors);
  fs::remove(errors);
  ASSERT_EQ(status, 0) << command << "\nstdout: " << output << "\nstderr: " << error_text;

  const nlohmann::json result = nlohmann::json::parse(output);
  EXPECT_EQ(result["file_versions"], nlohmann::json::array({"brain.Event:2"}));
  EXPECT_EQ(result["records"].get<size_t>(), kPoints.size() + 1);
  // The accumulator groups by tag (sorted) and keeps step order within a tag.
  std::vector<Point> expected = kPoints;
  std::stable_sort(expected.begin(), expected.end(),
                   [](const Point& a, const Point& b) { return a.tag < b.tag; });
  const nlohmann::json& scalars = result["scalars"];
  ASSERT_EQ(scalars.size(), expected.size()) << output;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(scalars[i]["tag"], expected[i].tag);
    EXPECT_EQ(scalars[i]["step"].get<int64_t>(), expected[i].step);
    EXPECT_EQ(scalars[i]["value"].get<double>(), static_cast<double>(static_cast<float>(expected[i].value)));
  }
}

}  // namespace
}  // namespace meshtrain
