// Raw sources -> token shards + index.json (prepare_records.h): the rank's files read in batches on a reader
// thread (decompressed, cut into lines), decoded (JSON parsed) and encoded on every thread, appended in
// order, split by the documents' index, to parts streamed to disk (FilePipeline); rank 0 gathers the files'
// part lists into the index once every rank is done.
#include "meshtrain/data/prepare_records.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <system_error>
#include <thread>

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
// A batch: documents read while earlier batches are encoded. Large enough that handing it between threads
// costs little, small enough that the batches in flight keep memory flat.
constexpr size_t kBatchTextBytes = size_t{4} << 20;
constexpr size_t kBatchDocuments = 32768;
// Batches in flight: one being read, two being encoded (threads move on to the next while the last
// documents of one finish), one being appended.
constexpr size_t kBatchesInFlight = 4;
// Documents an encoding thread takes at a time: few enough that the threads finish a batch together, text
// enough that taking them (under the pipeline's lock) is a small share of encoding them.
constexpr size_t kClaimTextBytes = size_t{64} << 10;

std::string numbered(size_t number, int digits) {
  char text[32];
  std::snprintf(text, sizeof text, "%0*zu", digits, number);
  return text;
}

std::string file_stem(size_t file) {
  return numbered(file, 5);
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

// One batch of one input file's documents (JSON lines not yet decoded: the encoding threads do that) and,
// once encoded, their ids. A batch of no documents marks the end of its file. Batches are reused: their
// records and id buffers keep their memory, which fresh ones would take (and fault in) from the system.
struct Batch {
  uint64_t sequence = 0;                       // in reading order, over all of the rank's files
  size_t file = 0;                             // input file index
  std::shared_ptr<const RecordReader> reader;  // the file's reader: decode() and its errors
  std::vector<Record> records;                 // the first `count` hold the batch
  size_t count = 0;
  uint64_t bytes_read = 0;  // the rank's input bytes read once this batch was, for progress
  // Documents [0, claimed) taken by encoding threads, `encoded` of them done.
  size_t claimed = 0, encoded = 0;
  struct Document {
    size_t thread, start, tokens;  // its ids: ids_by_thread[thread][start, start + tokens)
    size_t text_bytes;
  };
  std::vector<Document> documents;
  std::vector<std::vector<int32_t>> ids_by_thread;
};

// The rank's files tokenized by threads that each carry on as soon as they can, never waiting for one
// another at a batch's end: a reader (decompresses, cuts lines), `threads` encoders (decode JSON, encode;
// each takes the next few documents of the oldest batch with any left) and an appender (batches in reading
// order to their file's parts; files/FFFFF.json at a file's end). Reading starts on construction, so that
// it overlaps loading the tokenizer; run() adds the others. The first error in reading order wins whatever
// the threads' timing: after an error, the batches read up to the failing one are still encoded (an
// earlier document's error replaces a later one's) and nothing later is taken.
class FilePipeline {
 public:
  FilePipeline(const PrepareRecordsOptions& options, const std::vector<std::string>& files,
               const std::vector<size_t>& mine, const std::vector<uint64_t>& file_bytes)
      : options_(options), files_(files), mine_(mine), file_bytes_(file_bytes), batches_(kBatchesInFlight) {
    for (Batch& batch : batches_) {
      batch.ids_by_thread.resize(static_cast<size_t>(encoding_threads(options.threads)));
      free_.push_back(&batch);
    }
    reader_ = std::thread([this] { read(); });
  }

  FilePipeline(const FilePipeline&) = delete;
  FilePipeline& operator=(const FilePipeline&) = delete;

  ~FilePipeline() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    join_all();
  }

  // Tokenizes every file of the rank; rethrows the first error in reading order.
  void run(const Tokenizer& tokenizer, int32_t eos_id, PrepareProgress& progress) {
    for (size_t thread = 0; thread < batches_.front().ids_by_thread.size(); ++thread) {
      encoders_.emplace_back([this, &tokenizer, thread] { encode(tokenizer, thread); });
    }
    appender_ = std::thread([this, &tokenizer, eos_id, &progress] { append(tokenizer, eos_id, progress); });
    join_all();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // An error's place in reading order: its batch, then its document (-1: the batch as a whole, when reading
  // or appending it).
  using Place = std::pair<uint64_t, int64_t>;

  void fail_at(Place place) {
    {
      const std::lock_guard lock(mutex_);
      if (!error_ || place < error_place_) {
        error_ = std::current_exception();
        error_place_ = place;
      }
    }
    changed_.notify_all();
  }

  // Whether batch `sequence` is past what is still worked on.
  bool halted(uint64_t sequence) const { return stopping_ || (error_ && sequence > error_place_.first); }

  void join_all() {
    if (reader_.joinable()) reader_.join();
    for (std::thread& encoder : encoders_) {
      if (encoder.joinable()) encoder.join();
    }
    if (appender_.joinable()) appender_.join();
  }

  void read() {
    RecordOptions record_options;
    record_options.column = options_.column;
    record_options.column_setting = options_.column_setting;
    record_options.path_setting = options_.path_setting;
    uint64_t bytes_before_file = 0, sequence = 0;
    try {
      for (const size_t file : mine_) {
        const auto reader =
            std::make_shared<RecordReader>(std::vector<std::string>{files_[file]}, record_options);
        bool end_of_file = false;
        while (!end_of_file) {
          Batch* batch = nullptr;
          {
            std::unique_lock lock(mutex_);
            changed_.wait(lock, [&] { return halted(sequence) || !free_.empty(); });
            if (halted(sequence)) return;
            batch = free_.back();
            free_.pop_back();
          }
          read_batch(*reader, *batch);
          end_of_file = batch->count == 0;
          batch->sequence = sequence++;
          batch->file = file;
          batch->reader = reader;
          batch->bytes_read = bytes_before_file + (end_of_file ? file_bytes_[file] : reader->bytes_read());
          {
            const std::lock_guard lock(mutex_);
            in_order_.push_back(batch);
            if (!end_of_file) open_.push_back(batch);
          }
          changed_.notify_all();
        }
        bytes_before_file += file_bytes_[file];
      }
      {
        const std::lock_guard lock(mutex_);
        reading_done_ = true;
      }
      changed_.notify_all();
    } catch (...) {
      fail_at({sequence, -1});
    }
  }

  static void read_batch(RecordReader& reader, Batch& batch) {
    size_t text_bytes = 0;
    batch.count = batch.claimed = batch.encoded = 0;
    while (text_bytes < kBatchTextBytes && batch.count < kBatchDocuments) {
      if (batch.count == batch.records.size()) batch.records.emplace_back();
      Record& record = batch.records[batch.count];
      if (!reader.next_undecoded(record)) break;
      text_bytes += record.text.size();
      ++batch.count;
    }
    batch.documents.resize(batch.count);
    for (std::vector<int32_t>& ids : batch.ids_by_thread) ids.clear();
  }

  void encode(const Tokenizer& tokenizer, size_t thread) {
    while (true) {
      Batch* batch = nullptr;
      size_t begin = 0, end = 0;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || error_ || reading_done_ || !open_.empty(); });
        if (open_.empty() || halted(open_.front()->sequence)) {
          if (stopping_ || error_ || reading_done_) return;
          continue;
        }
        batch = open_.front();
        begin = end = batch->claimed;
        for (size_t text = 0; end < batch->count && text < kClaimTextBytes; ++end) {
          text += batch->records[end].text.size();
        }
        batch->claimed = end;
        if (end == batch->count) open_.pop_front();
      }
      std::vector<int32_t>& ids = batch->ids_by_thread[thread];
      for (size_t i = begin; i < end; ++i) {
        try {
          Record& record = batch->records[i];
          batch->reader->decode(record);
          const size_t start = ids.size();
          tokenizer.encode_append(record.text, ids);
          batch->documents[i] = {thread, start, ids.size() - start, record.text.size()};
        } catch (...) {
          fail_at({batch->sequence, static_cast<int64_t>(i)});
        }
      }
      bool batch_done = false;
      {
        const std::lock_guard lock(mutex_);
        batch->encoded += end - begin;
        batch_done = batch->encoded == batch->count;
      }
      if (batch_done) changed_.notify_all();
    }
  }

  void append(const Tokenizer& tokenizer, int32_t eos_id, PrepareProgress& progress) {
    const fs::path out_dir(options_.out_dir);
    const uint32_t width = shard_width_for(tokenizer.vocab_size());
    std::optional<SplitWriter> train, validation;
    uint64_t document = 0;  // in its file
    uint64_t sequence = 0;
    try {
      while (true) {
        Batch* batch = nullptr;
        {
          std::unique_lock lock(mutex_);
          changed_.wait(lock, [&] {
            return stopping_ || error_ || (reading_done_ && in_order_.empty()) ||
                   (!in_order_.empty() && in_order_.front()->encoded == in_order_.front()->count);
          });
          if (stopping_ || error_ || in_order_.empty()) return;
          batch = in_order_.front();
          in_order_.pop_front();
        }
        sequence = batch->sequence;
        if (!train) {
          const std::string stem = file_stem(batch->file);
          train.emplace(out_dir, "train", stem, options_.shard_tokens, eos_id, width);
          validation.emplace(out_dir, "validation", stem, options_.shard_tokens, eos_id, width);
        }
        for (size_t i = 0; i < batch->count; ++i) {
          const Batch::Document& encoded = batch->documents[i];
          const std::span<const int32_t> ids(batch->ids_by_thread[encoded.thread].data() + encoded.start,
                                             encoded.tokens);
          (is_validation_document(document++, options_.validation_fraction) ? *validation : *train)
              .add(ids, encoded.text_bytes);
          progress.tokens += ids.size() + 1;
        }
        progress.documents += batch->count;
        progress.bytes_read = batch->bytes_read;
        if (batch->count == 0) {  // the file's end
          const json record = {{"file", files_[batch->file]},
                               {"train", train->finish()},
                               {"validation", validation->finish()}};
          write_file_atomically((out_dir / "files" / (file_stem(batch->file) + ".json")).string(),
                                record.dump(1) + "\n");
          train.reset();
          validation.reset();
          document = 0;
        }
        options_.progress(progress);
        {
          const std::lock_guard lock(mutex_);
          free_.push_back(batch);
        }
        changed_.notify_all();
      }
    } catch (...) {
      fail_at({sequence, -1});
    }
  }

  const PrepareRecordsOptions& options_;
  const std::vector<std::string>& files_;
  const std::vector<size_t>& mine_;
  const std::vector<uint64_t>& file_bytes_;
  std::vector<Batch> batches_;

  std::mutex mutex_;  // guards what follows and the batches' claimed and encoded counts
  std::condition_variable changed_;
  std::vector<Batch*> free_;     // batches to read into
  std::deque<Batch*> in_order_;  // read, not yet appended, in reading order
  std::deque<Batch*> open_;      // read, with documents no encoding thread has taken yet
  bool reading_done_ = false, stopping_ = false;
  std::exception_ptr error_;  // the first error in reading order so far, at error_place_
  Place error_place_{0, 0};

  std::thread reader_, appender_;
  std::vector<std::thread> encoders_;
};

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
        if (!shard_still_written((out_dir / shard.at("path").get<std::string>()).string(),
                                 shard.at("checksum").get<uint32_t>(), shard.at("tokens").get<uint64_t>())) {
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
  std::vector<uint64_t> file_bytes;
  for (const FileFingerprint& file : fingerprint) file_bytes.push_back(file.bytes);
  const std::vector<size_t> mine =
      assign_files_to_ranks(file_bytes, options.world_size)[static_cast<size_t>(options.rank)];
  // Reading (no output yet) starts while the tokenizer loads; dropped unread if the outputs are current.
  FilePipeline pipeline(options, files, mine, file_bytes);
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

  PrepareProgress progress;
  for (size_t file : mine) progress.bytes_total += file_bytes[file];
  options.progress(progress);
  pipeline.run(tokenizer, *eos, progress);
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
