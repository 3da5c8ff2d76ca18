// Engram's table rows on the GPU (the table read itself is embedding.h's gather and ordered scatter-add).
// Semantics as kernels/cpu/engram_table.h. rows and ids are device memory (the arena), head_offsets host
// memory; kernels run on the stream of device.h, in call order.
#pragma once

#include <cstdint>

#include "meshtrain/kernels/signatures.h"

namespace meshtrain::kernels::cuda {

EngramTableRows engram_table_rows;

}  // namespace meshtrain::kernels::cuda
