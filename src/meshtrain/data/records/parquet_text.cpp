// Parquet documents through Arrow's C++ Parquet library (parquet-cpp's low-level column reader: the values
// are views into the decoded page, no Arrow arrays are built), or, in a build without it, the error that says
// how to get it.
#include "meshtrain/data/records/parquet_text.h"

#include "meshtrain/core/error.h"

#if MESHTRAIN_WITH_PARQUET
#include <parquet/api/reader.h>
#include <parquet/exception.h>

#include <vector>
#endif

namespace meshtrain {

#if MESHTRAIN_WITH_PARQUET

bool parquet_supported() {
  return true;
}

namespace {

// Values taken from the column reader at a time: a few pages' worth of documents, however long each is.
constexpr int64_t kValuesPerRead = 256;
// The read-ahead of a column's pages: a column chunk (one row group's text, often hundreds of MB) is read in
// pieces this size, not whole.
constexpr int64_t kReadBufferBytes = int64_t{1} << 20;

// "text (String)", "id (INT64)": a leaf column and its type, for errors.
std::string describe_column(const parquet::ColumnDescriptor& descriptor) {
  const std::shared_ptr<const parquet::LogicalType>& logical = descriptor.logical_type();
  const std::string type = logical && !logical->is_none() ? logical->ToString()
                                                          : parquet::TypeToString(descriptor.physical_type());
  return descriptor.path()->ToDotString() + " (" + type + ")";
}

// `where`: the file, and the column and row where reading stopped.
[[noreturn]] void fail_damaged(const std::string& where, const parquet::ParquetException& error) {
  fail(where, "a readable Parquet file", error.what(),
       "the file is damaged or not Parquet: download or write it again (a partial download ends without the "
       "footer Parquet needs)");
}

}  // namespace

struct ParquetTextReader::Stream {
  std::string path;
  std::string column;
  std::unique_ptr<parquet::ParquetFileReader> file;
  int column_index = 0;
  int row_groups = 0;
  int next_row_group = 0;
  std::shared_ptr<parquet::ByteArrayReader> reader;  // the current row group's column
  std::vector<parquet::ByteArray> values = std::vector<parquet::ByteArray>(kValuesPerRead);
  std::vector<int16_t> definition_levels = std::vector<int16_t>(kValuesPerRead);
  int64_t values_held = 0;  // values of the last read
  int64_t value_next = 0;   // the next of them to hand out
  int64_t row_next = 0;     // the file's row of values[value_next]

  // Reads the next values of the column into `values`, moving to the next row group where one ends; false
  // after the last row group.
  bool read_values() {
    while (!reader || !reader->HasNext()) {
      if (next_row_group == row_groups) return false;
      reader = std::static_pointer_cast<parquet::ByteArrayReader>(
          file->RowGroup(next_row_group++)->Column(column_index));
    }
    const int64_t first_row = row_next;
    int64_t values_read = 0;
    const int64_t levels_read =
        reader->ReadBatch(kValuesPerRead, definition_levels.data(), nullptr, values.data(), &values_read);
    if (values_read != levels_read) {  // a null: its definition level is below the column's maximum
      int64_t null_at = 0;
      while (definition_levels[static_cast<size_t>(null_at)] == reader->descr()->max_definition_level()) {
        ++null_at;
      }
      fail(path + ": column '" + column + "', row " + std::to_string(first_row + null_at),
           "a string in every row (a document)", "null",
           "drop or fill the rows without text before training (pyarrow: table.filter(pc.is_valid(...)))");
    }
    values_held = values_read;
    value_next = 0;
    return true;
  }
};

ParquetTextReader::ParquetTextReader(const std::string& path, const std::string& column)
    : stream_(std::make_unique<Stream>()) {
  Stream& stream = *stream_;
  stream.path = path;
  stream.column = column;
  parquet::ReaderProperties properties = parquet::default_reader_properties();
  properties.enable_buffered_stream();
  properties.set_buffer_size(kReadBufferBytes);
  // Where the writer stored page CRCs; pyarrow's default omits them, and a damaged page of a snappy or
  // uncompressed file then decodes without complaint.
  properties.set_page_checksum_verification(true);
  try {
    stream.file = parquet::ParquetFileReader::OpenFile(path, /*memory_map=*/false, properties);
  } catch (const parquet::ParquetException& error) {
    fail_damaged(path, error);
  }
  const std::shared_ptr<parquet::FileMetaData> metadata = stream.file->metadata();
  const parquet::SchemaDescriptor& schema = *metadata->schema();
  stream.column_index = schema.ColumnIndex(column);
  if (stream.column_index < 0) {
    std::string columns;
    for (int i = 0; i < schema.num_columns(); ++i) {
      columns += (i ? ", " : "") + describe_column(*schema.Column(i));
    }
    fail(path, "a column '" + column + "' (train_data_columns)", "columns " + columns,
         "set train_data_columns to the column that holds the text");
  }
  const parquet::ColumnDescriptor& descriptor = *schema.Column(stream.column_index);
  const bool is_string = descriptor.physical_type() == parquet::Type::BYTE_ARRAY &&
                         descriptor.logical_type() && descriptor.logical_type()->is_string();
  if (!is_string || descriptor.max_repetition_level() != 0) {
    fail(path + ": column '" + column + "'", "a string column, one document per row",
         describe_column(descriptor), "set train_data_columns to the column that holds the text");
  }
  stream.row_groups = metadata->num_row_groups();
}

ParquetTextReader::~ParquetTextReader() = default;

int64_t ParquetTextReader::documents() const {
  return stream_->file->metadata()->num_rows();
}

std::optional<std::string_view> ParquetTextReader::next() {
  Stream& stream = *stream_;
  try {
    while (stream.value_next == stream.values_held) {
      if (!stream.read_values()) return std::nullopt;
    }
  } catch (const parquet::ParquetException& error) {
    fail_damaged(
        stream.path + ": column '" + stream.column + "' after row " + std::to_string(stream.row_next), error);
  }
  const parquet::ByteArray& value = stream.values[static_cast<size_t>(stream.value_next++)];
  ++stream.row_next;
  return std::string_view(reinterpret_cast<const char*>(value.ptr), value.len);
}

#else  // a build without Arrow's C++ library

bool parquet_supported() {
  return false;
}

struct ParquetTextReader::Stream {};

ParquetTextReader::ParquetTextReader(const std::string& path, const std::string& /*column*/) {
  fail(path, "a meshtrain built with Parquet support",
       "a build without it (CMake did not find Arrow's C++ library, MESHTRAIN_PARQUET)",
       "run scripts/setup.sh parquet, then configure and build again (cmake -S . -B build); or convert the "
       "file to JSON Lines with pyarrow (docs/parquet.md, \"Without Parquet support\")");
}

// No reader exists in this build (the constructor always throws): these are never reached.
ParquetTextReader::~ParquetTextReader() = default;
int64_t ParquetTextReader::documents() const {
  return 0;
}
std::optional<std::string_view> ParquetTextReader::next() {
  return std::nullopt;
}

#endif

}  // namespace meshtrain
