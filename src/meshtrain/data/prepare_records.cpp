// Raw sources -> token shards + index.json (prepare_records.h): per input file, documents read in batches on
// a reader thread (decompressed, cut into lines) while the previous batch is decoded (JSON parsed) and
// encoded on every thread and the one before it is appended, split by the documents' index, to parts
// streamed to disk; rank 0 gathers the files' part lists into the index once every rank is done.
#include "meshtrain/data/prepare_records.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <future>
#include <numeric>
#include <optional>
#include <span>
#include <system_error>

#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/records/fingerprint.h"
#include "meshtrain/data/records/record_reader.h"
#include "meshtrain/data/records/source_files.h"
#include "meshtrain/data/shards.h"
#include "meshtrain/data/tokenizer/tokenizer.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kIndexFormat = "meshtrain-prepare-index";
constexpr int kIndexVersion = 1;
constexpr const char* kSplits[] = {"train", "validation"};
// A batch: documents read while the previous batch is encoded. Large enough that the threads' uneven finish
// at its end is a small share of it, small enough to keep memory flat.
constexpr size_t kBatchTextBytes = size_t{8} << 20;
constexpr size_t kBatchDocuments = 65536;

std::string numbered(size_t number, int digits) {
  char text[32];
  std::snprintf(text, sizeof text, "%0*zu", digits, number);
  return text;
}

std::string file_stem(size_t file) {
  return numbered(file, 5);
}

// The documents of one batch (JSON lines not yet decoded: that is done on the encoding threads), and where
// the reader stood after them. Two batches take turns, read into in place: their records keep their strings'
// memory from batch to batch, which fresh ones would take (and fault in) from the system each time.
struct Batch {
  std::vector<Record> records;  // the first `count` hold the batch
  size_t count = 0;
  uint64_t bytes_read = 0;
};

void read_batch(RecordReader& reader, Batch& batch) {
  size_t text_bytes = 0;
  batch.count = 0;
  while (text_bytes < kBatchTextBytes && batch.count < kBatchDocuments) {
    if (batch.count == batch.records.size()) batch.records.emplace_back();
    Record& record = batch.records[batch.count];
    if (!reader.next_undecoded(record)) break;
    text_bytes += record.text.size();
    ++batch.count;
  }
  batch.bytes_read = reader.bytes_read();
}

// One split of one input file: its documents' tokens, each followed by EOS, cut into parts of at least
// shard_tokens tokens (the last one shorter). A part streams to disk as it grows (TokenShardWriter).
class SplitWriter {
 public:
  SplitWriter(const fs::path& out_dir, std::string split, std::string stem, uint64_t shard_tokens,
              int32_t eos_id, uint32_t width)
      : out_dir_(out_dir),
        split_(std::move(split)),
        stem_(std::move(stem)),
        shard_tokens_(shard_tokens),
        eos_id_(eos_id),
        width_(width) {}

  void add(std::span<const int32_t> document, size_t text_bytes) {
    if (!part_) part_.emplace((out_dir_ / part_name()).string(), width_);
    part_->append(document);
    part_->append(std::span<const int32_t>(&eos_id_, 1));
    ++documents_;
    text_bytes_ += text_bytes;
    if (part_->size() >= shard_tokens_) cut();
  }

  // The parts written, after the last one.
  json finish() {
    if (part_) cut();
    return parts_;
  }

 private:
  std::string part_name() const {
    return split_ + "/" + stem_ + "-" + numbered(parts_.size(), 3) + ".tokens";
  }

  void cut() {
    const std::string name = part_name();
    const ShardSummary summary = part_->finish();
    part_.reset();
    parts_.push_back({{"path", name},
                      {"tokens", summary.token_count},
                      {"documents", documents_},
                      {"text_bytes", text_bytes_},
                      {"checksum", summary.checksum}});
    documents_ = text_bytes_ = 0;
  }

  fs::path out_dir_;
  std::string split_, stem_;
  uint64_t shard_tokens_;
  int32_t eos_id_;
  uint32_t width_;
  std::optional<TokenShardWriter> part_;  // the part being written, if any
  uint64_t documents_ = 0, text_bytes_ = 0;
  json parts_ = json::array();
};

// One batch's documents encoded, with what the writers and the progress need of the batch once its records
// are being read into again. The ids go to a buffer per encoding thread (kept from batch to batch), not to
// a vector per document: each document's vector is freed at once on the thread that made it.
struct EncodedBatch {
  struct Document {
    int thread;
    size_t start, tokens, text_bytes;  // its ids: buffers[thread][start, start + tokens)
  };
  std::vector<std::vector<int32_t>> buffers;
  std::vector<Document> documents;
  uint64_t bytes_read = 0;
};

