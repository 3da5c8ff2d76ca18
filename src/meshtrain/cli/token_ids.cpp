// Parses token ids from JSON arrays and comma-separated lists (token_ids.h).
#include "meshtrain/cli/token_ids.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <nlohmann/json.hpp>

#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"

namespace meshtrain {

std::vector<int32_t> parse_json_token_ids(const std::string& text, const std::string& where) {
  nlohmann::json ids;
  try {
    ids = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    fail(where, "a JSON array of token ids such as [9707,1879]",
         std::string("invalid JSON: ") + error.what());
  }
  if (!ids.is_array()) {
    fail(where, "a JSON array of token ids such as [9707,1879]", std::string("JSON ") + ids.type_name());
  }
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const nlohmann::json& id = ids[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      fail(where, "non-negative integer token ids",
           id.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + " at position " + to_text(i));
    }
    out.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return out;
}

std::vector<int32_t> parse_token_id_argument(const std::string& argument, const std::string& where) {
  if (argument.starts_with("@")) {
    const std::string path = argument.substr(1);
    return parse_json_token_ids(
        read_file_text(path, "token id file", "write it with: meshtrain tokenize --tokenizer PATH > FILE"),
        where + " " + argument);
  }
  std::vector<int32_t> ids;
  size_t start = 0;
  while (true) {
    const size_t comma = std::min(argument.find(',', start), argument.size());
    const std::string element = argument.substr(start, comma - start);
    int64_t id = -1;
    const auto [end, error] = std::from_chars(element.data(), element.data() + element.size(), id);
    if (element.empty() || error != std::errc() || end != element.data() + element.size() || id < 0 ||
        id > std::numeric_limits<int32_t>::max()) {
      fail(where,
           "comma-separated non-negative integer token ids such as 5,17,3 (or @FILE: a JSON array of ids)",
           "'" + element + "' at position " + std::to_string(ids.size()) + " of '" + argument + "'");
    }
    ids.push_back(static_cast<int32_t>(id));
    if (comma == argument.size()) return ids;
    start = comma + 1;
  }
}

}  // namespace meshtrain
