#include "meshtrain/core/error.h"

#include <algorithm>
#include <cstdint>

namespace meshtrain {
namespace {

std::string format_message(const ErrorContext& context) {
  std::string message = context.where + ": expected " + context.expected + ", found " + context.found;
  if (!context.hint.empty()) message += " (fix: " + context.hint + ")";
  return message;
}

}  // namespace

MeshError::MeshError(const ErrorContext& context)
    : std::runtime_error(format_message(context)), context_(context) {}

void fail(const std::string& where, const std::string& expected, const std::string& found,
          const std::string& hint) {
  throw MeshError(ErrorContext{where, expected, found, hint});
}

void internal_check_failed(const char* condition, const char* file, int line, const std::string& detail) {
  throw std::logic_error(std::string("internal error at ") + file + ":" + std::to_string(line) +
                         ": check failed: " + condition + (detail.empty() ? "" : " (" + detail + ")"));
}

size_t edit_distance(const std::string& word, const std::string& text, bool anywhere) {
  // Levenshtein distance, one row at a time. `anywhere`: the row starts at 0 everywhere (a match may begin at
  // any place in `text`) and the least of the last row is taken (it may end at any place).
  std::vector<size_t> row(text.size() + 1);
  for (size_t j = 0; j <= text.size(); ++j) row[j] = anywhere ? 0 : j;
  for (size_t i = 1; i <= word.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= text.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (word[i - 1] == text[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return anywhere ? *std::min_element(row.begin(), row.end()) : row.back();
}

std::string closest_name(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& candidate : candidates) {
    const size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best;
}

}  // namespace meshtrain