// What this rank has done so far, for the progress callback.
struct RankProgress {
  PrepareProgress figures;
  uint64_t bytes_of_files_done = 0;
};

// Tokenizes input file `file` into its parts and records them in files/FFFFF.json.
void prepare_file(const PrepareRecordsOptions& options, const std::vector<std::string>& files, size_t file,
                  const Tokenizer& tokenizer, int32_t eos_id, uint64_t file_bytes, RankProgress& progress) {
  const fs::path out_dir(options.out_dir);
  RecordOptions record_options;
  record_options.column = options.column;
  record_options.column_setting = options.column_setting;
  record_options.path_setting = options.path_setting;
  RecordReader reader({files[file]}, record_options);
  const uint32_t width = shard_width_for(tokenizer.vocab_size());
  SplitWriter train(out_dir, "train", file_stem(file), options.shard_tokens, eos_id, width);
  SplitWriter validation(out_dir, "validation", file_stem(file), options.shard_tokens, eos_id, width);
  uint64_t document = 0;
  // Appends a batch to the writers, in document order; runs on its own thread while the next batch encodes.
  const auto append = [&](const EncodedBatch& encoded) {
    for (const EncodedBatch::Document& encoded_document : encoded.documents) {
      const std::span<const int32_t> ids(
          encoded.buffers[static_cast<size_t>(encoded_document.thread)].data() + encoded_document.start,
          encoded_document.tokens);
      (is_validation_document(document++, options.validation_fraction) ? validation : train)
          .add(ids, encoded_document.text_bytes);
      progress.figures.tokens += ids.size() + 1;
    }
    progress.figures.documents += encoded.documents.size();
    progress.figures.bytes_read = progress.bytes_of_files_done + encoded.bytes_read;
  };
  // Three stages at once: batch N+1 read, batch N encoded, batch N-1 appended. Two batches of records and two
  // of encoded documents take turns; an encoded batch is reused only once its append is done.
  Batch batches[2];
  EncodedBatch encoded_batches[2];
  int current = 0;
  std::future<void> next =
      std::async(std::launch::async, [&reader, &first = batches[0]] { read_batch(reader, first); });
  std::future<void> appended;
  while (true) {
    next.get();
    Batch& batch = batches[current];
    if (batch.count == 0) break;
    EncodedBatch& encoded = encoded_batches[current];
    current ^= 1;
    next =
        std::async(std::launch::async, [&reader, &spare = batches[current]] { read_batch(reader, spare); });
    std::vector<Record>& records = batch.records;
    encoded.buffers.resize(static_cast<size_t>(encoding_threads(options.threads)));
    for (std::vector<int32_t>& buffer : encoded.buffers) buffer.clear();
    encoded.documents.resize(batch.count);
    encode_each_in_parallel(
        tokenizer, batch.count,
        [&](size_t i) {
          reader.decode(records[i]);
          return std::string_view(records[i].text);
        },
        [&](size_t i, int thread, std::vector<int32_t>&& ids) {
          std::vector<int32_t>& buffer = encoded.buffers[static_cast<size_t>(thread)];
          encoded.documents[i] = {thread, buffer.size(), ids.size(), records[i].text.size()};
          buffer.insert(buffer.end(), ids.begin(), ids.end());
        },
        options.threads);
    encoded.bytes_read = batch.bytes_read;
    if (appended.valid()) {
      appended.get();
      options.progress(progress.figures);
    }
    appended = std::async(std::launch::async, [&append, &encoded] { append(encoded); });
  }
  if (appended.valid()) {
    appended.get();
    options.progress(progress.figures);
  }
  progress.bytes_of_files_done += file_bytes;
  const bool moved = progress.figures.bytes_read != progress.bytes_of_files_done;
  progress.figures.bytes_read = progress.bytes_of_files_done;
  const json record = {{"file", files[file]}, {"train", train.finish()}, {"validation", validation.finish()}};
  write_file_atomically((out_dir / "files" / (file_stem(file) + ".json")).string(), record.dump(1) + "\n");
  if (moved) options.progress(progress.figures);
}

json arguments_json(const PrepareRecordsOptions& options) {
  return {{"column", options.column},
          {"validation_fraction", options.validation_fraction},
          {"validation_rule", "document j of a file (0-based) when floor((j+1)*f) > floor(j*f)"},
          {"shard_tokens", options.shard_tokens}};
}

