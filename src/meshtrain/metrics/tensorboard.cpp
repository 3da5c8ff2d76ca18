// TensorBoard event-file writer: TFRecord framing with masked CRC-32C, and the Event / Summary protobuf
// messages encoded by hand (field numbers from tensorflow/core/util/event.proto and summary.proto).
#include "meshtrain/metrics/tensorboard.h"

#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace tensorboard_wire {
namespace {

constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

// Little-endian regardless of the host, as the wire format and TFRecord framing require.
void append_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
}

}  // namespace

void append_varint(std::string& out, uint64_t value) {
  while (value >= 0x80u) {
    out.push_back(static_cast<char>((value & 0x7Fu) | 0x80u));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void append_tag(std::string& out, uint32_t field, uint32_t wire_type) {
  append_varint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

void append_double(std::string& out, uint32_t field, double value) {
  append_tag(out, field, kFixed64);
  append_little_endian(out, std::bit_cast<uint64_t>(value), 8);
}

void append_float(std::string& out, uint32_t field, float value) {
  append_tag(out, field, kFixed32);
  append_little_endian(out, std::bit_cast<uint32_t>(value), 4);
}

void append_int64(std::string& out, uint32_t field, int64_t value) {
  // int64 (not sint64): negatives are the 10-byte two's-complement varint, as protobuf encodes them.
  append_tag(out, field, kVarint);
  append_varint(out, static_cast<uint64_t>(value));
}

void append_bytes(std::string& out, uint32_t field, std::string_view payload) {
  append_tag(out, field, kLengthDelimited);
  append_varint(out, payload.size());
  out.append(payload);
}

std::string scalar_event(const std::string& tag, int64_t step, double value, double wall_time) {
  std::string summary_value;  // Summary.Value{tag = 1, simple_value = 2}
  append_bytes(summary_value, 1, tag);
  append_float(summary_value, 2, static_cast<float>(value));
  std::string summary;  // Summary{repeated Value value = 1}
  append_bytes(summary, 1, summary_value);
  std::string event;  // Event{wall_time = 1, step = 2, summary = 5}
  append_double(event, 1, wall_time);
  append_int64(event, 2, step);
  append_bytes(event, 5, summary);
  return event;
}

std::string file_version_event(double wall_time) {
  std::string event;  // Event{wall_time = 1, file_version = 3}
  append_double(event, 1, wall_time);
  append_bytes(event, 3, "brain.Event:2");
  return event;
}

std::string frame_record(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  append_little_endian(record, data.size(), 8);
  append_little_endian(record, crc32c_masked(crc32c(record.data(), 8)), 4);
  record.append(data);
  append_little_endian(record, crc32c_masked(crc32c(data.data(), data.size())), 4);
  return record;
}

}  // namespace tensorboard_wire

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TensorBoardWriter::TensorBoardWriter(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    fail(directory, "a directory meshtrain can create for TensorBoard event files", error.message(),
         "check run_dir and its permissions");
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  const std::string stem = (std::filesystem::path(directory) / "events.out.tfevents.").string() +
                           std::to_string(seconds) + "." + host + "." + std::to_string(getpid()) +
                           ".meshtrain";
  // "x": never clobber another writer's file (two writers in one process within the same second).
  for (int attempt = 0; !file_ && attempt < 1000; ++attempt) {
    path_ = attempt == 0 ? stem : stem + "." + std::to_string(attempt);
    errno = 0;
    file_.reset(std::fopen(path_.c_str(), "wbx"));
    if (!file_ && errno != EEXIST) {
      fail(path_, "a writable TensorBoard event file", std::strerror(errno),
           "check run_dir's permissions and free space");
    }
  }
  if (!file_) fail(stem, "a new TensorBoard event file name", "1000 files of that name already", "");
  write_record(tensorboard_wire::file_version_event(unix_seconds_now()));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  // Errors here cannot be reported (destructor); flush() is where the caller sees them.
  if (file_) std::fflush(file_.get());
}

void TensorBoardWriter::add_scalar(const std::string& tag, int64_t step, double value, double wall_time) {
  write_record(tensorboard_wire::scalar_event(tag, step, value, wall_time));
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_.get()) != 0) {
    fail(path_, "a writable TensorBoard event file", std::strerror(errno), "check free space in run_dir");
  }
}

void TensorBoardWriter::write_record(std::string_view data) {
  const std::string record = tensorboard_wire::frame_record(data);
  if (std::fwrite(record.data(), 1, record.size(), file_.get()) != record.size()) {
    fail(path_, "a writable TensorBoard event file", std::strerror(errno), "check free space in run_dir");
  }
}

}  // namespace meshtrain
