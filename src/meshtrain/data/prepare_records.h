// `meshtrain prepare --tokenizer`: raw pre-training sources (text, JSON Lines, Parquet; compressed, many
// files) streamed through a given tokenizer into token shards and an index, on every thread and over ranks.
// The output depends only on (source files, tokenizer, column, validation fraction), never on threads or
// ranks.
//
// Layout under the output folder:
//   train/FFFFF-PPP.tokens, validation/FFFFF-PPP.tokens  input file F's documents (F: its index in the
//       sorted source files), part P; a part is cut after the document that takes it to shard_tokens tokens
//   files/FFFFF.json  input file F's parts, written (atomically) by the rank that tokenized it
//   index.json        both splits' shards in order, the arguments, the tokenizer and the sources'
//       fingerprint; written last, atomically, and removed first, so a run stopped midway leaves none
// Document j (0-based, in its file) is a validation document when floor((j + 1) f) > floor(j f): one in
// every 1/f, spread evenly through every file, the same whatever reads it.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace meshtrain {

// Tokens in a part before it is cut (256 Mi tokens, 512 MiB at 2 bytes a token).
inline constexpr uint64_t kPrepareShardTokens = uint64_t{1} << 28;

struct PrepareProgress {
  uint64_t bytes_read = 0, bytes_total = 0;  // this rank's input files, as stored (compressed where they are)
  uint64_t documents = 0, tokens = 0;        // tokenized so far by this rank, EOS included
};

struct PrepareRecordsOptions {
  std::string source;          // a file, folder or glob (resolve_source_files)
  std::string tokenizer_path;  // what Tokenizer::load takes
  std::string out_dir;
  std::string column = "text";
  // The settings that gave the source and the column, for hints: prepare's flags, or train's config keys.
  std::string path_setting = "--corpus", column_setting = "--column";
  double validation_fraction = 0.05;  // in [0, 1)
  int threads = 0;                    // encoding threads; 0: OpenMP's default
  uint64_t shard_tokens = kPrepareShardTokens;
  // Ranks of a job that prepare one output together: each tokenizes its share of the files, rank 0 writes the
  // index. wait_for_all_ranks returns when every rank has called it (a barrier); nothing for one process.
  int rank = 0, world_size = 1;
  std::function<void()> wait_for_all_ranks = [] {};
  // Called before the first batch of documents (on the calling thread) and after each (on the thread that
  // appends them; never two calls at once).
  std::function<void(const PrepareProgress&)> progress = [](const PrepareProgress&) {};
};

struct PrepareRecordsResult {
  std::string index_path;
  bool skipped = false;  // index.json already described these arguments, sources and verified outputs
  nlohmann::json index;  // what index.json holds (rank 0; other ranks: empty)
};

// Resolves the source's files, tokenizes this rank's share and, on rank 0 once all ranks are done, writes
// index.json. MeshErrors: the readers' (naming the file and line), a tokenizer without an end-of-text id, an
// output that cannot be written. On any error no index.json is left.
PrepareRecordsResult prepare_records(const PrepareRecordsOptions& options);

// Which input files each rank tokenizes: files by size, largest first (ties: lower index), each to the rank
// with the fewest bytes so far (ties: lower rank). Result: per rank, its files' indices in input order.
std::vector<std::vector<size_t>> assign_files_to_ranks(const std::vector<uint64_t>& file_bytes,
                                                       int world_size);

// Whether document `index` (0-based, in its file) goes to validation under `fraction`.
bool is_validation_document(uint64_t index, double fraction);

// The shards of `split` ("train" or "validation") that `index_path` lists, in order, each checked to exist
// (a MeshError naming the index and the shard and the fix otherwise).
std::vector<std::string> shards_of_index(const std::string& index_path, const std::string& split);

}  // namespace meshtrain
