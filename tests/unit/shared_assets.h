// Where the tests find ../shared's tokenizer files and golden ids: MESHTRAIN_SHARED_DIR (ctest sets it), else
// beside the source tree. A test that needs them skips, naming the path, where they are absent.
#pragma once

#include <cstdlib>
#include <string>

namespace meshtrain::testing {

inline std::string tokenizer_assets_dir() {
  const char* from_env = std::getenv("MESHTRAIN_SHARED_DIR");
  // Appended in place: GCC 12 warns falsely (-Warray-bounds) on some inlined chains of std::string operator+.
  std::string dir = from_env != nullptr ? from_env : MESHTRAIN_SOURCE_DIR "/../shared";
  dir += "/assets/tokenizers";
  return dir;
}

}  // namespace meshtrain::testing
