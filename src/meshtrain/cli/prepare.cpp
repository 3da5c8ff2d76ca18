// `meshtrain prepare`: reads the flags (listed in commands.cpp), runs the dataset pipeline (data/prepare.h)
// and prints its summary.
#include "meshtrain/cli/prepare.h"

#include <cstdio>

#include "meshtrain/cli/arguments.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/prepare.h"

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

}  // namespace

int run_prepare(const std::vector<std::string>& arguments, std::ostream& out) {
  const ParsedArguments parsed = parse_arguments(find_command("prepare"), arguments);
  PrepareOptions options;
  if (const std::string* value = parsed.value("--out")) options.out_dir = *value;
  if (const std::string* value = parsed.value("--corpus")) {
    options.corpus = *value;
    if (value->empty())
      fail(parsed.where("--corpus"), "a file or folder", "an empty path", parsed.usage_hint());
  }
  options.vocab_size = parsed.integer("--vocab-size", options.vocab_size, 1);
  options.validation_fraction = parsed.number("--validation-fraction", options.validation_fraction);
  const PrepareResult result = prepare_dataset(options);
  print_summary(result.summary, options.out_dir, result.skipped, out);
  return 0;
}

}  // namespace meshtrain
