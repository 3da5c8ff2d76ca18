// `meshtrain prepare`: reads the flags (listed in commands.cpp), runs the dataset pipeline (data/prepare.h)
// or, with --tokenizer, the streaming one over raw sources (data/prepare_records.h) on every rank of the job,
// and prints its summary.
#include "meshtrain/cli/prepare.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "meshtrain/cli/arguments.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/process_placement.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/data/prepare_records.h"
#include "meshtrain/data/records/source_files.h"
#include "meshtrain/metrics/progress.h"

namespace meshtrain {
namespace {

using json = nlohmann::json;

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

void print_summary(const json& summary, const std::string& out_dir, bool skipped, std::ostream& out) {
  out << (skipped
              ? "prepare: " + out_dir + " is up to date (same arguments, corpus and outputs); nothing to do\n"
              : "prepare: wrote " + out_dir + "\n");
  out << "  corpus " << summary["arguments"]["corpus"].get<std::string>() << ", tokenizer vocab "
      << summary["vocab_size"].get<int64_t>() << " (EOS id " << summary["eos_id"].get<int32_t>() << ")\n";
  for (const char* split : {"train", "validation"}) {
    const json& figures = summary[split];
    const auto tokens = figures["tokens"].get<uint64_t>();
    const auto bytes = figures["text_bytes"].get<uint64_t>();
    out << "  " << split << ": " << figures["documents"].get<uint64_t>() << " documents, " << bytes
        << " text bytes, " << tokens << " tokens"
        << (tokens > 0
                ? " (" + fixed(static_cast<double>(bytes) / static_cast<double>(tokens), 2) + " bytes/token)"
                : std::string())
        << ", shard " << figures["shard_bytes"].get<uint64_t>() << " bytes\n";
  }
  const json& entropy = summary["validation_unigram_cross_entropy_nats"];
  out << "  validation unigram cross-entropy: "
      << (entropy.is_number() ? fixed(entropy.get<double>(), 4) + " nats/token" : std::string("n/a (empty)"))
      << " (the loss of a model that knows only token frequencies)\n";
  const json& seconds = summary["seconds"];
  out << (skipped ? "  seconds (when made): read " : "  seconds: read ")
      << fixed(seconds["read"].get<double>(), 2) << ", train tokenizer "
      << fixed(seconds["train_tokenizer"].get<double>(), 2) << ", tokenize "
      << fixed(seconds["tokenize"].get<double>(), 2) << ", write " << fixed(seconds["write"].get<double>(), 2)
      << ", total " << fixed(seconds["total"].get<double>(), 2) << "\n";
}

std::string megabytes(double bytes) {
  return fixed(bytes / 1e6, 1) + " MB";
}

// "1.23M": a count in a few characters.
std::string count_text(uint64_t count) {
  const double value = static_cast<double>(count);
  if (value >= 1e9) return fixed(value / 1e9, 2) + "G";
  if (value >= 1e6) return fixed(value / 1e6, 2) + "M";
  if (value >= 1e4) return fixed(value / 1e3, 1) + "k";
  return std::to_string(count);
}

// "prepare 123.4/512.0 MB [####......] 24% | 10.2k docs | 2.10M tokens | 12.3 MB/s | ETA 31s".
class PrepareProgressBar {
 public:
  explicit PrepareProgressBar(std::FILE* stream) : stream_(stream) {}

