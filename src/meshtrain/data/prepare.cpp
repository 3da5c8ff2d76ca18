// The dataset pipeline: corpus -> BPE tokenizer trained on the train split -> both splits tokenized in
// parallel -> token shards, with everything (arguments, checksums, figures) recorded in prepare.json.
#include "meshtrain/data/prepare.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>

#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kFormat = "meshtrain-prepare";
constexpr int kFormatVersion = 1;
constexpr const char* kEos = "<|endoftext|>";

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "a readable file", std::system_category().message(errno));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A fingerprint of the corpus as split: any edit to a document, or a change of split, changes it.
uint32_t corpus_checksum(const Corpus& corpus) {
  uint32_t crc = 0;
  for (const auto* split : {&corpus.train, &corpus.validation}) {
    for (const Document& document : *split) {
      const uint64_t size = document.text.size();
      crc = crc32c(&size, sizeof size, crc);
      crc = crc32c(document.text.data(), document.text.size(), crc);
    }
    const char separator = '|';
    crc = crc32c(&separator, 1, crc);
  }
  return crc;
}

json arguments_json(const PrepareOptions& options) {
  json arguments = {{"vocab_size", options.vocab_size}};
  if (options.corpus.empty()) {
    arguments["corpus"] = "kjv";
    arguments["validation_split"] = "chapter index % 20 == 19";
  } else {
    arguments["corpus"] = fs::absolute(options.corpus).lexically_normal().string();
    arguments["validation_fraction"] = options.validation_fraction;
  }
  return arguments;
}

std::vector<std::vector<int32_t>> encode_all(const Tokenizer& tokenizer,
                                             const std::vector<Document>& documents) {
  return encode_in_parallel(tokenizer, documents.size(),
                            [&](size_t i) { return std::string_view(documents[i].text); });
}

// -sum p ln p of the token distribution of `documents` (each followed by EOS, as in the shard); 0 tokens:
// NaN.
double unigram_entropy(const std::vector<std::vector<int32_t>>& documents, int32_t eos_id,
                       int64_t vocab_size) {
  std::vector<uint64_t> counts(static_cast<size_t>(vocab_size), 0);
  uint64_t total = 0;
  for (const auto& document : documents) {
    for (int32_t id : document) ++counts[static_cast<size_t>(id)];
    ++counts[static_cast<size_t>(eos_id)];
    total += document.size() + 1;
  }
  if (total == 0) return std::nan("");
  double entropy = 0;
  for (uint64_t count : counts) {
    if (count == 0) continue;
    const double p = static_cast<double>(count) / static_cast<double>(total);
    entropy -= p * std::log(p);
  }
  return entropy;
}

json split_figures(const std::vector<Document>& documents, const std::vector<std::vector<int32_t>>& encoded,
                   const ShardSummary& shard) {
  uint64_t bytes = 0;
  for (const Document& document : documents) bytes += document.text.size();
  return {{"documents", documents.size()},
          {"text_bytes", bytes},
          {"tokens", shard.token_count},  // EOS after each document included
          {"document_tokens", shard.token_count - encoded.size()},
          {"shard_bytes", shard.file_bytes},
          {"shard_checksum", shard.checksum}};
}

// True when prepare.json matches these arguments and corpus and every output still verifies.
bool outputs_current(const PrepareResult& paths, const json& arguments, uint32_t corpus_crc, json& summary) {
  std::error_code error;
  if (!fs::is_regular_file(paths.summary_path, error)) return false;
  try {
    summary = json::parse(read_file(paths.summary_path));
    if (summary.value("format", "") != kFormat || summary.value("version", 0) != kFormatVersion) return false;
    if (summary.at("arguments") != arguments || summary.at("corpus_checksum").get<uint32_t>() != corpus_crc) {
      return false;
    }
    if (!fs::is_regular_file(paths.tokenizer_path, error) ||
        checksum_file(paths.tokenizer_path, "a readable tokenizer file").crc32c !=
            summary.at("tokenizer_crc32c").get<uint32_t>()) {
      return false;
    }
    for (const auto& [split, path] :
         {std::pair{"train", paths.train_path}, {"validation", paths.validation_path}}) {
      const json& figures = summary.at(split);
      if (!shard_still_written(path, figures.at("shard_checksum").get<uint32_t>(),
                               figures.at("tokens").get<uint64_t>())) {
        return false;
      }
    }
    return true;
  } catch (const std::exception&) {
    return false;  // anything unreadable or damaged: rebuild
  }
}

}  // namespace

int encoding_threads(int threads) {
  return threads > 0 ? threads : omp_get_max_threads();
}

