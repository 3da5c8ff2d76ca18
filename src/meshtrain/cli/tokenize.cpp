// `meshtrain tokenize`: encodes stdin to a JSON array of token ids, or decodes such an array back to bytes.
#include "meshtrain/cli/tokenize.h"

#include <charconv>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>

#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer.h"

namespace meshtrain {
namespace {

constexpr const char* kUsage = "meshtrain tokenize --tokenizer PATH [--decode]";

struct TokenizeArguments {
  std::string tokenizer_path;
  bool decode = false;
};

TokenizeArguments parse_arguments(const std::vector<std::string>& arguments) {
  TokenizeArguments parsed;
  bool have_path = false;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& word = arguments[i];
    if (word == "--decode") {
      parsed.decode = true;
    } else if (word == "--tokenizer" || word.starts_with("--tokenizer=")) {
      if (have_path) {
        fail("meshtrain tokenize --tokenizer", "one --tokenizer", "--tokenizer given twice", kUsage);
      }
      if (word == "--tokenizer") {
        if (i + 1 == arguments.size()) {
          fail("meshtrain tokenize --tokenizer", "a path after --tokenizer", "nothing", kUsage);
        }
        parsed.tokenizer_path = arguments[++i];
      } else {
        parsed.tokenizer_path = word.substr(std::string("--tokenizer=").size());
      }
      if (parsed.tokenizer_path.empty()) {
        fail("meshtrain tokenize --tokenizer", "a path", "an empty one", kUsage);
      }
      have_path = true;
    } else {
      fail("meshtrain tokenize", "--tokenizer PATH and optionally --decode", "'" + word + "'", kUsage);
    }
  }
  if (!have_path) {
    fail("meshtrain tokenize",
         "--tokenizer PATH (a tokenizer.json, or a folder with tokenizer.json or "
         "encoder.json + vocab.bpe)",
         "no --tokenizer", kUsage);
  }
  return parsed;
}

std::string read_all(std::istream& in) {
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("stdin", "readable input", "a read error");
  return text;
}

std::vector<int32_t> parse_ids(const std::string& text) {
  nlohmann::json ids;
  try {
    ids = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    fail("stdin", "a JSON array of token ids such as [9707,1879]",
         std::string("invalid JSON: ") + error.what());
  }
  if (!ids.is_array()) {
    fail("stdin", "a JSON array of token ids such as [9707,1879]", std::string("JSON ") + ids.type_name());
  }
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const nlohmann::json& id = ids[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      fail("stdin", "non-negative integer token ids",
           id.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + " at position " + to_text(i));
    }
    out.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return out;
}

}  // namespace

int run_tokenize(const std::vector<std::string>& arguments, std::istream& in, std::ostream& out) {
  const TokenizeArguments parsed = parse_arguments(arguments);
  const Tokenizer tokenizer = Tokenizer::load(parsed.tokenizer_path);
  const std::string input = read_all(in);
  if (parsed.decode) {
    const std::string bytes = tokenizer.decode(parse_ids(input));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  } else {
    const std::vector<int32_t> ids = tokenizer.encode(input);
    std::string text;
    text.reserve(ids.size() * 7 + 3);
    text += '[';
    char number[16];
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) text += ',';
      const auto result = std::to_chars(number, number + sizeof(number), ids[i]);
      text.append(number, result.ptr);
    }
    text += "]\n";
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  out.flush();
  if (!out) fail("stdout", "writable output", "a write error");
  return 0;
}

}  // namespace meshtrain