json tokenizer_json(const PrepareRecordsOptions& options, const Tokenizer& tokenizer, int32_t eos_id) {
  return {{"path", fs::absolute(options.tokenizer_path).lexically_normal().string()},
          {"identity", tokenizer.identity()},
          {"vocab_size", tokenizer.vocab_size()},
          {"eos_id", eos_id}};
}

// True when the index at `index_path` holds these arguments, tokenizer and sources, and every shard it lists
// is whole (TokenShard::open checks its checksum) with the tokens it records.
bool index_current(const std::string& index_path, const json& expected, json& index) {
  std::error_code error;
  if (!fs::is_regular_file(index_path, error)) return false;
  try {
    index = json::parse(read_file_text(index_path, "prepare index"));
    for (const char* key : {"format", "version", "arguments", "tokenizer", "sources"}) {
      if (index.at(key) != expected.at(key)) return false;
    }
    const fs::path out_dir = fs::path(index_path).parent_path();
    for (const char* split : kSplits) {
      for (const json& shard : index.at(split).at("shards")) {
        const fs::path path = out_dir / shard.at("path").get<std::string>();
        if (!fs::is_regular_file(path, error)) return false;
        const TokenShard opened = TokenShard::open(path.string());
        if (opened.summary().checksum != shard.at("checksum").get<uint32_t>() ||
            opened.size() != shard.at("tokens").get<uint64_t>()) {
          return false;
        }
      }
    }
    return true;
  } catch (const std::exception&) {
    return false;  // anything unreadable or damaged: rebuild
  }
}

// Removes what an earlier prepare left in the output folder: the index first (the outputs are incomplete
// until it is written again), then the shards and file records of this layout, and nothing else.
void remove_old_outputs(const fs::path& out_dir) {
  std::error_code error;
  fs::remove(out_dir / "index.json", error);
  if (error)
    fail((out_dir / "index.json").string(), "a file prepare can remove", error.message(), "check --out");
  for (const auto& [folder, extension] :
       {std::pair{"train", ".tokens"}, {"validation", ".tokens"}, {"files", ".json"}}) {
    const fs::path dir = out_dir / folder;
    if (fs::is_directory(dir, error)) {
      for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
        // Also a part an interrupted run left under its temporary name (DurableFile: PATH.tmp.PID).
        const std::string name = entry.path().filename().string();
        if (entry.is_regular_file() && (entry.path().extension() == extension ||
                                        name.find(std::string(extension) + ".tmp.") != std::string::npos)) {
          fs::remove(entry.path());
        }
      }
    }
    fs::create_directories(dir, error);
    if (error) fail(dir.string(), "a folder prepare can create", error.message(), "check --out");
  }
}

// Both splits' shards in input-file order, from the files' records every rank wrote.
void gather_shards(const fs::path& out_dir, const std::vector<std::string>& files, json& index) {
  for (const char* split : kSplits)
    index[split] = {{"documents", 0}, {"text_bytes", 0}, {"tokens", 0}, {"shards", json::array()}};
  for (size_t file = 0; file < files.size(); ++file) {
    const std::string path = (out_dir / "files" / (file_stem(file) + ".json")).string();
    const json record =
        json::parse(read_file_text(path, "file record of prepare", "re-run meshtrain prepare"));
    if (record.at("file") != files[file]) {
      fail(path, "the record of input file " + files[file], "one of " + record.at("file").dump(),
           "re-run meshtrain prepare (never two at once into one --out)");
    }
    for (const char* split : kSplits) {
      json& figures = index[split];
      for (json shard : record.at(split)) {
        for (const char* key : {"documents", "text_bytes", "tokens"}) {
          figures[key] = figures[key].get<uint64_t>() + shard.at(key).get<uint64_t>();
        }
        shard["file"] = file;
        figures["shards"].push_back(std::move(shard));
      }
    }
  }
}

}  // namespace

bool is_validation_document(uint64_t index, double fraction) {
  const double j = static_cast<double>(index);
  return std::floor((j + 1.0) * fraction) > std::floor(j * fraction);
}

std::vector<std::vector<size_t>> assign_files_to_ranks(const std::vector<uint64_t>& file_bytes,
                                                       int world_size) {
  std::vector<size_t> by_size(file_bytes.size());
  std::iota(by_size.begin(), by_size.end(), size_t{0});
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](size_t a, size_t b) { return file_bytes[a] > file_bytes[b]; });
  std::vector<std::vector<size_t>> assigned(static_cast<size_t>(world_size));
  std::vector<uint64_t> load(static_cast<size_t>(world_size), 0);
  for (size_t file : by_size) {
    const size_t rank = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    assigned[rank].push_back(file);
    load[rank] += file_bytes[file];
  }
  for (auto& files : assigned) std::sort(files.begin(), files.end());
  return assigned;
}

