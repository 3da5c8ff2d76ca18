// Token ids given on the command line: the JSON array `meshtrain tokenize` writes (and `--decode` reads), and
// generate's --prompt-ids (comma-separated, or @FILE holding such a JSON array).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

// "[9707,1879]" -> ids. Invalid JSON, not an array, or an element that is not an integer in [0, 2^31) is a
// MeshError naming `where` (and the element's position).
std::vector<int32_t> parse_json_token_ids(const std::string& text, const std::string& where);

// "5,17,3" -> ids, or "@FILE" -> the JSON array in FILE (parse_json_token_ids). An empty list, an empty or
// non-integer element, or a negative or too large id is a MeshError naming `where`, the element and its
// position.
std::vector<int32_t> parse_token_id_argument(const std::string& argument, const std::string& where);

}  // namespace meshtrain
