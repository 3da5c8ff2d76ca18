// `meshtrain prepare`: parses the flags, runs the dataset pipeline (data/prepare.h) and prints its summary.
#include "meshtrain/cli/prepare.h"

#include <cmath>
#include <cstdio>
#include <exception>

#include "meshtrain/core/error.h"
#include "meshtrain/data/prepare.h"

namespace meshtrain {
namespace {

using json = nlohmann::json;

constexpr const char* kUsage =
    "usage: meshtrain prepare [--out DIR] [--vocab-size N] [--corpus PATH] [--validation-fraction F]\n"
    "  --out DIR                 output folder (default data/kjv)\n"
    "  --vocab-size N            tokenizer size, <|endoftext|> included (default 8192)\n"
    "  --corpus PATH             a text file or a folder of text files, one document per file\n"
    "                            (default: the King James Bible from Debian's bible-kjv, one document per\n"
    "                            chapter, every 20th chapter held out for validation)\n"
    "  --validation-fraction F   share of user documents held out (default 0.05; the KJV split is fixed)\n"
    "writes DIR/tokenizer.json, DIR/train.tokens, DIR/validation.tokens and DIR/prepare.json; does nothing\n"
    "when DIR already holds complete outputs for the same arguments and corpus.\n";

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

double parse_number(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  fail(flag, "a number", "\"" + text + "\"");
}

}  // namespace

int run_prepare(const std::vector<std::string>& arguments, std::ostream& out) {
  PrepareOptions options;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& word = arguments[i];
    if (word == "--help" || word == "-h") {
      out << kUsage;
      return 0;
    }
    std::string flag = word, value;
    const size_t equals = word.find('=');
    if (equals != std::string::npos) {
      flag = word.substr(0, equals);
      value = word.substr(equals + 1);
    }
    const bool known =
        flag == "--out" || flag == "--vocab-size" || flag == "--corpus" || flag == "--validation-fraction";
    if (!known) {
      fail("meshtrain prepare", "one of --out, --vocab-size, --corpus, --validation-fraction",
           "\"" + word + "\"", "see meshtrain prepare --help");
    }
    if (equals == std::string::npos) {
      if (i + 1 >= arguments.size())
        fail(flag, "a value after " + flag, "nothing", "see meshtrain prepare --help");
      value = arguments[++i];
    }
    if (flag == "--out") {
      options.out_dir = value;
    } else if (flag == "--corpus") {
      options.corpus = value;
      if (value.empty()) fail(flag, "a file or folder", "an empty path");
    } else if (flag == "--vocab-size") {
      const double number = parse_number(flag, value);
      if (number != std::floor(number)) fail(flag, "an integer", value);
      options.vocab_size = static_cast<int64_t>(std::min(number, 1e15));
    } else {
      options.validation_fraction = parse_number(flag, value);
    }
  }
  const PrepareResult result = prepare_dataset(options);
  print_summary(result.summary, options.out_dir, result.skipped, out);
  return 0;
}

}  // namespace meshtrain