std::vector<std::string> shards_of_index(const std::string& index_path, const std::string& split) {
  const std::string fix = "re-run meshtrain prepare with the same --out to rebuild it";
  json index;
  try {
    index = json::parse(read_file_text(index_path, "prepare index", fix));
  } catch (const json::exception& error) {
    fail(index_path, "a prepare index (JSON)", error.what(), fix);
  }
  if (index.value("format", "") != kIndexFormat || index.value("version", 0) != kIndexVersion ||
      !index.contains(split) || !index[split].contains("shards")) {
    fail(index_path,
         std::string(kIndexFormat) + " version " + std::to_string(kIndexVersion) + " with a '" + split +
             "' split",
         "another file or version", fix);
  }
  const fs::path out_dir = fs::path(index_path).parent_path();
  std::vector<std::string> shards;
  for (const json& shard : index[split]["shards"]) {
    const fs::path path = out_dir / shard.at("path").get<std::string>();
    std::error_code error;
    if (!fs::is_regular_file(path, error)) {
      fail(index_path, "the " + split + " shard " + path.string() + " it lists", "nothing at that path", fix);
    }
    shards.push_back(path.string());
  }
  if (shards.empty()) {
    fail(index_path, "at least one " + split + " shard", "none (no " + split + " documents)",
         split == "validation"
             ? "prepare with a --validation-fraction above 0, or leave eval_dataset_path empty"
             : "prepare a source with documents");
  }
  return shards;
}

PrepareRecordsResult prepare_records(const PrepareRecordsOptions& options) {
  if (options.out_dir.empty()) fail("--out", "an output folder", "an empty path");
  if (!(options.validation_fraction >= 0.0 && options.validation_fraction < 1.0)) {
    fail("--validation-fraction", "a share in [0, 1)", std::to_string(options.validation_fraction),
         "e.g. --validation-fraction 0.001");
  }
  const auto start = std::chrono::steady_clock::now();
  const fs::path out_dir(options.out_dir);
  PrepareRecordsResult result;
  result.index_path = (out_dir / "index.json").string();

  const std::vector<std::string> files = resolve_source_files(options.source, options.path_setting);
  const std::vector<FileFingerprint> fingerprint = fingerprint_files(files);
  const Tokenizer tokenizer = Tokenizer::load(options.tokenizer_path);
  const std::optional<int32_t> eos = tokenizer.eos_id();
  if (!eos) {
    fail(options.tokenizer_path, "a tokenizer with an end-of-text token (<|endoftext|>) to end each document",
         "none", "use a tokenizer that has <|endoftext|> (GPT-2's, Qwen3's tokenizer.json)");
  }
  json index = {
      {"format", kIndexFormat},
      {"version", kIndexVersion},
      {"arguments", arguments_json(options)},
      {"tokenizer", tokenizer_json(options, tokenizer, *eos)},
      {"sources", {{"source", options.source}, {"files", fingerprint_json(fingerprint).at("files")}}}};

  const double setup_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Every rank decides before rank 0 removes anything, so all of them see the same index.
  json existing;
  const bool current = index_current(result.index_path, index, existing);
  options.wait_for_all_ranks();
  if (current) {
    result.skipped = true;
    if (options.rank == 0) result.index = std::move(existing);
    return result;
  }
  if (options.rank == 0) remove_old_outputs(out_dir);
  options.wait_for_all_ranks();

  std::vector<uint64_t> file_bytes;
  for (const FileFingerprint& file : fingerprint) file_bytes.push_back(file.bytes);
  const std::vector<size_t> mine =
      assign_files_to_ranks(file_bytes, options.world_size)[static_cast<size_t>(options.rank)];
  RankProgress progress;
  for (size_t file : mine) progress.figures.bytes_total += file_bytes[file];
  options.progress(progress.figures);
  for (size_t file : mine) prepare_file(options, files, file, tokenizer, *eos, file_bytes[file], progress);
  options.wait_for_all_ranks();
  if (options.rank != 0) return result;

  gather_shards(out_dir, files, index);
  index["input_bytes"] = std::accumulate(file_bytes.begin(), file_bytes.end(), uint64_t{0});
  index["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  index["setup_seconds"] = setup_seconds;  // of `seconds`: files resolved and fingerprinted, tokenizer loaded
  index["ranks"] = options.world_size;
  write_file_atomically(result.index_path, index.dump(1) + "\n");
  result.index = std::move(index);
  return result;
}

}  // namespace meshtrain
