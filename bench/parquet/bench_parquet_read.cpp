// meshtrain's Parquet reader (data/records/parquet_text) on one file: documents, bytes and seconds, printed
// as read_pyarrow.py prints its own, for run_read_bench.sh to compare.
#include <chrono>
#include <cstdio>
#include <string>

#include "meshtrain/core/error.h"
#include "meshtrain/data/records/parquet_text.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s FILE COLUMN\n", argv[0]);
    return 2;
  }
  try {
    const auto start = std::chrono::steady_clock::now();
    meshtrain::ParquetTextReader reader(argv[1], argv[2]);
    size_t documents = 0, text_bytes = 0;
    while (const std::optional<std::string_view> text = reader.next()) {
      ++documents;
      text_bytes += text->size();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("meshtrain ParquetTextReader: %zu documents, %zu bytes, %.3f s\n", documents, text_bytes,
                seconds);
  } catch (const meshtrain::MeshError& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 1;
  }
  return 0;
}
