// Engram table rows (semantics in engram_table.h): one pass over the ids.
#include "meshtrain/kernels/cpu/engram_table.h"

namespace meshtrain::kernels {

void engram_table_rows(int32_t* rows, const int32_t* ids, const int32_t* head_offsets, int64_t N,
                       int64_t heads) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < heads; ++i) rows[n * heads + i] = ids[n * heads + i] + head_offsets[i];
}

}  // namespace meshtrain::kernels
