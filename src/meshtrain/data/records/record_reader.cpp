// Documents from text, JSON Lines and Parquet files (record_reader.h): lines cut from streamed chunks, each
// checked as UTF-8 and parsed as one JSON object, its text column taken out; Parquet rows checked as UTF-8.
#include "meshtrain/data/records/record_reader.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/data/records/text_files.h"

namespace meshtrain {
namespace {

bool blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// A short quote of a JSON value for an error.
std::string quote(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

std::string keys_of(const nlohmann::json& object) {
  std::string keys;
  for (const auto& [key, value] : object.items()) {
    if (!keys.empty()) keys += ", ";
    if (keys.size() > 200) return keys + "...";
    keys += "'" + key + "'";
  }
  return keys.empty() ? "none" : keys;
}

// Takes a line's text column without building the line's JSON value (3 to 4 times faster on typical corpora:
// other columns are lexed, not stored). It stops at whatever is not the simple case: a parse error, a line
// that is not an object, a column that is not a string; the caller then parses the line whole for the
// error's details. Duplicate keys keep the last value, as a parsed object does.
class ColumnTaker {
 public:
  ColumnTaker(const std::string& column, std::string& text) : column_(column), text_(text) {}
  bool found() const { return found_; }

  bool null() { return scalar(); }
  bool boolean(bool) { return scalar(); }
  bool number_integer(nlohmann::json::number_integer_t) { return scalar(); }
  bool number_unsigned(nlohmann::json::number_unsigned_t) { return scalar(); }
  bool number_float(nlohmann::json::number_float_t, const std::string&) { return scalar(); }
  bool binary(nlohmann::json::binary_t&) { return scalar(); }
  bool string(std::string& value) {
    if (depth_ == 0) return false;
    if (depth_ == 1 && wanted_) {
      text_ = std::move(value);
      found_ = true;
      wanted_ = false;
    }
    return true;
  }
  bool start_object(size_t) { return open(); }
  bool start_array(size_t) { return depth_ > 0 && open(); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& name) {
    if (depth_ == 1) wanted_ = name == column_;
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::json::exception&) { return false; }

 private:
  // A value other than a string: fine inside the object, unless it is the column's.
  bool scalar() const { return depth_ > 0 && !(depth_ == 1 && wanted_); }
  bool open() {
    if (depth_ == 1 && wanted_) return false;
    ++depth_;
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }

  const std::string& column_;
  std::string& text_;
  int depth_ = 0;
  bool wanted_ = false;  // the last key of the line's object named the column
  bool found_ = false;
};

}  // namespace

RecordReader::RecordReader(std::vector<std::string> files, RecordOptions options)
    : files_(std::move(files)), options_(std::move(options)) {
  for (const std::string& file : files_) {
    if (!record_format_of(file)) {
      fail(file, std::string("a data file named ") + supported_record_files(), "a name of no supported kind",
           "rename or convert it");
    }
  }
}

RecordReader::~RecordReader() = default;

bool RecordReader::next(Record& record) {
  if (!next_undecoded(record)) return false;
  decode(record);
  return true;
}

bool RecordReader::next_undecoded(Record& record) {
  record.undecoded = false;
  while (true) {
    if (parquet_ != nullptr) {
      if (next_parquet_row(record)) return true;
      close_file();
      continue;
    }
    if (stream_ == nullptr) {
      if (next_file_ == files_.size()) return false;
      const size_t file = next_file_++;
      const RecordFormat format = *record_format_of(files_[file]);
      if (format == RecordFormat::text) {
        record.text = read_text_document(files_[file], options_.path_setting);
        record.file = file;
        record.line = 0;
        bytes_done_ += std::filesystem::file_size(files_[file]);
        return true;
      }
      if (format == RecordFormat::parquet) {
        parquet_ = std::make_unique<ParquetTextReader>(files_[file], options_.column);
        parquet_bytes_ = std::filesystem::file_size(files_[file]);
        file_ = file;
        line_ = documents_ = 0;
        continue;
      }
      open_json_lines(file);
    }
    if (next_json_line(record)) return true;
    close_file();
  }
}

uint64_t RecordReader::bytes_read() const {
  if (stream_ != nullptr) return bytes_done_ + stream_->file_bytes_read();
  if (parquet_ != nullptr && parquet_->documents() > 0) {
    return bytes_done_ + parquet_bytes_ * documents_ / static_cast<uint64_t>(parquet_->documents());
  }
  return bytes_done_;
}

void RecordReader::close_file() {
  if (documents_ == 0) {
    const bool parquet = parquet_ != nullptr;
    fail(files_[file_],
         parquet ? "at least one document (a row)" : "at least one document (a JSON object per line)",
         parquet      ? std::string("no rows")
         : line_ == 0 ? std::string("an empty file")
                      : std::to_string(line_) + " blank lines",
         "remove the file from " + options_.path_setting + "'s files or give it documents");
  }
  bytes_done_ += stream_ != nullptr ? stream_->file_bytes_read() : parquet_bytes_;
  stream_.reset();
  parquet_.reset();
}

bool RecordReader::next_parquet_row(Record& record) {
  const std::optional<std::string_view> text = parquet_->next();
  if (!text) return false;
  ++line_;
  const size_t invalid = invalid_utf8_offset(*text);
  if (invalid != std::string_view::npos) {
    fail(files_[file_] + ": column '" + options_.column + "', row " + std::to_string(line_ - 1), "UTF-8 text",
         "invalid UTF-8 at byte " + std::to_string(invalid) + " of the row's text",
         "fix or drop that row (Parquet string columns hold UTF-8)");
  }
  record.text.assign(text->data(), text->size());
  record.file = file_;
  record.line = line_;
  ++documents_;
  return true;
}

void RecordReader::open_json_lines(size_t file) {
  stream_ = ByteStream::open(files_[file], options_.chunk_bytes);
  file_ = file;
  pending_.clear();
  pending_offset_ = 0;
  line_start_ = searched_ = 0;
  stream_ended_ = false;
  line_ = documents_ = 0;
}

bool RecordReader::next_json_line(Record& record) {
  while (true) {
    const size_t newline = pending_.find('\n', searched_);
    if (newline == std::string::npos && !stream_ended_) {
      // Keep only the unfinished line, then append the next chunk to it.
      pending_.erase(0, line_start_);
      pending_offset_ += line_start_;
      line_start_ = 0;
      searched_ = pending_.size();
      const std::string_view chunk = stream_->next();
      if (chunk.empty()) stream_ended_ = true;
      pending_.append(chunk);
      continue;
    }
    const size_t end = newline == std::string::npos ? pending_.size() : newline;
    if (end == line_start_ && newline == std::string::npos) return false;  // the end of the file
    const std::string_view line(pending_.data() + line_start_, end - line_start_);
    const uint64_t line_offset = pending_offset_ + line_start_;
    line_start_ = searched_ = newline == std::string::npos ? end : end + 1;
    ++line_;
    if (blank(line)) continue;
    ++documents_;
    record.text.assign(line.data(), line.size());
    record.file = file_;
    record.line = line_;
    record.line_offset = line_offset;
    record.undecoded = true;
    return true;
  }
}

void RecordReader::decode(Record& record) const {
  if (!record.undecoded) return;
  record.undecoded = false;
  const std::string& file = files_[record.file];
  const std::string line = std::move(record.text);
  // Built only for an error: most lines need neither.
  const auto where = [&] { return file + ":" + std::to_string(record.line); };
  const auto fix = [&] { return "fix or remove line " + std::to_string(record.line) + " of " + file; };
  const size_t invalid = invalid_utf8_offset(line);
  if (invalid != std::string_view::npos) {
    fail(where(), "UTF-8 text",
         "invalid UTF-8 at byte offset " + std::to_string(record.line_offset + invalid) +
             " of the (decompressed) file, byte " + std::to_string(invalid) + " of the line",
         fix() + " (convert other encodings with iconv -t UTF-8)");
  }
  ColumnTaker taker(options_.column, record.text);
  if (nlohmann::json::sax_parse(line, &taker) && taker.found()) return;
  // Not the simple case: the whole value, for the error's details.
  nlohmann::json object;
  try {
    object = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& error) {  // a parse error, or a number beyond a double's range
    fail(where(), "one JSON object per line (JSON Lines)", std::string("malformed JSON: ") + error.what(),
         fix());
  }
  if (!object.is_object()) {
    fail(where(), "one JSON object per line (JSON Lines)",
         std::string("a JSON ") + object.type_name() + ": " + quote(object), fix());
  }
  const auto column = object.find(options_.column);
  const auto column_hint = [&] {
    return fix() + ", or name the text column with " + options_.column_setting + "=COLUMN";
  };
  if (column == object.end()) {
    fail(where(), "a string column '" + options_.column + "'",
         "no such column; the line's columns: " + keys_of(object), column_hint());
  }
  if (!column->is_string()) {
    fail(where(), "a string column '" + options_.column + "'",
         std::string("a ") + column->type_name() + ": " + quote(*column), column_hint());
  }
  record.text = std::move(column->get_ref<std::string&>());  // a repeated key whose last value is the string
}

}  // namespace meshtrain
