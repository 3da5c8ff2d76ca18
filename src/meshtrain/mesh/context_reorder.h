// How one sequence is laid over the context mesh axis (shared/specs/context-parallel.md): the names of the
// reorders the input pipeline can apply before it cuts each row into mesh.context slices. The permutations
// themselves, and the sharding of a batch, are in data/context_reorder.h; this header holds only the enum,
// so that config/ (which may not look at data/) can parse the key and data/ can act on it.
#pragma once

#include <array>
#include <cstddef>

namespace meshtrain {

// none: natural order, rank r holds tokens [r S/C, (r+1) S/C) (under causal attention the last rank does
//   most of the work).
// dual_chunk_swap: 2C chunks, rank r holds chunks r and 2C-1-r (balanced; the default).
// striped: rank r holds tokens r, r+C, r+2C, ... (balanced to within one token per query).
enum class ContextReorder { none, dual_chunk_swap, striped };
inline constexpr std::array kContextReorderNames = {"none", "dual_chunk_swap", "striped"};
inline constexpr std::array kContextReorders = {ContextReorder::none, ContextReorder::dual_chunk_swap,
                                                ContextReorder::striped};
static_assert(kContextReorders.size() == kContextReorderNames.size(), "one name per enum value");

inline const char* context_reorder_name(ContextReorder reorder) {
  return kContextReorderNames[static_cast<size_t>(reorder)];
}

}  // namespace meshtrain
