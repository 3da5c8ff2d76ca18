#include "meshtrain/core/json_number.h"

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// The value as the file has it, shortened so that a huge value cannot flood the message.
std::string found_text(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text + " (" + value.type_name() + ")";
}

}  // namespace

int64_t json_integer(const nlohmann::json& value, int64_t min, int64_t max, const std::string& where,
                     const std::string& what, const std::string& hint) {
  bool in_range = false;
  if (value.is_number_unsigned()) {  // nlohmann keeps every non-negative integer literal unsigned
    const uint64_t number = value.get<uint64_t>();
    in_range = max >= 0 && number <= static_cast<uint64_t>(max) &&
               (min <= 0 || number >= static_cast<uint64_t>(min));
  } else if (value.is_number_integer()) {
    in_range = value.get<int64_t>() >= min && value.get<int64_t>() <= max;
  }
  if (!in_range) {
    fail(where, what + " as an integer from " + std::to_string(min) + " to " + std::to_string(max),
         found_text(value), hint);
  }
  return value.get<int64_t>();
}

uint64_t json_unsigned(const nlohmann::json& value, uint64_t max, const std::string& where,
                       const std::string& what, const std::string& hint) {
  // nlohmann keeps every non-negative integer literal unsigned, so a signed integer here is negative.
  if (!value.is_number_unsigned() || value.get<uint64_t>() > max) {
    fail(where, what + " as an integer from 0 to " + std::to_string(max), found_text(value), hint);
  }
  return value.get<uint64_t>();
}

}  // namespace meshtrain
