// `meshtrain generate`: flags, checkpoint resolution, model rebuild from the checkpoint's config, and the
// prefill / sample / stream loop around IncrementalDecoder (the planned decode program) and sample_token.
#include "meshtrain/cli/generate.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/cli/arguments.h"
#include "meshtrain/cli/token_ids.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer.h"
#include "meshtrain/infer/decoder.h"
#include "meshtrain/mesh/mesh.h"
#include "meshtrain/model/families.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

struct GenerateArguments {
  std::string checkpoint;
  std::optional<std::string> prompt;               // --prompt: text, encoded with the checkpoint's tokenizer
  std::optional<std::vector<int32_t>> prompt_ids;  // --prompt-ids: exactly one of the two is set
  int64_t max_new_tokens = 100;
  SamplingOptions sampling;
  uint64_t seed = 0;
  // --output ids: token ids as one JSON line, for comparing with other implementations by id; logits: the
  // same with the next-token logits after every fed token. Unset: text for --prompt, ids for --prompt-ids.
  enum class Output { text, ids, logits };
  std::optional<Output> output;
};

GenerateArguments read_arguments(const std::vector<std::string>& arguments) {
  const ParsedArguments parsed = parse_arguments(find_command("generate"), arguments);
  GenerateArguments read;
  read.checkpoint =
      parsed.required("--checkpoint", "a checkpoint directory, or a run_dir / checkpoints directory");
  read.max_new_tokens = parsed.integer("--max-new-tokens", read.max_new_tokens, 0);
  read.sampling.temperature = parsed.number("--temperature", read.sampling.temperature);
  if (read.sampling.temperature < 0.0) {
    fail(parsed.where("--temperature"), "a number >= 0 (0: greedy)", *parsed.value("--temperature"),
         "e.g. --temperature 0.8");
  }
  read.sampling.top_k = parsed.integer("--top-k", read.sampling.top_k, 0);
  read.sampling.top_p = parsed.number("--top-p", read.sampling.top_p);
  if (!(read.sampling.top_p > 0.0 && read.sampling.top_p <= 1.0)) {
    fail(parsed.where("--top-p"), "a number in (0, 1] (1: off)", *parsed.value("--top-p"),
         "e.g. --top-p 0.9");
  }
  read.seed = static_cast<uint64_t>(parsed.integer("--seed", 0, 0));
  if (const std::string* value = parsed.value("--output")) {
    if (*value == "text") {
      read.output = GenerateArguments::Output::text;
    } else if (*value == "ids") {
      read.output = GenerateArguments::Output::ids;
    } else if (*value == "logits") {
      read.output = GenerateArguments::Output::logits;
    } else {
      fail(parsed.where("--output"), "text, ids or logits", "'" + *value + "'", parsed.usage_hint());
    }
  }
  const std::string* text = parsed.value("--prompt");
  const std::string* ids = parsed.value("--prompt-ids");
  if (text != nullptr && ids != nullptr) {
    fail("meshtrain generate --prompt / --prompt-ids", "one of the two", "both",
         "keep --prompt TEXT (encoded with the checkpoint's tokenizer) or --prompt-ids IDS (token ids)");
  }
  if (text == nullptr && ids == nullptr) {
    fail("meshtrain generate --prompt / --prompt-ids", "the prompt: --prompt TEXT or --prompt-ids IDS",
         "neither", parsed.usage_hint());
  }
  if (text != nullptr) {
    if (text->empty()) {
      fail(parsed.where("--prompt"), "a non-empty text to continue", "an empty prompt",
           "generation needs at least one token of context, e.g. --prompt \"Once upon a time\"");
    }
    read.prompt = *text;
  } else {
    read.prompt_ids = parse_token_id_argument(*ids, parsed.where("--prompt-ids"));
    if (read.prompt_ids->empty()) {
      fail(parsed.where("--prompt-ids"), "at least one token id to continue", "an empty list",
           "e.g. --prompt-ids 5,17,3");
    }
  }
  return read;
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
  const GenerateArguments parsed = read_arguments(arguments);
  const std::string checkpoint_dir = resolve_checkpoint_directory(parsed.checkpoint, "--checkpoint");

  // A run on synthetic data, or a Hugging Face import without tokenizer.json, has no tokenizer copy: such a
  // checkpoint generates from ids to ids, hashing Engram inputs as its training did (no tokenizer: the
  // identity compression).
  std::error_code error;
  const fs::path directory(checkpoint_dir);
  std::optional<Tokenizer> tokenizer;
  if (fs::exists(directory / "tokenizer.json", error) || fs::exists(directory / "encoder.json", error)) {
    tokenizer.emplace(Tokenizer::load(checkpoint_dir));
  } else if (parsed.prompt) {
    fail(checkpoint_dir, "a tokenizer copy (tokenizer.json, or encoder.json + vocab.bpe) to encode --prompt",
         "none (a run on synthetic data, or an import without tokenizer.json)",
         "give the prompt as token ids instead: --prompt-ids 5,17,3 (output: ids)");
  }
  const GenerateArguments::Output output = parsed.output.value_or(
      parsed.prompt ? GenerateArguments::Output::text : GenerateArguments::Output::ids);
  if (output == GenerateArguments::Output::text && !tokenizer) {
    fail("meshtrain generate --output text", "a checkpoint with a tokenizer copy to turn ids into text",
         checkpoint_dir + " has none", "use --output ids (the default with --prompt-ids) or --output logits");
  }
  const Config config = decode_config(checkpoint_dir);

  const std::vector<int32_t> prompt = parsed.prompt ? tokenizer->encode(*parsed.prompt) : *parsed.prompt_ids;
  MT_CHECK(!prompt.empty(), "a non-empty prompt encodes to at least one token");
  for (size_t position = 0; position < prompt.size(); ++position) {
    if (prompt[position] >= config.vocab_size) {
      fail("meshtrain generate --prompt-ids",
           "ids in [0, " + std::to_string(config.vocab_size) + "): the model's vocab_size is " +
               std::to_string(config.vocab_size),
           "id " + std::to_string(prompt[position]) + " at position " + std::to_string(position),
           "give ids of this model's vocabulary (meshtrain tokenize with its tokenizer writes them)");
    }
  }
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
  IncrementalDecoder decoder(config, capacity, tokenizer ? &*tokenizer : nullptr);
  load_checkpoint(checkpoint_dir, decoder.engine(), /*parameters_only=*/true,
                  tokenizer ? tokenizer->identity() : std::string(), decoder.engram_hashing());
  const bool keep_logits = output == GenerateArguments::Output::logits;
  std::vector<std::vector<float>> fed_logits;  // --output logits: after each fed token
  std::vector<float> logits;
  for (int32_t token : prompt) {
    logits = decoder.step(token);
    if (keep_logits) fed_logits.push_back(logits);
  }

  // -1 (no id) without a tokenizer or without an end-of-text token: nothing stops generation early.
  const int32_t eos = tokenizer ? tokenizer->eos_id().value_or(-1) : -1;
  if (output != GenerateArguments::Output::text) {
    // {"prompt": [...], "generated": [...]}: the ids fed and the ids sampled (EOS ends it); with logits, the
    // vocabulary's logits [V_valid] after each fed token.
    std::vector<int32_t> generated;
    for (int64_t step = 0; step < parsed.max_new_tokens; ++step) {
      const int32_t token = sample_token(logits, parsed.sampling, parsed.seed, static_cast<uint64_t>(step));
      if (token == eos) break;
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
    for (size_t id = static_cast<size_t>(tokenizer->vocab_size()); id < row.size(); ++id)
      row[id] = -std::numeric_limits<float>::infinity();
  };
  text_ids_only(logits);
  out << (parsed.prompt ? *parsed.prompt : tokenizer->decode(prompt)) << std::flush;
  std::string pending;  // decoded bytes not yet written: the start of a character still being completed
  for (int64_t step = 0; step < parsed.max_new_tokens; ++step) {
    const int32_t token = sample_token(logits, parsed.sampling, parsed.seed, static_cast<uint64_t>(step));
    if (token == eos) break;
    // Byte-level BPE: the text of a sequence is the concatenation of its tokens' bytes, so each token can be
    // decoded on its own.
    pending += tokenizer->decode({token});
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
