// Engram's table read (shared/specs/engram.md section 3): each head's hash ids index its own table, and a
// layer's tables lie one after another in one parameter, so a token's ids become rows of that flat table by
// each head's offset (the exclusive prefix sum of the tables' sizes); embedding_forward / _backward then
// read those rows and scatter-add their gradient.
// Legend: N tokens, H_e the layer's heads (engram_num_heads x (max_ngram_size - 1)).
// No gradient: ids are integers.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels {

// rows[n, i] = ids[n, i] + head_offsets[i]; head_offsets is host memory on every backend (the layer's
// constants, not an arena buffer).
EngramTableRows engram_table_rows;

}  // namespace meshtrain::kernels
