// Tokenizer benchmark: single-thread encode throughput (MB/s, median of repeats) of a tokenizer on a text
// file, and the time to train a byte-level BPE on it. run_encode_bench.sh builds and runs it next to Hugging
// Face.
//   bench_tokenizer encode TOKENIZER TEXT REPEATS whole|lines [IDS_OUT]   -> {"mb_per_s": ..., "tokens": ...}
// `whole` encodes the file in one call, `lines` each line (newline included) in its own call.
//   bench_tokenizer train TEXT VOCAB_SIZE OUT_JSON              -> {"train_seconds": ..., ...}
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot read " + path);
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int encode(const std::string& tokenizer_path, const std::string& text_path, int repeats,
           const std::string& mode, const std::string& ids_out) {
  auto start = std::chrono::steady_clock::now();
  const meshtrain::Tokenizer tokenizer = meshtrain::Tokenizer::load(tokenizer_path);
  const double load_seconds = seconds_since(start);
  const std::string text = read_file(text_path);
  std::vector<std::string_view> lines;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = std::min(text.find('\n', begin), text.size() - 1) + 1;
    lines.push_back(std::string_view(text).substr(begin, end - begin));
    begin = end;
  }
  std::vector<double> rates;
  std::vector<int32_t> ids;
  for (int r = 0; r < repeats; ++r) {
    if (mode == "lines") {
      start = std::chrono::steady_clock::now();
      ids.clear();
      for (const std::string_view line : lines) {
        const std::vector<int32_t> line_ids = tokenizer.encode(line);
        ids.insert(ids.end(), line_ids.begin(), line_ids.end());
      }
      rates.push_back(static_cast<double>(text.size()) / 1e6 / seconds_since(start));
      continue;
    }
    // The per-thread BPE cache outlives a call: the first repeat starts cold, the others warm. The median
    // (warm) and the first are both reported.
    start = std::chrono::steady_clock::now();
    ids = tokenizer.encode(text);
    rates.push_back(static_cast<double>(text.size()) / 1e6 / seconds_since(start));
  }
  const double cold = rates.front();
  std::sort(rates.begin(), rates.end());
  if (!ids_out.empty()) {
    std::ofstream out(ids_out);
    out << "[";
    for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
    out << "]";
  }
  std::printf(
      "{\"mb_per_s\": %.3f, \"mb_per_s_first\": %.3f, \"tokens\": %zu, \"bytes\": %zu, \"load_s\": %.3f}\n",
      rates[rates.size() / 2], cold, ids.size(), text.size(), load_seconds);
  return 0;
}

int train(const std::string& text_path, int64_t vocab_size, const std::string& out_path) {
  const std::string text = read_file(text_path);
  const auto start = std::chrono::steady_clock::now();
  const meshtrain::Tokenizer tokenizer =
      meshtrain::train_bpe_tokenizer({text}, vocab_size, {"<|endoftext|>"});
  const double train_seconds = seconds_since(start);
  meshtrain::save_trained_tokenizer(tokenizer, out_path);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  std::printf("{\"train_seconds\": %.3f, \"vocab_size\": %lld, \"bytes\": %zu, \"tokens\": %zu}\n",
              train_seconds, static_cast<long long>(tokenizer.vocab_size()), text.size(), ids.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() >= 5 && args[0] == "encode" && (args[4] == "whole" || args[4] == "lines")) {
      return encode(args[1], args[2], std::stoi(args[3]), args[4], args.size() > 5 ? args[5] : "");
    }
    if (args.size() == 4 && args[0] == "train") return train(args[1], std::stoll(args[2]), args[3]);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", error.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: bench_tokenizer encode TOKENIZER TEXT REPEATS whole|lines [IDS_OUT]\n"
               "       bench_tokenizer train TEXT VOCAB_SIZE OUT_JSON\n");
  return 2;
}
