// The checks of the multi-process tests: each rank counts its own and prints the ones that fail; the test's
// main sums the counts over the ranks.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace meshtrain::mpi_test {

inline int world_rank = 0;
inline int64_t checks_passed = 0;
inline int64_t checks_failed = 0;

inline void check(bool condition, const std::string& what) {
  if (condition) {
    ++checks_passed;
  } else {
    ++checks_failed;
    std::fprintf(stderr, "rank %d: FAIL: %s\n", world_rank, what.c_str());
  }
}

}  // namespace meshtrain::mpi_test
