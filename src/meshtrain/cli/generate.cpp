// `meshtrain generate`: flags, checkpoint resolution, model rebuild from the checkpoint's config, and the
// prefill / sample / stream loop around IncrementalDecoder (the planned decode program) and sample_token.
#include "meshtrain/cli/generate.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer.h"
#include "meshtrain/infer/decoder.h"
#include "meshtrain/mesh/mesh.h"
#include "meshtrain/model/families.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "meshtrain generate --checkpoint DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K] "
    "[--top-p P] [--seed S] [--output text|ids|logits]";

struct GenerateArguments {
  std::string checkpoint;
  std::optional<std::string> prompt;  // absent vs empty: both refused, with different messages
  int64_t max_new_tokens = 100;
  SamplingOptions sampling;
  uint64_t seed = 0;
  // --output ids: token ids as one JSON line, for comparing with other implementations by id; logits: the
  // same with the next-token logits after every fed token.
  enum class Output { text, ids, logits } output = Output::text;
};

int64_t parse_integer(const std::string& flag, const std::string& text, int64_t minimum) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < minimum) {
    fail(flag, "an integer >= " + std::to_string(minimum), "'" + text + "'", kUsage);
  }
  return value;
}

double parse_number(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value)) {
    fail(flag, "a finite number", "'" + text + "'", kUsage);
  }
  return value;
}

GenerateArguments parse_arguments(const std::vector<std::string>& arguments) {
  static const std::vector<std::string> flags = {"--checkpoint",  "--prompt", "--max-new-tokens",
                                                 "--temperature", "--top-k",  "--top-p",
                                                 "--seed",        "--output"};
  std::map<std::string, std::string> values;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& word = arguments[i];
    const size_t equals = word.find('=');
    const std::string flag = word.substr(0, equals);
    if (std::find(flags.begin(), flags.end(), flag) == flags.end()) {
      fail("meshtrain generate argument '" + word + "'", "one of the generate flags", "an unknown argument",
           word.starts_with("--") ? "did you mean '" + closest_name(flag, flags) + "'? usage: " + kUsage
                                  : std::string("usage: ") + kUsage);
    }
    std::string value;
    if (equals != std::string::npos) {
      value = word.substr(equals + 1);
    } else {
      if (i + 1 == arguments.size())
        fail("meshtrain generate " + flag, "a value after " + flag, "nothing", kUsage);
      value = arguments[++i];
    }
    if (!values.emplace(flag, value).second) {
      fail("meshtrain generate " + flag, "the flag once", "given twice", "keep one of the two");
    }
  }
  GenerateArguments parsed;
  const auto found = [&](const char* flag) -> const std::string* {
    const auto it = values.find(flag);
    return it == values.end() ? nullptr : &it->second;
  };
  if (const std::string* value = found("--checkpoint")) parsed.checkpoint = *value;
  if (parsed.checkpoint.empty()) {
    fail("meshtrain generate --checkpoint", "a checkpoint directory, or a run_dir / checkpoints directory",
         "none given", kUsage);
  }
  if (const std::string* value = found("--prompt")) parsed.prompt = *value;
  if (const std::string* value = found("--max-new-tokens")) {
    parsed.max_new_tokens = parse_integer("--max-new-tokens", *value, 0);
  }
  if (const std::string* value = found("--temperature")) {
    parsed.sampling.temperature = parse_number("--temperature", *value);
    if (parsed.sampling.temperature < 0.0) {
      fail("--temperature", "a number >= 0 (0: greedy)", *value, "e.g. --temperature 0.8");
    }
  }
  if (const std::string* value = found("--top-k"))
    parsed.sampling.top_k = parse_integer("--top-k", *value, 0);
  if (const std::string* value = found("--top-p")) {
    parsed.sampling.top_p = parse_number("--top-p", *value);
    if (!(parsed.sampling.top_p > 0.0 && parsed.sampling.top_p <= 1.0)) {
      fail("--top-p", "a number in (0, 1] (1: off)", *value, "e.g. --top-p 0.9");
    }
  }
  if (const std::string* value = found("--seed")) {
    parsed.seed = static_cast<uint64_t>(parse_integer("--seed", *value, 0));
  }
  if (const std::string* value = found("--output")) {
    if (*value == "text") {
      parsed.output = GenerateArguments::Output::text;
    } else if (*value == "ids") {
      parsed.output = GenerateArguments::Output::ids;
    } else if (*value == "logits") {
      parsed.output = GenerateArguments::Output::logits;
    } else {
      fail("--output", "text, ids or logits", "'" + *value + "'", kUsage);
    }
  }
  // The prompt is checked last so flag typos are reported before "no prompt".
  if (!parsed.prompt) fail("meshtrain generate --prompt", "the text to continue", "none given", kUsage);
  if (parsed.prompt->empty()) {
    fail("meshtrain generate --prompt", "a non-empty text to continue", "an empty prompt",
         "generation needs at least one token of context, e.g. --prompt \"Once upon a time\"");
  }
  return parsed;
}

// The model config the checkpoint was trained with. Batch and sequence shrink to one token, as the decode
// plan runs them; single-process generation: the decode plan is one device whatever mesh the run trained on.
Config decode_config(const std::string& checkpoint_dir) {
  std::map<std::string, std::string> replaced = {
      {"per_device_batch_size", "1"}, {"max_target_length", "1"}, {"gradient_accumulation_steps", "1"}};
  for (MeshAxis axis : kMeshAxes) replaced[std::string("mesh.") + mesh_axis_name(axis)] = "1";
  return checkpoint_config(checkpoint_dir, replaced);
}

