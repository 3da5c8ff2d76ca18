// One string column of a Parquet file (FineWeb, the Hugging Face Hub's datasets) read as documents, streamed
// row group by row group and page by page, never the whole file in memory. The reader is Arrow's C++ Parquet
// library, built in where CMake found it (MESHTRAIN_PARQUET; docs/parquet.md says why this library and how to
// install it).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace meshtrain {

// Whether this build reads Parquet.
bool parquet_supported();

class ParquetTextReader {
 public:
  // Opens `path` and checks `column` (train_data_columns). MeshErrors naming the file: a build without
  // Parquet (how to enable it, or convert the file to JSON Lines), a file that is not Parquet or is damaged,
  // no such column (naming the columns there are), a column that is not a flat string column (naming its
  // type).
  ParquetTextReader(const std::string& path, const std::string& column);
  ~ParquetTextReader();
  ParquetTextReader(const ParquetTextReader&) = delete;
  ParquetTextReader& operator=(const ParquetTextReader&) = delete;

  // The file's rows (documents), from its footer.
  int64_t documents() const;
  // The next document in file order, or nothing after the last. The view lives until the next call. A null
  // value and a page that fails to decode or to match its checksum are MeshErrors naming the file, the column
  // and the row.
  std::optional<std::string_view> next();

 private:
  struct Stream;
  std::unique_ptr<Stream> stream_;
};

}  // namespace meshtrain
