// Documents (UTF-8 text) read one at a time from a source's files, in order: a text file is one document, a
// JSON Lines file one document per non-blank line (the text in one column), a Parquet file one per row (the
// text in one string column, parquet_text.h). Compressed files are streamed (byte_stream.h), so no file is
// ever held whole in memory, only its current line (or Parquet page).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/data/records/byte_stream.h"
#include "meshtrain/data/records/parquet_text.h"
#include "meshtrain/data/records/source_files.h"

namespace meshtrain {

struct RecordOptions {
  std::string column = "text";                        // the JSON Lines / Parquet column holding the text
  std::string column_setting = "train_data_columns";  // the setting naming it, for hints
  std::string path_setting = "dataset_path";          // the setting naming the source, for hints
  size_t chunk_bytes = kDefaultChunkBytes;            // bytes read (and decompressed) at once
};

struct Record {
  std::string text;   // valid UTF-8; from next_undecoded, a JSON Lines line as read until decode()
  size_t file = 0;    // index into RecordReader::files()
  uint64_t line = 0;  // 1-based line of a JSON Lines file, 1-based row of a Parquet file; 0 for a text file
  bool undecoded = false;    // `text` is a JSON Lines line that decode() has not taken the column out of yet
  uint64_t line_offset = 0;  // of an undecoded line: its offset in the decompressed file, for errors
};

class RecordReader {
 public:
  // `files` as resolve_source_files gives them; each one's format comes from its name (record_format_of).
  RecordReader(std::vector<std::string> files, RecordOptions options);
  ~RecordReader();

  // The next document into `record`; false after the last file's last one. Blank lines (nothing but spaces,
  // tabs, '\r') are no documents and are passed over; a '\r' before the newline is whitespace to JSON (CRLF
  // files read as LF ones). MeshErrors, each naming the file (and "FILE:LINE" for a line): a line that is not
  // valid UTF-8 (with its byte offset in the decompressed file), not JSON, or not a JSON object; a missing or
  // non-string column (with what the line holds instead); a file without a single document; the text files'
  // rules (read_text_document); a damaged .gz / .zst (ByteStream); ParquetTextReader's errors (a build
  // without Parquet among them: never a skipped file) and a row that is not valid UTF-8.
  bool next(Record& record);
  // next() in two halves, so that the costly half runs on many threads: next_undecoded gives a JSON Lines
  // line as read (blank lines passed over, nothing checked), decode() checks and parses it into the
  // document, with next()'s errors. decode() reads only the files' names and the options, never the reader's
  // position: it may run on any thread, while next_undecoded runs on another.
  bool next_undecoded(Record& record);
  void decode(Record& record) const;

  const std::vector<std::string>& files() const { return files_; }
  // Bytes of the files read so far, as stored (compressed where they are): the files done whole, and the
  // open one's bytes read (a Parquet file's by the share of its rows read). For progress.
  uint64_t bytes_read() const;

 private:
  void open_json_lines(size_t file);
  bool next_json_line(Record& record);
  bool next_parquet_row(Record& record);
  void close_file();

  std::vector<std::string> files_;
  RecordOptions options_;
  size_t next_file_ = 0;
  uint64_t bytes_done_ = 0;  // the sizes of the files read whole

  // The open JSON Lines file: the decompressed bytes from pending_offset_ on that no line has taken yet.
  std::unique_ptr<ByteStream> stream_;
  size_t file_ = 0;
  std::string pending_;
  uint64_t pending_offset_ = 0;  // offset in the decompressed file of pending_[0]
  size_t line_start_ = 0;        // where in pending_ the next line starts
  size_t searched_ = 0;          // bytes of pending_ known to hold no '\n' past line_start_
  bool stream_ended_ = false;
  uint64_t line_ = 0;       // lines taken so far
  uint64_t documents_ = 0;  // documents the file gave so far

  // The open Parquet file.
  std::unique_ptr<ParquetTextReader> parquet_;
  uint64_t parquet_bytes_ = 0;  // its size
};

}  // namespace meshtrain