// Tokenizer::encode is const and keeps its caches per thread, so concurrent calls on one tokenizer are safe
// (tokenizer.cpp's BPE cache and PCRE2 match data are thread_local). Documents vary in length, so each thread
// takes the next one as it finishes.
std::vector<std::vector<int32_t>> encode_in_parallel(const Tokenizer& tokenizer, size_t count,
                                                     const std::function<std::string_view(size_t)>& text,
                                                     int threads) {
  std::vector<std::vector<int32_t>> encoded(count);
  std::exception_ptr error;
  auto error_at = static_cast<int64_t>(count);
#pragma omp parallel for schedule(dynamic, 1) num_threads(encoding_threads(threads))
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) {
    try {
      const auto index = static_cast<size_t>(i);
      encoded[index] = tokenizer.encode(text(index));
    } catch (...) {
#pragma omp critical(meshtrain_prepare_error)
      if (i < error_at) {
        error_at = i;
        error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
  return encoded;
}

TokenizedCorpus tokenize_corpus(const Corpus& corpus, const Tokenizer& tokenizer, int32_t eos_id,
                                const std::string& out_dir) {
  const fs::path dir(out_dir);
  TokenizedCorpus result;
  result.train_path = (dir / "train.tokens").string();
  result.validation_path = (dir / "validation.tokens").string();
  Clock::time_point phase = Clock::now();
  result.train = encode_all(tokenizer, corpus.train);
  result.validation = encode_all(tokenizer, corpus.validation);
  result.encode_seconds = seconds_since(phase);
  phase = Clock::now();
  result.train_shard = write_token_shard(result.train_path, result.train, eos_id);
  result.validation_shard = write_token_shard(result.validation_path, result.validation, eos_id);
  result.write_seconds = seconds_since(phase);
  return result;
}

PrepareResult prepare_dataset(const PrepareOptions& options) {
  if (options.vocab_size < 257 || options.vocab_size > (int64_t{1} << 31)) {
    fail("--vocab-size", "at least 257 (256 byte tokens + <|endoftext|>) and at most 2^31",
         std::to_string(options.vocab_size), "e.g. --vocab-size 8192");
  }
  if (options.out_dir.empty()) fail("--out", "an output folder", "an empty path");
  const Clock::time_point start = Clock::now();
  PrepareResult result;
  const fs::path dir(options.out_dir);
  result.tokenizer_path = (dir / "tokenizer.json").string();
  result.train_path = (dir / "train.tokens").string();
  result.validation_path = (dir / "validation.tokens").string();
  result.summary_path = (dir / "prepare.json").string();

  const Corpus corpus = load_corpus(options.corpus, options.validation_fraction);
  if (corpus.train.empty()) fail(corpus.source, "at least one training document", "none");
  const double read_seconds = seconds_since(start);
  const json arguments = arguments_json(options);
  const uint32_t corpus_crc = corpus_checksum(corpus);

  if (outputs_current(result, arguments, corpus_crc, result.summary)) {
    result.skipped = true;
    return result;
  }

  std::error_code error;
  fs::create_directories(dir, error);
  if (error) fail(options.out_dir, "a folder meshtrain can create", error.message(), "check --out");
  fs::remove(result.summary_path, error);  // outputs are incomplete until prepare.json is written again

  Clock::time_point phase = Clock::now();
  std::vector<std::string_view> texts;
  texts.reserve(corpus.train.size());
  for (const Document& document : corpus.train) texts.push_back(document.text);
  {
    const Tokenizer trained = train_bpe_tokenizer(texts, options.vocab_size, {kEos});
    save_trained_tokenizer(trained, result.tokenizer_path);
  }
  const double train_seconds = seconds_since(phase);

  // Encode with the tokenizer as read back from disk: exactly what training will load.
  phase = Clock::now();
  const Tokenizer tokenizer = Tokenizer::load(result.tokenizer_path);
  const std::optional<int32_t> eos = tokenizer.eos_id();
  MT_CHECK(eos.has_value(), "the trained tokenizer has no <|endoftext|>");
  const double load_seconds = seconds_since(phase);
  const TokenizedCorpus tokens = tokenize_corpus(corpus, tokenizer, *eos, options.out_dir);
  const double entropy = unigram_entropy(tokens.validation, *eos, tokenizer.vocab_size());

  json& summary = result.summary;
  summary = {{"format", kFormat},
             {"version", kFormatVersion},
             {"arguments", arguments},
             {"corpus_checksum", corpus_crc},
             {"vocab_size", tokenizer.vocab_size()},
             {"eos_id", *eos},
             {"tokenizer_identity", tokenizer.identity()},
             {"tokenizer_crc32c", checksum_file(result.tokenizer_path, "a readable tokenizer file").crc32c},
             {"train", split_figures(corpus.train, tokens.train, tokens.train_shard)},
             {"validation", split_figures(corpus.validation, tokens.validation, tokens.validation_shard)},
             {"validation_unigram_cross_entropy_nats", std::isnan(entropy) ? json(nullptr) : json(entropy)},
             {"seconds",
              {{"read", read_seconds},
               {"train_tokenizer", train_seconds},
               {"tokenize", load_seconds + tokens.encode_seconds},
               {"write", tokens.write_seconds},
               {"total", seconds_since(start)}}}};
  write_file_atomically(result.summary_path, summary.dump(2) + "\n");
  return result;
}

}  // namespace meshtrain
