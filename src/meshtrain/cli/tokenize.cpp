// `meshtrain tokenize`: encodes stdin to a JSON array of token ids, or decodes such an array back to bytes.
#include "meshtrain/cli/tokenize.h"

#include <charconv>
#include <iterator>

#include "meshtrain/cli/arguments.h"
#include "meshtrain/cli/token_ids.h"
#include "meshtrain/core/error.h"
#include "meshtrain/data/tokenizer/tokenizer.h"

namespace meshtrain {
namespace {

std::string read_all(std::istream& in) {
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("stdin", "readable input", "a read error");
  return text;
}

}  // namespace

int run_tokenize(const std::vector<std::string>& arguments, std::istream& in, std::ostream& out) {
  const ParsedArguments parsed = parse_arguments(find_command("tokenize"), arguments);
  const Tokenizer tokenizer = Tokenizer::load(parsed.required(
      "--tokenizer", "a tokenizer.json, or a folder with tokenizer.json or encoder.json + vocab.bpe"));
  const std::string input = read_all(in);
  if (parsed.has("--decode")) {
    const std::string bytes = tokenizer.decode(parse_json_token_ids(input, "stdin"));
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