  void update(const PrepareProgress& progress) {
    figures_ = progress;
    if (!bar_) {
      bar_.emplace(static_cast<int64_t>(progress.bytes_total), stream_,
                   [this](int64_t done, int64_t total, double eta_seconds, int columns) {
                     const double seconds = std::max(1e-9, now() - start_);
                     const double fraction =
                         total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
                     const std::string head = "prepare " + fixed(static_cast<double>(done) / 1e6, 1) + "/" +
                                              megabytes(static_cast<double>(total));
                     const std::string tail = " " + std::to_string(static_cast<int>(fraction * 100.0)) +
                                              "% | " + count_text(figures_.documents) + " docs | " +
                                              count_text(figures_.tokens) + " tokens | " +
                                              fixed(static_cast<double>(done) / 1e6 / seconds, 1) +
                                              " MB/s | ETA " + format_duration(eta_seconds);
                     return format_bar_line(head, fraction, tail, columns);
                   });
    }
    bar_->advance(static_cast<int64_t>(progress.bytes_read), now());
  }
  void finish() {
    if (bar_) bar_->finish();
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  std::FILE* stream_;
  double start_ = now();
  PrepareProgress figures_;
  std::optional<ProgressBar> bar_;
};

void print_records_summary(const json& index, const std::string& out_dir, bool skipped, std::ostream& out) {
  out << (skipped
              ? "prepare: " + out_dir +
                    " is up to date (index.json matches the arguments, tokenizer and files); nothing to do\n"
              : "prepare: wrote " + out_dir + " (index " + out_dir + "/index.json)\n");
  const json& tokenizer = index["tokenizer"];
  const auto input_bytes = index["input_bytes"].get<uint64_t>();
  out << "  source " << index["sources"]["source"].get<std::string>() << ": "
      << index["sources"]["files"].size() << " files, " << megabytes(static_cast<double>(input_bytes))
      << " as stored; tokenizer " << tokenizer["path"].get<std::string>() << " (vocab "
      << tokenizer["vocab_size"].get<int64_t>() << ", EOS id " << tokenizer["eos_id"].get<int32_t>() << ")\n";
  uint64_t text_bytes = 0;
  for (const char* split : {"train", "validation"}) {
    const json& figures = index[split];
    const auto tokens = figures["tokens"].get<uint64_t>();
    const auto bytes = figures["text_bytes"].get<uint64_t>();
    text_bytes += bytes;
    out << "  " << split << ": " << figures["documents"].get<uint64_t>() << " documents, " << bytes
        << " text bytes, " << tokens << " tokens (EOS included)"
        << (tokens > 0
                ? " (" + fixed(static_cast<double>(bytes) / static_cast<double>(tokens), 2) + " bytes/token)"
                : std::string())
        << ", " << figures["shards"].size() << " shards\n";
  }
  const double seconds = index["seconds"].get<double>();
  out << (skipped ? "  when made: " : "  ") << fixed(seconds, 2) << " s on " << index["ranks"].get<int>()
      << " rank(s), " << fixed(static_cast<double>(input_bytes) / 1e6 / seconds, 1) << " MB/s as stored, "
      << fixed(static_cast<double>(text_bytes) / 1e6 / seconds, 1) << " MB/s of text\n";
}

// Raw sources through an existing tokenizer, on every rank of the job (one process without mpirun).
int run_prepare_records(const ParsedArguments& parsed, std::ostream& out) {
  PrepareRecordsOptions options;
  options.source = parsed.required("--corpus", "a file, folder or glob of the source's files");
  options.tokenizer_path = *parsed.value("--tokenizer");
  options.out_dir = parsed.required("--out", "an output folder (the default data/kjv is the KJV's)");
  if (const std::string* column = parsed.value("--column")) options.column = *column;
  if (options.column.empty())
    fail(parsed.where("--column"), "a column name", "an empty name", parsed.usage_hint());
  options.validation_fraction = parsed.number("--validation-fraction", options.validation_fraction);
  options.threads = static_cast<int>(parsed.integer("--threads", 0, 1));
  if (parsed.has("--vocab-size")) {
    fail(parsed.where("--vocab-size"),
         "no --vocab-size with --tokenizer (the tokenizer fixes its vocabulary)",
         "--vocab-size " + *parsed.value("--vocab-size"), "drop --vocab-size, or --tokenizer to train one");
  }
  // Each rank waits at the barriers for the others' whole files: hours on a large corpus.
  constexpr double kBarrierTimeoutSeconds = 30.0 * 86400.0;
  const std::unique_ptr<Communicator> world = make_world_communicator(kBarrierTimeoutSeconds);
  options.rank = world->rank();
  options.world_size = world->size();
  options.wait_for_all_ranks = [&world] { world->barrier("prepare"); };
  // Ranks on one host share its cores (or take SLURM's cores per task), as train's do.
  if (!parsed.has("--threads") && world->size() > 1) {
    options.threads = static_cast<int>(
        discover_process_placement(*world, static_cast<int64_t>(std::thread::hardware_concurrency())).threads);
  }
  PrepareProgressBar bar(stderr);
  if (options.rank == 0) options.progress = [&bar](const PrepareProgress& progress) { bar.update(progress); };
  PrepareRecordsResult result;
  try {
    result = prepare_records(options);
  } catch (const MeshError& error) {
    if (world->size() == 1) throw;
    // The other ranks wait at a barrier this rank will never reach.
    std::fprintf(stderr, "meshtrain: error: rank %d: %s\n", world->rank(), error.what());
    world->abort_all_ranks(1);
  }
  bar.finish();
  if (options.rank == 0) print_records_summary(result.index, options.out_dir, result.skipped, out);
  return 0;
}

}  // namespace

int run_prepare(const std::vector<std::string>& arguments, std::ostream& out) {
  const ParsedArguments parsed = parse_arguments(find_command("prepare"), arguments);
  if (parsed.has("--tokenizer")) return run_prepare_records(parsed, out);
  for (const char* flag : {"--column", "--threads"}) {
    if (parsed.has(flag)) {
      fail(parsed.where(flag), std::string(flag) + " with --tokenizer (the streaming path)", "no --tokenizer",
           "add --tokenizer PATH, or drop " + std::string(flag));
    }
  }
  PrepareOptions options;
  if (const std::string* value = parsed.value("--out")) options.out_dir = *value;
  if (const std::string* value = parsed.value("--corpus")) {
    options.corpus = *value;
    if (value->empty())
      fail(parsed.where("--corpus"), "a file or folder", "an empty path", parsed.usage_hint());
    if (holds_records(*value)) {
      fail(parsed.where("--corpus"), "text files (a tokenizer is trained on them) without --tokenizer",
           *value + ": JSON Lines, Parquet or a glob",
           "add --tokenizer PATH (the model's tokenizer.json, or one prepare trained on a text sample)");
    }
  }
  options.vocab_size = parsed.integer("--vocab-size", options.vocab_size, 1);
  options.validation_fraction = parsed.number("--validation-fraction", options.validation_fraction);
  const PrepareResult result = prepare_dataset(options);
  print_summary(result.summary, options.out_dir, result.skipped, out);
  return 0;
}

}  // namespace meshtrain
