// Errors that carry their context: what was being read (file or config key), what was expected, what
// was found, and how to fix it. User-facing checks throw these; nothing a user can influence is asserted.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshtrain {

struct ErrorContext {
  std::string where;     // file path, config key, or "file:tensor"
  std::string expected;  // what a valid input looks like
  std::string found;     // what was actually there
  std::string hint;      // how to fix it (may be empty)
};

class MeshError : public std::runtime_error {
 public:
  explicit MeshError(const ErrorContext& context);
  const ErrorContext& context() const { return context_; }

 private:
  ErrorContext context_;
};

// An error whose message has already been printed (by each rank that saw it, before the ranks agreed to
// stop): the entry point only exits with `exit_code`.
struct AlreadyReported {
  int exit_code = 1;
};

// Throws MeshError; `where` names the file or key the user must look at.
[[noreturn]] void fail(const std::string& where, const std::string& expected, const std::string& found,
                       const std::string& hint = "");

// Internal invariant failed: a bug in meshtrain, not a user error. Reports file:line and the condition.
[[noreturn]] void internal_check_failed(const char* condition, const char* file, int line,
                                        const std::string& detail);

// Where a tensor of a file is, for errors: "FILE: tensor 'NAME'".
inline std::string tensor_where(const std::string& file, const std::string& tensor) {
  return file + ": tensor '" + tensor + "'";
}

// Levenshtein edits that turn `word` into `text`; with `anywhere`, the fewest that make `word` occur
// somewhere in `text` (its distance to the best-matching substring), as a pattern searched anywhere in a
// name.
size_t edit_distance(const std::string& word, const std::string& text, bool anywhere = false);

// The candidate closest to `word` by edit distance (for "did you mean" hints).
std::string closest_name(const std::string& word, const std::vector<std::string>& candidates);

template <class T>
std::string to_text(const T& value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace meshtrain

// Checks an internal invariant (never user input): reports file:line and the failed condition.
#define MT_CHECK(condition, detail)                                                 \
  do {                                                                              \
    if (!(condition)) {                                                             \
      ::meshtrain::internal_check_failed(#condition, __FILE__, __LINE__, (detail)); \
    }                                                                               \
  } while (0)