// Bytes of `text` up to the last whole UTF-8 character: a character whose bytes span two tokens is held back
// until its last byte is decoded, so a terminal never shows half of it.
size_t complete_utf8_length(const std::string& text) {
  const size_t size = text.size();
  for (size_t back = 1; back <= std::min<size_t>(4, size); ++back) {
    const unsigned char byte = static_cast<unsigned char>(text[size - back]);
    if ((byte & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead byte
    const size_t length = (byte & 0xE0) == 0xC0   ? 2
                          : (byte & 0xF0) == 0xE0 ? 3
                          : (byte & 0xF8) == 0xF0 ? 4
                                                  : 1;
    return length > back ? size - back : size;
  }
  return size;
}

}  // namespace

int run_generate(const std::vector<std::string>& arguments, std::ostream& out) {
  const GenerateArguments parsed = parse_arguments(arguments);
  const std::string checkpoint_dir = resolve_checkpoint_directory(parsed.checkpoint, "--checkpoint");

  std::error_code error;
  const fs::path directory(checkpoint_dir);
  if (!fs::exists(directory / "tokenizer.json", error) && !fs::exists(directory / "encoder.json", error)) {
    fail(checkpoint_dir, "a tokenizer copy (tokenizer.json, or encoder.json + vocab.bpe)", "none",
         "the run had no tokenizer (synthetic data?): generate needs a checkpoint of a run on text");
  }
  const Tokenizer tokenizer = Tokenizer::load(checkpoint_dir);
  const Config config = decode_config(checkpoint_dir);

  const std::vector<int32_t> prompt = tokenizer.encode(*parsed.prompt);
  MT_CHECK(!prompt.empty(), "a non-empty prompt encodes to at least one token");
  // The last sampled token is printed, never fed: the cache holds the prompt and all but one new token.
  const int64_t capacity =
      static_cast<int64_t>(prompt.size()) + std::max<int64_t>(parsed.max_new_tokens - 1, 0);
  const int64_t P = config.max_position_embeddings;  // gpt2's learned position rows
  if (family_of(config).positions == PositionKind::learned && capacity > P) {
    fail(
        "--prompt / --max-new-tokens",
        "at most " + std::to_string(P) + " tokens in all (gpt2's learned positions, max_position_embeddings)",
        std::to_string(prompt.size()) + " prompt tokens + " + std::to_string(parsed.max_new_tokens) + " new",
        "lower --max-new-tokens to at most " +
            std::to_string(std::max<int64_t>(P - static_cast<int64_t>(prompt.size()) + 1, 0)) +
            " or shorten the prompt");
  }
  // The decode plan holds parameter values and caches only; the checkpoint's parameters replace its init.
  // Engram: the decoder hashes with the checkpoint's compressed vocabulary and multipliers (checked
  // against this tokenizer's).
  IncrementalDecoder decoder(config, capacity, &tokenizer);
  load_checkpoint(checkpoint_dir, decoder.engine(), /*parameters_only=*/true, tokenizer.identity(),
                  decoder.engram_hashing());
  const bool keep_logits = parsed.output == GenerateArguments::Output::logits;
  std::vector<std::vector<float>> fed_logits;  // --output logits: after each fed token
  std::vector<float> logits;
  for (int32_t token : prompt) {
    logits = decoder.step(token);
    if (keep_logits) fed_logits.push_back(logits);
  }

  const std::optional<int32_t> eos = tokenizer.eos_id();
  if (parsed.output != GenerateArguments::Output::text) {
    // {"prompt": [...], "generated": [...]}: the ids fed and the ids sampled (EOS ends it); with logits, the
    // vocabulary's logits [V_valid] after each fed token.
    std::vector<int32_t> generated;
    for (int64_t step = 0; step < parsed.max_new_tokens; ++step) {
      const int32_t token = sample_token(logits, parsed.sampling, parsed.seed, static_cast<uint64_t>(step));
      if (eos && token == *eos) break;
      generated.push_back(token);
      if (step + 1 < parsed.max_new_tokens) {
        logits = decoder.step(token);
        if (keep_logits) fed_logits.push_back(logits);
      }
    }
    nlohmann::json line = {{"prompt", prompt}, {"generated", generated}};
    if (keep_logits) line["logits"] = fed_logits;
    out << line.dump() << "\n" << std::flush;
    return 0;
  }
  // Text: ids past the tokenizer's (a model with more rows than ids, as Hugging Face's Qwen3) have no text.
  const auto text_ids_only = [&](std::vector<float>& row) {
    for (size_t id = static_cast<size_t>(tokenizer.vocab_size()); id < row.size(); ++id)
      row[id] = -std::numeric_limits<float>::infinity();
  };
  text_ids_only(logits);
  out << *parsed.prompt << std::flush;
  std::string pending;  // decoded bytes not yet written: the start of a character still being completed
  for (int64_t step = 0; step < parsed.max_new_tokens; ++step) {
    const int32_t token = sample_token(logits, parsed.sampling, parsed.seed, static_cast<uint64_t>(step));
    if (eos && token == *eos) break;
    // Byte-level BPE: the text of a sequence is the concatenation of its tokens' bytes, so each token can be
    // decoded on its own.
    pending += tokenizer.decode({token});
    const size_t printable = complete_utf8_length(pending);
    out.write(pending.data(), static_cast<std::streamsize>(printable));
    out.flush();
    pending.erase(0, printable);
    if (step + 1 < parsed.max_new_tokens) {
      logits = decoder.step(token);
      text_ids_only(logits);
    }
  }
  out << pending << "\n" << std::flush;
  return 0;
}

}  // namespace meshtrain
