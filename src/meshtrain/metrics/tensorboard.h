// TensorBoard event files written by hand (TFRecord framing + protobuf wire format), so a run can be
// watched with `tensorboard --logdir <run_dir>` without linking protobuf or TensorFlow.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

namespace meshtrain {

// Protobuf wire-format pieces used for Event / Summary; exposed for the tests' decoder round trips.
namespace tensorboard_wire {
void append_varint(std::string& out, uint64_t value);
void append_tag(std::string& out, uint32_t field, uint32_t wire_type);
void append_double(std::string& out, uint32_t field, double value);             // fixed64
void append_float(std::string& out, uint32_t field, float value);               // fixed32
void append_int64(std::string& out, uint32_t field, int64_t value);             // varint
void append_bytes(std::string& out, uint32_t field, std::string_view payload);  // length-delimited
// Serialized Event{wall_time, step, summary{value{tag, simple_value}}}.
std::string scalar_event(const std::string& tag, int64_t step, double value, double wall_time);
// Serialized Event{wall_time, file_version: "brain.Event:2"}.
std::string file_version_event(double wall_time);
// One TFRecord: u64 length LE, masked crc32c(length bytes), data, masked crc32c(data).
std::string frame_record(std::string_view data);
}  // namespace tensorboard_wire

class TensorBoardWriter {
 public:
  // Creates `directory` if needed and a new events.out.tfevents.<unix s>.<host>.<pid>.meshtrain in it;
  // writes the file_version record. A resumed run gets its own file: TensorBoard reads them in name order
  // and purges the earlier file's steps beyond the restart step.
  explicit TensorBoardWriter(const std::string& directory);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // `wall_time` is seconds since the Unix epoch (TensorBoard's relative-time axis uses it).
  void add_scalar(const std::string& tag, int64_t step, double value, double wall_time);
  // Pushes buffered records to the OS so a live TensorBoard sees them.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(std::string_view data);

  struct FileCloser {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
};

// Seconds since the Unix epoch, as TensorBoard's wall_time.
double unix_seconds_now();

}  // namespace meshtrain
