#include "meshtrain/core/error.h"

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

}  // namespace meshtrain
