// The record reader (data/records/record_reader.h) on arbitrary bytes as a .jsonl, .jsonl.gz or .jsonl.zst
// file (the input's first byte picks which). Read in 7-byte chunks and in 1 MiB ones, the file must give the
// same documents, or an error both times (the same error for a plain file: a compressed one's damage is
// found at an offset that depends on the chunk, and lines before it may fail first), and every document must
// be valid UTF-8.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_files.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/records/record_reader.h"
#include "meshtrain/data/records/text_files.h"

namespace {

struct Outcome {
  std::vector<std::string> documents;
  std::string error;  // the MeshError's message, empty when none
};

// The documents of `path` read in chunks of `chunk_bytes`, up to the error if there is one.
Outcome read_documents(const std::string& path, size_t chunk_bytes) {
  using namespace meshtrain;
  Outcome outcome;
  RecordOptions options;
  options.chunk_bytes = chunk_bytes;
  try {
    RecordReader reader({path}, options);
    Record record;
    while (reader.next(record)) {
      if (invalid_utf8_offset(record.text) != std::string::npos) __builtin_trap();
      outcome.documents.push_back(record.text);
    }
  } catch (const MeshError& error) {
    // A rejected file is the expected outcome for most inputs.
    outcome.error = error.what();
  }
  return outcome;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const char* const names[] = {"data.jsonl", "data.jsonl.gz", "data.jsonl.zst"};
  const bool plain = data[0] % 3 == 0;
  const std::string path = meshtrain::fuzz::write_scratch_file(
      names[data[0] % 3], {reinterpret_cast<const char*>(data + 1), size - 1});
  const Outcome small = read_documents(path, 7);
  const Outcome large = read_documents(path, size_t{1} << 20);
  if (small.error.empty() != large.error.empty()) __builtin_trap();
  if ((small.error.empty() || plain) && (small.documents != large.documents || small.error != large.error)) {
    __builtin_trap();
  }
  return 0;
}
