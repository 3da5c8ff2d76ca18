// The message of the MeshError an action throws ("" when it throws none): tests check that user errors
// name the key or file and say what to fix.
#pragma once

#include <functional>
#include <string>

#include "meshtrain/core/error.h"

namespace meshtrain::testing {

inline std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const MeshError& error) {
    return error.what();
  }
  return "";
}

}  // namespace meshtrain::testing
