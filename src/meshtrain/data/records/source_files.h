// Which files a raw source names, and how each is read: a source is a file, a folder (its files, recursively)
// or a glob; a file's record format and compression come from its name.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace meshtrain {

// How a file holds its documents.
enum class RecordFormat {
  text,        // .txt: the whole file is one document
  json_lines,  // .jsonl, .jsonl.gz, .jsonl.zst: one JSON object per line, the text in one of its columns
  parquet,     // .parquet: one document per row, the text in one string column (parquet_text.h)
};

// The format a file's name gives, or nothing for a name of no supported kind.
std::optional<RecordFormat> record_format_of(const std::string& path);
// The supported names, for hints: ".txt, .jsonl, .jsonl.gz, .jsonl.zst, .parquet".
const char* supported_record_files();

// Every regular file under `folder`, recursively, sorted by path (bytewise); names starting with '.' (hidden
// files and folders) are left out. Empty when there is none. An unreadable folder is a MeshError naming it.
std::vector<std::string> files_under(const std::string& folder);

// The files a source names, sorted by path: a file itself; a folder's files (files_under); or, for a
// pattern holding '*', '?' or '[', the files and folders' files that glob(3) matches. MeshErrors naming the
// source and `path_setting` (the setting that gave it, for hints): nothing at the path, a glob or folder
// that yields no file, and any file whose name is of no supported kind (never skipped in silence).
std::vector<std::string> resolve_source_files(const std::string& source, const std::string& path_setting);

// Whether `source` is a glob pattern: it holds '*', '?' or '['.
bool is_glob(const std::string& source);

// Whether a source holds records that need a given tokenizer and the record reader: a glob, or a file or
// folder with any JSON Lines or Parquet file (plain text files alone do not). Cheap: names only, no file is
// opened; a missing path is none (resolving it later reports it).
bool holds_records(const std::string& source);

}  // namespace meshtrain
