// Documents from text, JSON Lines and Parquet files (record_reader.h): lines cut from streamed chunks, each
// checked as UTF-8 and parsed as one JSON object, its text column taken out; Parquet rows checked as UTF-8.
#include "meshtrain/data/records/record_reader.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/data/records/json_string.h"
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

// Takes a line's text column in one pass over its bytes, checking the whole line against JSON's grammar as it
// goes, without building any value: several times faster than nlohmann's parser, whose lexer copies every
// string byte by byte. It answers only the plain case, an object whose column is a string, with numbers
// without an exponent, nested at most kMaxDepth deep; for anything else (an error above all) it gives up and
// the full parse decides, so it never accepts a line the parser refuses nor reads one differently. The line
// is valid UTF-8 already. Duplicate keys keep the last value, as a parsed object does.
class ColumnScanner : JsonCursor {
 public:
  ColumnScanner(std::string_view line, const std::string& column)
      : JsonCursor(line.data(), line.data() + line.size()), column_(column) {}

  // True with the column's text in `text` when the line is a JSON object holding it as a string.
  bool take(std::string& text) {
    bool found = false;
    skip_space();
    if (!next_is('{')) return false;
    skip_space();
    if (next_is('}')) return false;  // no column at all
    do {
      skip_space();
      key_.clear();
      if (at_ == end_ || *at_ != '"' || !string(&key_)) return false;
      skip_space();
      if (!next_is(':')) return false;
      skip_space();
      if (key_ == column_) {
        if (at_ == end_ || *at_ != '"') return false;
        text.clear();
        if (!string(&text)) return false;
        found = true;
      } else if (!value(1)) {
        return false;
      }
      skip_space();
    } while (next_is(','));
    if (!next_is('}')) return false;
    skip_space();
    return at_ == end_ && found;
  }

 private:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxNumberChars = 300;  // a longer one may overflow a double: the parser's call

  // At a '"': the string, unescaped into `out` (skipped when null).
  bool string(std::string* out) { return scan_json_string(at_, end_, out); }

  // Any value, checked and skipped.
  bool value(int depth) {
    if (at_ == end_ || depth > kMaxDepth) return false;
    switch (*at_) {
      case '"':
        return string(nullptr);
      case '{':
        return container(depth, '}', true);
      case '[':
        return container(depth, ']', false);
      case 't':
        return word("true");
      case 'f':
        return word("false");
      case 'n':
        return word("null");
      default:
        return number();
    }
  }
  // At '{' or '[': members (key: value) or elements up to `close`.
  bool container(int depth, char close, bool object) {
    ++at_;
    skip_space();
    if (next_is(close)) return true;
    do {
      skip_space();
      if (object) {
        if (at_ == end_ || *at_ != '"' || !string(nullptr)) return false;
        skip_space();
        if (!next_is(':')) return false;
        skip_space();
      }
      if (!value(depth + 1)) return false;
      skip_space();
    } while (next_is(','));
    return next_is(close);
  }
  bool word(std::string_view expected) {
    if (static_cast<size_t>(end_ - at_) < expected.size() ||
        std::string_view(at_, expected.size()) != expected) {
      return false;
    }
    at_ += expected.size();
    return true;
  }
  // -?(0|[1-9][0-9]*)(.[0-9]+)? ; an exponent is left to the parser (it may overflow a double).
  bool number() {
    const char* start = at_;
    const auto digits = [&] {
      const char* first = at_;
      while (at_ != end_ && *at_ >= '0' && *at_ <= '9') ++at_;
      return at_ - first;
    };
    next_is('-');
    if (!next_is('0') && digits() == 0) return false;
    if (next_is('.') && digits() == 0) return false;
    if (at_ != end_ && (*at_ == 'e' || *at_ == 'E')) return false;
    return at_ - start <= kMaxNumberChars;
  }

  const std::string& column_;
  std::string key_;
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
  // The line moves to this thread's buffer and the record takes the buffer's old memory for its text: both
  // keep their capacity from document to document, where a moved-from string would allocate each time.
  thread_local std::string line;
  line.swap(record.text);
  record.text.clear();
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
  if (ColumnScanner(line, options_.column).take(record.text)) return;
  // Not the plain case: the whole value, parsed for the column or the error's details.
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
